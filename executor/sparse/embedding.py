"""One pack of embedding tables, distributed as the Plan says, on one rank.

Forward of a micro-batch (requester side): packed IDs are deduplicated, split into hot
rows (read from the replicated hot cache) and cold rows (sent to their owners with
all_to_all_single); owners gather their rows and send them back; the unique rows are
pooled into bags. Backward: gradients of the unique rows go to the hot-gradient buffer
(all-reduced at the end of the step) or back to the cold owners, who buffer them and
apply them once per step, so micro-batches accumulate exactly like one full batch.

The staged methods (`prepare`, `send_ids`, `gather`, `assemble`, `backward`, ...) let
the trainer interleave packs and micro-batches around asynchronous collectives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from executor.comm import Comm, wire_id_dtype
from executor.sparse import host_memory, lowp, row_optimizers, syncfree
from executor.sparse.layout import PackLayout, init_packed_rows, pack_layout
from executor.sparse.syncfree import Route
from planner import op_names
from planner.host_access import HostAccess
from planner.modes import Exchange, HotSync, Placement
from planner.plan import PackPlan, Plan


@dataclass
class Lookup:
    """The in-flight state of one pack's lookup for one micro-batch.

    `uniq` may be padded past its valid entries (see executor.sparse.syncfree); sizes that must
    reach the host (rows per destination) are set by `place` from the step's one read.
    """

    indices: torch.Tensor  # packed row of every ID
    offsets: torch.Tensor  # bag offsets (B+1), bags table-major
    uniq: torch.Tensor
    inverse: torch.Tensor
    n_valid: torch.Tensor | None = None
    route: Route | None = None  # ranks > 1: send order and per-owner counts (device)
    slot: torch.Tensor | None = None  # one rank: hot slot of every unique position, -1 if cold
    hot_pos: torch.Tensor | None = None
    hot_slot: torch.Tensor | None = None
    cold_pos: torch.Tensor | None = None  # positions into uniq, in send order (destination rank ascending)
    cold_local: torch.Tensor | None = None
    send_rows: torch.Tensor | None = None  # local rows sent, grouped by destination rank ascending
    send_splits: list[int] = field(default_factory=list)  # rows per destination
    recv_splits: list[int] = field(default_factory=list)  # rows per source
    recv_rows: torch.Tensor | None = None
    emb_recv: torch.Tensor | None = None
    handle: object = None
    unique_emb: torch.Tensor | None = None
    dedup: syncfree.Dedup | None = None  # the sort behind uniq/inverse, for the backward's segment sums
    pad_every: int = 0  # padded inputs (Batch.pad_bags): bags per table, the last of each read by nobody


class ShardedPack:
    exchange = Exchange.ROWS  # PackPlan.exchange this class runs (executor.sparse.pooled: pooled)
    fused = False  # its collectives are shared with other packs' (executor.sparse.pooled_twrw, pooled_flat)

    def op(self, name: str) -> str:
        """The timed name of one of this pack's ops (planner.op_names.pack_op)."""
        return op_names.pack_op(name, self.exchange)

    def __init__(self, plan: Plan, pack: PackPlan, hot_ids: dict[str, np.ndarray], comm: Comm) -> None:
        self.plan = plan
        self.comm = comm
        self.dev = comm.device
        self.layout: PackLayout = pack_layout(plan, pack, comm.rank)
        L = self.layout
        self.geometry = G = L.geometry
        self.name = L.name
        self.lr = plan.optimizer.sparse_lr
        self.eps = plan.optimizer.eps
        self.adagrad = L.optimizer == "rowwise_adagrad"
        self.cols = L.col_slices()
        self.my_cols = self.cols[L.index] if L.index >= 0 else (0, 0)
        self.dest_order = sorted(L.ranks)  # all_to_all segments go in world-rank order
        self.num_owners = G.row_owners  # the route's owner of a row: planner.geometry's owner()
        # one rank holds every row: lookups need no routing by owner and no sizes on the host
        self.single = L.world == 1
        # every row hot (Plan.fully_hot): every lookup is read from the replica, no exchange
        self.fully_hot = plan.fully_hot(pack)
        self.to_dest = torch.tensor(self._destination_matrix(), dtype=torch.int64, device=self.dev)
        self.id_dtype = wire_id_dtype(plan.wire_id_bytes(pack))  # IDs on the wire; int64 once received
        # storage as the table spec declares it (fp32, fp16, bf16); pooling and gradients in fp32
        self.dtype = lowp.storage_dtype(plan.model.table(L.tables[0]).dtype)
        self.low = lowp.is_low(self.dtype)
        self.keys = lowp.RowKeys(plan.model, L.tables, L.table_offsets, self.dev) if self.low else None
        self.seed = plan.seed
        self.step_index = 0  # the trainer's step: the stochastic rounding's draw depends on it
        # placement "host" (PICASSO caching): the cold shard lives in host memory, the hot cache
        # on the device; a GPU maps the shard and its kernels reach the rows in place (MAPPED),
        # else the step gathers them on the host and copies them (STAGED: `host` below)
        self.placed_host = pack.placement == Placement.HOST
        self.access = host_memory.access_on(self.dev) if self.placed_host else None
        self.host = self.access == HostAccess.STAGED
        self.cold_dev = torch.device("cpu") if self.placed_host else self.dev
        local = L.local_packed_rows()
        # generated where it lives, in its storage dtype (a GPU builds its shard in place; a
        # host-placed shard is generated on the GPU and copied): executor.sparse.init_rng
        cols = self.my_cols if G.splits_columns else None
        self.weight = self._cold_tensor(init_packed_rows(plan.model, L, plan.seed, local, self.cold_dev, self.dtype,
                                                         cols, compute=self.dev))
        # row-wise Adagrad one sum per row; Adagrad and Adam per element (executor.sparse.row_optimizers)
        state = row_optimizers.new_state(L.optimizer, len(local), L.dim)
        self.state = None if state is None else self._cold_tensor(state)
        hot = [L.table_offsets[t] + np.asarray(hot_ids[t], dtype=np.int64) for t in L.tables if len(hot_ids.get(t, []))]
        hot_packed = np.concatenate(hot) if hot else np.zeros(0, dtype=np.int64)
        self.hot_packed = torch.from_numpy(hot_packed).to(self.dev)
        self.hot_map: torch.Tensor | None = None
        if len(hot_packed):
            self.hot_map = torch.full((L.rows,), -1, dtype=torch.int64, device=self.dev)
            self.hot_map[self.hot_packed] = torch.arange(len(hot_packed), device=self.dev)
        self.hot_weight = init_packed_rows(plan.model, L, plan.seed, hot_packed, self.dev, self.dtype)
        self.hot_state = row_optimizers.new_state(L.optimizer, len(hot_packed), L.dim, self.dev)
        self.hot_keys = self.keys(self.hot_packed) if self.low else None
        # hot_sync "sparse": the touched hot rows' gradients are all-gathered (their counts ride
        # in the step's one sizes read) instead of the whole hot set's in the dense all-reduce.
        # One rank synchronises nothing either way.
        self.sparse_hot = pack.hot_sync == HotSync.SPARSE and L.world > 1 and self.num_hot > 0
        self.zero_grad()

    def _cold_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """A cold-shard tensor where the placement puts it: device memory, or host memory as
        the access needs it (executor.sparse.host_memory: pinned in place, mapped on a GPU)."""
        if self.placed_host:
            return host_memory.host_tensor(t, self.dev, self.access)
        return t.contiguous().to(self.dev)

    def packed_of_local(self, local: torch.Tensor) -> torch.Tensor:
        """Packed rows of this rank's local cold rows."""
        return self.geometry.packed_row(local, self.layout.index)

    # ---- cold rows: device memory, or host memory reached over PCIe ---------------------
    def read_local(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows of this rank's cold shard on the device (one op for device memory)."""
        return self.copy_rows(self.host_gather(rows)) if self.host else self.weight.index_select(0, rows)

    def host_gather(self, rows: torch.Tensor) -> torch.Tensor:
        """Host placement, first op: gather the rows on the host into a (pinned) staging buffer.
        On a GPU the IDs cross to the host first (a read of the device; the zero-copy kernel
        that avoids it is measured in the GPU session)."""
        (ids,) = self.to_host(rows)
        return self._stage(ids)

    def host_gather_local(self, lk: Lookup) -> torch.Tensor:
        """Host placement, a lookup without exchange: its cold rows gathered on the host.

        One rank reads every unique row from device memory (fixed shapes: no count reaches the
        host) and keeps the hot ones from the cache; from host memory the IDs cross to the
        host for the gather anyway, so only the cold rows are gathered there and copied (hot
        rows never leave the device's cache), their positions kept for `assemble`."""
        if not (self.single and lk.slot is not None):
            return self.host_gather(self.local_rows(lk))
        (flag,) = self.to_host(torch.where(lk.slot < 0, lk.uniq, -1))  # the gather's one read
        f = flag.numpy()  # host-side work on the IDs read: no device involved
        pos = np.flatnonzero(f >= 0)
        lk.cold_pos = torch.from_numpy(pos).to(self.dev)
        return self._stage(torch.from_numpy(f[pos]))

    def _stage(self, ids: torch.Tensor) -> torch.Tensor:
        out = torch.empty(len(ids), self.weight.shape[1], dtype=self.dtype, pin_memory=self.dev.type == "cuda")
        return torch.index_select(self.weight, 0, ids, out=out)

    def to_host(self, *ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Tensors a host-placed pack needs on the host (the host gather's IDs, the update's rows
        and gradients). On a GPU this reads the device: one read per call (counted by
        tests/test_executor_sync_budget.py); on a CPU it is free."""
        return tuple(t if t.device.type == "cpu" else t.to("cpu") for t in ts)

    def copy_rows(self, staged: torch.Tensor) -> torch.Tensor:
        """Host placement, second op: the PCIe copy to the device. On a CPU the staged rows
        already are in the worker's memory: no copy (as `to_host`; simulator.cost costs no
        PCIe bytes on a CPU worker)."""
        if self.dev.type == "cpu":
            return staged
        return staged.to(self.dev, non_blocking=True)

    def _destination_matrix(self) -> list[list[int]]:
        """[world][owners + 1]: which of a route's counts (cold per owner, hot) go to each rank.
        A replicated pack tells every rank its cold count: the sizes of its gradient all-gather."""
        G = self.geometry
        m = [[0] * (self.num_owners + 1) for _ in range(self.layout.world)]
        for i, r in enumerate(G.ranks):
            m[r][G.route_slot(i)] = 1
        return m

    @property
    def num_hot(self) -> int:
        return len(self.hot_packed)

    def zero_grad(self) -> None:
        rows = 0 if getattr(self, "sparse_hot", False) else self.num_hot  # sparse: no dense buffer
        self.hot_grad = torch.zeros(rows, self.layout.dim, device=self.dev)  # fp32 whatever the storage
        self.hot_pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.hot_sizes = [0] * self.layout.world  # each rank's touched hot rows this step (sparse)
        self._hot_sync = None
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.fused_pending: list[tuple[syncfree.Dedup, torch.Tensor, torch.Tensor]] = []  # (dedup, offsets, grad)
        self.grad_handles: list[tuple[object, torch.Tensor, torch.Tensor]] = []
        self.replica_sizes = [0] * self.layout.world  # each rank's cold rows this step (replicated)

    # ---- forward ------------------------------------------------------------------
    def pack_inputs(self, sparse: dict[str, tuple[torch.Tensor, torch.Tensor]],
                    pad_bags: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed rows and table-major bag offsets of one micro-batch (`sparse`: table -> rows, offsets).
        With `pad_bags` each table's rows past its last bag form one more bag (Batch.pad_bags)."""
        L = self.layout
        idx, offs, base = [], [], 0
        for t in L.tables:
            rows, o = sparse[t]
            idx.append(rows + L.table_offsets[t])
            offs.append((o if pad_bags else o[:-1]) + base)
            base += len(rows)
        indices = torch.cat(idx)
        if L.mode == "none":  # sequence tables: every ID is its own bag
            return indices, torch.arange(len(indices) + 1, device=indices.device)
        # the closing offset from a fill, not from a host list (a host-to-device copy waits)
        offsets = torch.cat(offs + [torch.full((1,), base, dtype=indices.dtype, device=indices.device)])
        return indices, offsets

    def dedup(self, indices: torch.Tensor, offsets: torch.Tensor) -> Lookup:
        d = syncfree.dedup(indices)
        return Lookup(indices, offsets, d.uniq, d.inverse, d.n_valid, dedup=d)

    def prepare(self, lk: Lookup) -> None:
        """Route the unique rows: on one rank, each row's hot slot; on several, the send order
        and per-owner counts, whose host copy `place` receives."""
        if self.single:
            if self.hot_map is not None:
                lk.slot = self.hot_map[lk.uniq]
            return
        lk.route = syncfree.route(lk.uniq, lk.n_valid, self.hot_map, self.num_owners)

    def send_counts(self, lk: Lookup) -> torch.Tensor:
        """Rows this lookup sends to each rank [world] (device), from its route's counts."""
        return (self.to_dest * lk.route.counts.unsqueeze(0)).sum(dim=1)

    def place(self, lk: Lookup, counts: list[int], recv: list[int]) -> None:
        """Slice the route with its host counts (cold per owner, hot) and the rows each rank sends."""
        L = self.layout
        owners, n_hot = counts[:-1], counts[-1]
        n_cold = sum(owners)
        order, value = lk.route.order, lk.route.value
        cold_pos, cold_local = order[:n_cold], value[:n_cold]
        lk.hot_pos, lk.hot_slot = order[n_cold : n_cold + n_hot], value[n_cold : n_cold + n_hot]
        splits = [0] * L.world
        send_rows = cold_local
        if self.geometry.splits_rows:
            starts = np.concatenate([[0], np.cumsum(owners)])
            parts = []
            for dest in self.dest_order:
                i = L.ranks.index(dest)
                parts.append(torch.arange(int(starts[i]), int(starts[i + 1]), device=order.device))
                splits[dest] = owners[i]
            if L.ranks != self.dest_order:
                perm = torch.cat(parts)
                cold_pos, cold_local = cold_pos[perm], cold_local[perm]
            send_rows = cold_local
        elif self.geometry.is_partitioned:  # every cold row to the one owner, or to every slice's
            for dest in self.dest_order:
                splits[dest] = n_cold
            if self.geometry.id_fanout > 1:
                send_rows = cold_local.repeat(self.geometry.id_fanout)
        # replicated: every rank's cold rows (recv_splits) size the gradient all-gather, summed
        # over the step's micro-batches by the trainer (the lookups may be placed a step early)
        lk.cold_pos, lk.cold_local, lk.send_rows, lk.send_splits = cold_pos, cold_local, send_rows, splits
        lk.recv_splits = list(recv)

    @property
    def replicated(self) -> bool:
        return not self.geometry.is_partitioned

    @property
    def local_only(self) -> bool:
        """Replicated and fully hot packs (and single-rank runs) need no exchange."""
        return self.replicated or self.single or self.fully_hot

    def send_ids(self, lk: Lookup, async_op: bool) -> None:
        """Launch the ID exchange (sizes already placed)."""
        lk.recv_rows = torch.empty(sum(lk.recv_splits), dtype=self.id_dtype, device=self.dev)
        lk.handle = self.comm.a2a(lk.recv_rows, lk.send_rows.to(self.id_dtype), lk.recv_splits, lk.send_splits,
                                  async_op)

    def gather(self, lk: Lookup, async_op: bool) -> None:
        """Owner side: wait for the IDs, gather local rows, launch their return."""
        lk.handle.wait()
        lk.recv_rows = lk.recv_rows.long()
        self.send_back(lk, self.read_local(lk.recv_rows), async_op)

    def send_back(self, lk: Lookup, rows: torch.Tensor, async_op: bool) -> None:
        """Launch the return of the gathered rows (in the storage dtype: the bytes the planner costs)."""
        width = self.my_cols[1] - self.my_cols[0] if self.geometry.splits_columns else self.layout.dim
        out = _wire(rows.reshape(-1))
        out_splits = [s * self.dest_width(d) for d, s in enumerate(lk.send_splits)]
        lk.emb_recv = torch.empty(sum(out_splits), dtype=self.dtype, device=self.dev)
        lk.handle = self.comm.a2a(_wire(lk.emb_recv), out, out_splits, [s * width for s in lk.recv_splits], async_op)

    def dest_width(self, dest: int) -> int:
        """Columns of a row that `dest` holds (the whole row unless the columns are split)."""
        if not self.geometry.splits_columns:
            return self.layout.dim
        shard = self.geometry.on_rank(dest)
        return shard.cols if shard else 0

    def hot_gather(self, lk: Lookup) -> torch.Tensor:
        """The unique rows' buffer, with the hot rows read from the replicated cache."""
        if self.single:  # hot slots of every position; `assemble` fills in the cold ones
            lk.unique_emb = None if lk.slot is None else self.hot_weight.index_select(0, lk.slot.clamp(min=0))
            return lk.unique_emb
        u = torch.empty(len(lk.uniq), self.layout.dim, dtype=self.dtype, device=self.dev)
        if len(lk.hot_pos):
            u.index_copy_(0, lk.hot_pos, self.hot_weight.index_select(0, lk.hot_slot))
        lk.unique_emb = u
        return u

    def local_rows(self, lk: Lookup) -> torch.Tensor:
        """A lookup that needs no exchange: the rows this rank reads from its own shard."""
        return lk.uniq if self.single else lk.cold_local

    def assemble(self, lk: Lookup, cold: torch.Tensor | None = None) -> torch.Tensor:
        """Place the cold rows among the unique rows: `cold`, the local rows already read
        (`local_rows`), for a lookup without exchange; else the returned rows, waited for."""
        L = self.layout
        if self.fuses_update and cold is None:  # `pool` reads the rows by ID: no unique rows' buffer
            return self.weight
        u = lk.unique_emb
        if self.local_only and cold is None:
            cold = self.copy_rows(self.host_gather_local(lk)) if self.host else self.read_local(self.local_rows(lk))
        if self.single:
            if u is None:
                return cold
            if self.host:  # the cold rows only (host_gather_local): into their positions
                return u.index_copy_(0, lk.cold_pos, cold)
            return torch.where((lk.slot >= 0).unsqueeze(1), u, cold)
        if self.local_only:
            u.index_copy_(0, lk.cold_pos, cold)
            return u
        lk.handle.wait()
        if not self.geometry.splits_columns:
            u.index_copy_(0, lk.cold_pos, lk.emb_recv.view(-1, L.dim))
            return u
        off, nc = 0, len(lk.cold_pos)
        for dest in self.dest_order:
            c0, c1 = self.cols[L.ranks.index(dest)]
            seg = lk.emb_recv[off : off + nc * (c1 - c0)].view(nc, c1 - c0)
            u[:, c0:c1].index_copy_(0, lk.cold_pos, seg)
            off += nc * (c1 - c0)
        return u

    def pool(self, lk: Lookup, u: torch.Tensor) -> torch.Tensor:
        ids = lk.indices if u is self.weight else lk.inverse  # the table itself (assemble): read by ID
        if self.layout.mode == "none":
            return u.index_select(0, ids).float()
        if u is not self.weight:
            u = u.float()  # 16-bit rows are pooled (accumulated) in fp32
        return syncfree.bag_forward(u, ids, lk.offsets, self.layout.mode, lk.pad_every)

    # ---- backward -----------------------------------------------------------------
    @property
    def fuses_update(self) -> bool:
        """One rank, one micro-batch, fp32 rows in device memory, no hot cache: the backward's
        segment sums apply the optimizer to the rows themselves (Triton), so no gradient
        buffer is built and the update sorts nothing again."""
        return (self.single and self.plan.micro_batches == 1 and self.hot_map is None and not self.host
                and not self.low and self.layout.optimizer not in row_optimizers.TORCH_ONLY
                and syncfree.fuses_update(self.weight))

    def unique_grad(self, lk: Lookup, grad_out: torch.Tensor) -> torch.Tensor | None:
        """The unique rows' gradient; None when the update is fused (`fuses_update`): the pooled
        gradient is kept and `apply_cold` sums and applies it in one pass."""
        mode = "sum" if self.layout.mode == "none" else self.layout.mode
        if self.fuses_update and lk.dedup is not None and lk.dedup.perm is not None:
            self.fused_pending.append((lk.dedup, lk.offsets, grad_out))
            return None
        return syncfree.bag_grad_rows(grad_out, lk.inverse, lk.offsets, mode, len(lk.uniq), lk.dedup)

    def backward(self, lk: Lookup, gu: torch.Tensor | None, async_op: bool) -> None:
        """Hot gradients into the local buffer; cold gradients launched to their owners."""
        L = self.layout
        if gu is None:  # fused: applied by apply_cold
            return
        if self.single:  # every unique row: hot ones to the cache's gradient, the rest pending
            if lk.slot is not None:
                slot = lk.slot
                if lk.n_valid is not None:  # padding repeats row 0: it must not add to row 0's slot twice
                    slot = torch.where(torch.arange(len(slot), device=slot.device) < lk.n_valid, slot, -1)
                syncfree.add_unique_rows(self.hot_grad, slot, gu)
                gu = torch.where((slot >= 0).unsqueeze(1), 0.0, gu)
            self.pending.append((lk.uniq, gu))
            return
        if self.sparse_hot:
            self.hot_pending.append((lk.hot_slot, gu.index_select(0, lk.hot_pos)))
        elif len(lk.hot_pos):
            self.hot_grad.index_add_(0, lk.hot_slot, gu.index_select(0, lk.hot_pos))
        g = gu.index_select(0, lk.cold_pos)
        if self.local_only:
            self.pending.append((lk.cold_local, g))
            return
        if self.geometry.splits_columns:
            parts = []
            for dest in self.dest_order:
                c0, c1 = self.cols[L.ranks.index(dest)]
                parts.append(g.reshape(-1) if self.adagrad else g[:, c0:c1].reshape(-1))
            send = torch.cat(parts) if parts else g.reshape(-1)
            width_out = {d: (L.dim if self.adagrad else self.dest_width(d)) for d in range(L.world)}
            my_w = L.dim if self.adagrad else self.my_cols[1] - self.my_cols[0]
        else:
            send = g.reshape(-1)
            width_out = {d: L.dim for d in range(L.world)}
            my_w = L.dim
        recv = torch.empty(sum(lk.recv_splits) * my_w, device=self.dev)
        h = self.comm.a2a(
            recv, send, [s * my_w for s in lk.recv_splits],
            [s * width_out[d] for d, s in enumerate(lk.send_splits)], async_op,
        )
        self.grad_handles.append((h, lk.recv_rows, recv.view(-1, my_w) if my_w else recv.view(0, 0)))

    def wait_grads(self) -> None:
        for h, rows, g in self.grad_handles:
            h.wait()
            if len(rows):
                self.pending.append((rows, g))
        self.grad_handles = []

    # ---- optimizer ----------------------------------------------------------------
    def _pending_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pending:
            return torch.cat([r for r, _ in self.pending]), torch.cat([x for _, x in self.pending])
        return (torch.zeros(0, dtype=torch.int64, device=self.dev),
                torch.zeros(0, self.layout.dim, device=self.dev))

    def start_replicated_sync(self, async_op: bool) -> None:
        """Replicated packs on several ranks: launch the all-gather of the step's row gradients
        (sizes from the step's one read), so every replica applies the same rows."""
        rows, g = self._pending_rows()
        if self.layout.world == 1:
            self._replica_sync = lambda: (rows, g)
            return
        self._replica_sync = self.comm.start_all_gather_rows(rows, g, async_op, sizes=self.replica_sizes)

    def apply_cold(self, on_gathered: Callable[[], None] | None = None) -> None:
        """Apply the cold rows' gradients; a replicated pack first completes its all-gather
        and then calls `on_gathered` (the trainer ends the collective's timed span there)."""
        L = self.layout
        mode = "sum" if L.mode == "none" else L.mode
        for d, offsets, grad_out in self.fused_pending:
            syncfree.bag_update(grad_out, d, offsets, mode, self.weight, self.state, L.optimizer, self.lr, self.eps)
        self.fused_pending = []
        if self.replicated:
            if getattr(self, "_replica_sync", None) is None:
                self.start_replicated_sync(async_op=False)
            rows, g = self._replica_sync()
            self._replica_sync = None
            if on_gathered is not None:
                on_gathered()
        else:
            rows, g = self._pending_rows()
        if len(rows) == 0:
            return
        if self.host:  # the update runs where the rows live: gradients cross to host memory
            rows, g = self.to_host(rows, g)
        if self.low:
            c0 = self.my_cols[0] if self.geometry.splits_columns else 0
            lowp.update_rows(self.weight, self.state, rows, g, self.keys(self.packed_of_local(rows)), L.optimizer,
                             self.lr, self.eps, self.step_index, self.seed, col0=c0)
            return
        if self.geometry.splits_columns and self.adagrad and not self.single:
            # the row's state needs the whole row's gradient; this rank updates its columns
            uniq, acc, valid = syncfree.segment_sum_fixed(rows, g)
            self.state.index_add_(0, uniq, torch.where(valid, (acc * acc).mean(dim=1), 0.0))
            c0, c1 = self.my_cols
            step = syncfree.adagrad_step(acc[:, c0:c1], self.state.index_select(0, uniq), self.eps)
            self.weight.index_add_(0, uniq, step, alpha=-self.lr)
            return
        syncfree.sparse_update(self.weight, self.state, rows, g, L.optimizer, self.lr, self.eps, self.step_index)

    def hot_count(self, lks: list[Lookup]) -> torch.Tensor:
        """Hot rows this rank's lookups of the step touch (device, 0-dim; summed over micro-batches)."""
        return sum(lk.route.counts[-1] for lk in lks)

    def start_hot_sync(self, async_op: bool) -> None:
        """Sparse hot sync: launch the all-gather of the touched hot rows' gradients (sizes
        from the step's one read)."""
        slots = [s for s, _ in self.hot_pending]
        grads = [g for _, g in self.hot_pending]
        rows = torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int64, device=self.dev)
        g = torch.cat(grads) if grads else torch.zeros(0, self.layout.dim, device=self.dev)
        self._hot_sync = self.comm.start_all_gather_rows(rows, g, async_op, sizes=self.hot_sizes)

    def finish_hot_sync(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows, g = self._hot_sync()
        self._hot_sync = None
        return rows, g

    def apply_hot(self, synced: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Update the hot cache: densely from the all-reduced buffer, or (sparse sync) from the
        gathered (slot, gradient) rows of every rank, duplicates summed."""
        if self.num_hot == 0:
            return
        if self.sparse_hot:
            rows, g = synced
            if self.low:
                lowp.update_rows(self.hot_weight, self.hot_state, rows, g, self.hot_keys[rows], self.layout.optimizer,
                                 self.lr, self.eps, self.step_index, self.seed)
            else:
                syncfree.sparse_update(self.hot_weight, self.hot_state, rows, g, self.layout.optimizer, self.lr,
                                       self.eps, self.step_index)
            return
        # every hot row at once: untouched rows have zero gradient and do not move
        if self.low:
            lowp.update_dense(self.hot_weight, self.hot_state, self.hot_grad, self.hot_keys, self.layout.optimizer,
                              self.lr, self.eps, self.step_index, self.seed)
            return
        syncfree.dense_rows_update(self.hot_weight, self.hot_state, self.hot_grad, self.layout.optimizer,
                                   self.lr, self.eps, self.step_index)

    # ---- state ------------------------------------------------------------------------
    def shard_state(self) -> dict[str, object]:
        """This rank's pieces: cold shard (rows, columns), hot cache; CPU tensors."""
        L = self.layout
        return {
            "pack": L.name, "tables": L.tables, "sharding": str(L.sharding), "ranks": L.ranks,
            "rows": torch.from_numpy(L.local_packed_rows()), "cols": list(self.my_cols if L.index >= 0 else (0, 0)),
            "weight": self.weight.cpu(), "state": None if self.state is None else self.state.cpu(),
            "hot_rows": self.hot_packed.cpu(), "hot_weight": self.hot_weight.cpu(),
            "hot_state": None if self.hot_state is None else self.hot_state.cpu(),
        }

    def release(self) -> None:
        """Drop the shard's rows and state before a checkpoint replaces them (load_piece or
        load_full must follow): the initial rows and the loaded ones are never both resident."""
        self.weight = self.weight.new_empty((0, self.weight.shape[1]))
        self.hot_weight = self.hot_weight.new_empty((0, self.hot_weight.shape[1]))
        if self.state is not None:
            self.state = self.state.new_empty((0, *self.state.shape[1:]))
            self.hot_state = self.hot_state.new_empty((0, *self.hot_state.shape[1:]))

    def matches_piece(self, piece: dict) -> bool:
        """Whether `piece` (a shard_state of a saved run) is exactly this rank's shard and hot
        cache: same tables, sharding, rows, columns, hot rows and storage dtype."""
        L = self.layout
        rows = torch.from_numpy(L.local_packed_rows())
        cols = list(self.my_cols if L.index >= 0 else (0, 0))
        return (list(piece["tables"]) == list(L.tables) and piece["sharding"] == L.sharding
                and list(piece["cols"]) == cols and torch.equal(piece["rows"], rows)
                and torch.equal(piece["hot_rows"], self.hot_packed.cpu())
                and piece["weight"].dtype == self.dtype and (piece["state"] is None) == (self.hot_state is None))

    def load_piece(self, piece: dict) -> None:
        """Take a saved shard that `matches_piece`: a resume under the plan it was saved with
        reads only this rank's own rows, with no full table assembled."""
        self.weight = self._cold_tensor(piece["weight"])
        self.hot_weight = piece["hot_weight"].contiguous().to(self.dev)
        if self.hot_state is not None:
            self.state = self._cold_tensor(piece["state"])
            self.hot_state = piece["hot_state"].contiguous().to(self.dev)
        self.zero_grad()

    def load_full(self, weight: torch.Tensor, state: torch.Tensor | None) -> None:
        """Take this rank's shard and hot cache from full packed tensors (resharding)."""
        L = self.layout
        local = torch.from_numpy(L.local_packed_rows())
        w = weight[local]
        if self.geometry.splits_columns:
            w = w[:, self.my_cols[0] : self.my_cols[1]]
        self.weight = self._cold_tensor(w.to(self.dtype))
        self.hot_weight = weight[self.hot_packed.cpu()].to(self.dtype).contiguous().to(self.dev)
        if self.hot_state is not None:
            st = state if state is not None else row_optimizers.new_state(L.optimizer, L.rows, L.dim)
            self.state = self._cold_tensor(st[local])
            self.hot_state = st[self.hot_packed.cpu()].contiguous().to(self.dev)
        self.zero_grad()


def _wire(t: torch.Tensor) -> torch.Tensor:
    """bf16 rows travel viewed as fp16: the same bytes, moved, never computed on (gloo's
    all-to-all has no bf16 or int16)."""
    return t.view(torch.float16) if t.dtype == torch.bfloat16 else t


def _whole(piece: dict, rows: int, dim: int) -> bool:
    """Whether a piece holds every row and column of its pack in order (a replica)."""
    r = piece["rows"]
    return (tuple(piece["weight"].shape) == (rows, dim) and list(piece["cols"]) == [0, dim]
            and torch.equal(r, torch.arange(rows, dtype=r.dtype)))


class CoverageError(ValueError):
    """Saved pieces that do not give every row of a pack exactly once: `rows` (packed rows,
    ascending) came from `count` pieces each (0: none, 2 or more: overlapping pieces)."""

    def __init__(self, rows: torch.Tensor, count: int):
        super().__init__(f"{len(rows)} packed row(s) from {count} piece(s), expected exactly one")
        self.rows = rows
        self.count = count


def check_coverage(pieces: list[dict], rows: int, dim: int) -> None:
    """Every column of every row of the pack in exactly one cold piece, else CoverageError.

    Counts per row and column segment (the pieces' column cuts), so the check costs a few
    integers per row, not a copy of the weight.
    """
    cuts = sorted({0, dim, *(int(c) for p in pieces for c in p["cols"])})
    segments = list(zip(cuts[:-1], cuts[1:]))
    count = torch.zeros(rows, len(segments), dtype=torch.int32)
    for p in pieces:
        r = torch.as_tensor(p["rows"], dtype=torch.long)
        c0, c1 = (int(c) for c in p["cols"])
        if not len(r) or c1 <= c0:
            continue
        if int(r.min()) < 0 or int(r.max()) >= rows or c0 < 0 or c1 > dim:
            raise ValueError(f"a piece holds rows or columns outside the pack's {rows} x {dim}")
        for j, (a, b) in enumerate(segments):
            if c0 <= a and b <= c1:
                count[:, j].index_add_(0, r, torch.ones(len(r), dtype=torch.int32))
    worst = count.amax(dim=1)
    least = count.amin(dim=1)
    for bad, n in ((least == 0, 0), (worst > 1, int(worst.max()) if rows else 0)):
        if bool(bad.any()):
            raise CoverageError(bad.nonzero().flatten(), n)


def assemble_pieces(pieces: list[dict], rows: int, dim: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Full packed weight (and row state) of a pack from every rank's `shard_state()`.

    The cold shards give every row, each exactly once (else CoverageError: a resume must not
    start a row from zeros or from the wrong rank's copy); hot caches override the rows they
    hold (the cold copy of a hot row is never read, so it is stale).
    """
    if len(pieces) == 1 and _whole(pieces[0], rows, dim):  # a replica: used in place, not copied
        p = pieces[0]
        weight = p["weight"].float()
        state = p["state"]
        if len(p["hot_rows"]):
            weight[p["hot_rows"]] = p["hot_weight"].float()
            if state is not None and p["hot_state"] is not None:
                state[p["hot_rows"]] = p["hot_state"]
        return weight, state
    check_coverage(pieces, rows, dim)
    weight = torch.zeros(rows, dim)
    has_state = any(p["state"] is not None for p in pieces)
    shape = next((tuple(p["state"].shape[1:]) for p in pieces if p["state"] is not None), ())
    state = torch.zeros(rows, *shape) if has_state else None
    for p in pieces:
        if len(p["rows"]) and p["weight"].numel():
            c0, c1 = p["cols"]
            weight[p["rows"], c0:c1] = p["weight"].float()
            if state is not None and p["state"] is not None:
                state[p["rows"]] = p["state"]
    for p in pieces:
        if len(p["hot_rows"]):
            weight[p["hot_rows"]] = p["hot_weight"].float()
            if state is not None and p["hot_state"] is not None:
                state[p["hot_rows"]] = p["hot_state"]
    return weight, state
