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

from executor import syncfree
from executor.comm import Comm
from executor.layout import PackLayout, init_packed_rows, pack_layout
from executor.syncfree import Route
from planner.plan import PackPlan, Plan


@dataclass
class Lookup:
    """The in-flight state of one pack's lookup for one micro-batch.

    `uniq` may be padded past its valid entries (see executor.syncfree); sizes that must
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


class ShardedPack:
    def __init__(self, plan: Plan, pack: PackPlan, hot_ids: dict[str, np.ndarray], comm: Comm) -> None:
        self.plan = plan
        self.comm = comm
        self.dev = comm.device
        self.layout: PackLayout = pack_layout(plan, pack, comm.rank)
        L = self.layout
        self.name = L.name
        self.lr = plan.optimizer.sparse_lr
        self.eps = plan.optimizer.eps
        self.adagrad = L.optimizer == "rowwise_adagrad"
        self.cols = L.col_slices()
        self.my_cols = self.cols[L.index] if L.index >= 0 else (0, 0)
        self.dest_order = sorted(L.ranks)  # all_to_all segments go in world-rank order
        self.num_owners = L.n if L.sharding == "row_wise" else 1
        # one rank holds every row: lookups need no routing by owner and no sizes on the host
        self.single = L.world == 1
        self.to_dest = torch.tensor(self._destination_matrix(), dtype=torch.int64, device=self.dev)
        local = L.local_packed_rows()
        w = init_packed_rows(plan.model, L, plan.seed, local)
        if L.sharding == "column_wise":
            w = w[:, self.my_cols[0] : self.my_cols[1]]
        self.weight = w.contiguous().to(self.dev)
        self.state = torch.zeros(len(local), device=self.dev) if self.adagrad else None
        hot = [L.table_offsets[t] + np.asarray(hot_ids[t], dtype=np.int64) for t in L.tables if len(hot_ids.get(t, []))]
        hot_packed = np.concatenate(hot) if hot else np.zeros(0, dtype=np.int64)
        self.hot_packed = torch.from_numpy(hot_packed).to(self.dev)
        self.hot_map: torch.Tensor | None = None
        if len(hot_packed):
            self.hot_map = torch.full((L.rows,), -1, dtype=torch.int64, device=self.dev)
            self.hot_map[self.hot_packed] = torch.arange(len(hot_packed), device=self.dev)
        self.hot_weight = init_packed_rows(plan.model, L, plan.seed, hot_packed).to(self.dev)
        self.hot_state = torch.zeros(len(hot_packed), device=self.dev) if self.adagrad else None
        self.zero_grad()

    def _destination_matrix(self) -> list[list[int]]:
        """[world][owners + 1]: which of a route's counts (cold per owner, hot) go to each rank.
        A replicated pack tells every rank its cold count: the sizes of its gradient all-gather."""
        L = self.layout
        m = [[0] * (self.num_owners + 1) for _ in range(L.world)]
        if L.sharding == "row_wise":
            for i, r in enumerate(L.ranks):
                m[r][i] = 1
        elif L.sharding in ("table_wise", "column_wise"):
            for r in L.ranks:
                m[r][0] = 1
        else:
            for r in range(L.world):
                m[r][0] = 1
        return m

    @property
    def num_hot(self) -> int:
        return len(self.hot_packed)

    def zero_grad(self) -> None:
        self.hot_grad = torch.zeros_like(self.hot_weight)
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.grad_handles: list[tuple[object, torch.Tensor, torch.Tensor]] = []
        self.replica_sizes = [0] * self.layout.world  # each rank's cold rows this step (replicated)

    # ---- forward ------------------------------------------------------------------
    def pack_inputs(self, sparse: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed rows and table-major bag offsets of one micro-batch (`sparse`: table -> rows, offsets)."""
        L = self.layout
        idx, offs, base = [], [], 0
        for t in L.tables:
            rows, o = sparse[t]
            idx.append(rows + L.table_offsets[t])
            offs.append(o[:-1] + base)
            base += len(rows)
        indices = torch.cat(idx)
        if L.mode == "none":  # sequence tables: every ID is its own bag
            return indices, torch.arange(len(indices) + 1, device=indices.device)
        # the closing offset from a fill, not from a host list (a host-to-device copy waits)
        offsets = torch.cat(offs + [torch.full((1,), base, dtype=indices.dtype, device=indices.device)])
        return indices, offsets

    def dedup(self, indices: torch.Tensor, offsets: torch.Tensor) -> Lookup:
        d = syncfree.dedup(indices)
        return Lookup(indices, offsets, d.uniq, d.inverse, d.n_valid)

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
        if L.sharding == "row_wise":
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
        elif L.sharding == "table_wise":
            splits[L.ranks[0]] = n_cold
        elif L.sharding == "column_wise":
            for dest in self.dest_order:
                splits[dest] = n_cold
            send_rows = cold_local.repeat(len(self.dest_order))
        else:  # replicated: every rank's cold rows size the gradient all-gather
            for r, n in enumerate(recv):
                self.replica_sizes[r] += n
        lk.cold_pos, lk.cold_local, lk.send_rows, lk.send_splits = cold_pos, cold_local, send_rows, splits
        lk.recv_splits = list(recv)

    @property
    def replicated(self) -> bool:
        return self.layout.sharding == "replicated"

    @property
    def local_only(self) -> bool:
        """Replicated packs (and single-rank runs) need no exchange."""
        return self.layout.sharding == "replicated" or self.single

    def send_ids(self, lk: Lookup, async_op: bool) -> None:
        """Launch the ID exchange (sizes already placed)."""
        lk.recv_rows = torch.empty(sum(lk.recv_splits), dtype=torch.int64, device=self.dev)
        lk.handle = self.comm.a2a(lk.recv_rows, lk.send_rows, lk.recv_splits, lk.send_splits, async_op)

    def gather(self, lk: Lookup, async_op: bool) -> None:
        """Owner side: wait for the IDs, gather local rows, launch their return."""
        lk.handle.wait()
        width = self.my_cols[1] - self.my_cols[0] if self.layout.sharding == "column_wise" else self.layout.dim
        out = self.weight.index_select(0, lk.recv_rows).reshape(-1)
        out_splits = [s * self.dest_width(d) for d, s in enumerate(lk.send_splits)]
        lk.emb_recv = torch.empty(sum(out_splits), device=self.dev)
        lk.handle = self.comm.a2a(lk.emb_recv, out, out_splits, [s * width for s in lk.recv_splits], async_op)

    def dest_width(self, dest: int) -> int:
        if self.layout.sharding != "column_wise":
            return self.layout.dim
        if dest not in self.layout.ranks:
            return 0
        c0, c1 = self.cols[self.layout.ranks.index(dest)]
        return c1 - c0

    def hot_gather(self, lk: Lookup) -> torch.Tensor:
        """The unique rows' buffer, with the hot rows read from the replicated cache."""
        if self.single:  # hot slots of every position; `assemble` fills in the cold ones
            lk.unique_emb = None if lk.slot is None else self.hot_weight.index_select(0, lk.slot.clamp(min=0))
            return lk.unique_emb
        u = torch.empty(len(lk.uniq), self.layout.dim, device=self.dev)
        if len(lk.hot_pos):
            u.index_copy_(0, lk.hot_pos, self.hot_weight.index_select(0, lk.hot_slot))
        lk.unique_emb = u
        return u

    def assemble(self, lk: Lookup) -> torch.Tensor:
        """Wait for the returned rows and place them among the unique rows."""
        L = self.layout
        u = lk.unique_emb
        if self.single:
            cold = self.weight.index_select(0, lk.uniq)
            return cold if u is None else torch.where((lk.slot >= 0).unsqueeze(1), u, cold)
        if self.local_only:
            u.index_copy_(0, lk.cold_pos, self.weight.index_select(0, lk.cold_local))
            return u
        lk.handle.wait()
        if L.sharding != "column_wise":
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
        if self.layout.mode == "none":
            return u.index_select(0, lk.inverse)
        return syncfree.bag_forward(u, lk.inverse, lk.offsets, self.layout.mode)

    # ---- backward -----------------------------------------------------------------
    def unique_grad(self, lk: Lookup, grad_out: torch.Tensor) -> torch.Tensor:
        mode = "sum" if self.layout.mode == "none" else self.layout.mode
        return syncfree.bag_grad_rows(grad_out, lk.inverse, lk.offsets, mode, len(lk.uniq))

    def backward(self, lk: Lookup, gu: torch.Tensor, async_op: bool) -> None:
        """Hot gradients into the local buffer; cold gradients launched to their owners."""
        L = self.layout
        if self.single:  # every unique row: hot ones to the cache's gradient, the rest pending
            if lk.slot is not None:
                hot = (lk.slot >= 0).unsqueeze(1)
                self.hot_grad.index_add_(0, lk.slot.clamp(min=0), torch.where(hot, gu, 0.0))
                gu = torch.where(hot, 0.0, gu)
            self.pending.append((lk.uniq, gu))
            return
        if len(lk.hot_pos):
            self.hot_grad.index_add_(0, lk.hot_slot, gu.index_select(0, lk.hot_pos))
        g = gu.index_select(0, lk.cold_pos)
        if self.local_only:
            self.pending.append((lk.cold_local, g))
            return
        if L.sharding == "column_wise":
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
        if L.sharding == "replicated":
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
        if L.sharding == "column_wise" and self.adagrad and not self.single:
            # the row's state needs the whole row's gradient; this rank updates its columns
            uniq, acc, valid = syncfree.segment_sum_fixed(rows, g)
            self.state.index_add_(0, uniq, torch.where(valid, (acc * acc).mean(dim=1), 0.0))
            c0, c1 = self.my_cols
            step = syncfree.adagrad_step(acc[:, c0:c1], self.state.index_select(0, uniq), self.eps)
            self.weight.index_add_(0, uniq, step, alpha=-self.lr)
            return
        syncfree.sparse_update(self.weight, self.state, rows, g, L.optimizer, self.lr, self.eps)

    def apply_hot(self) -> None:
        if self.num_hot == 0:
            return
        # every hot row at once: untouched rows have zero gradient and do not move
        syncfree.dense_rows_update(self.hot_weight, self.hot_state, self.hot_grad, self.layout.optimizer,
                                   self.lr, self.eps)

    # ---- state ------------------------------------------------------------------------
    def shard_state(self) -> dict[str, object]:
        """This rank's pieces: cold shard (rows, columns), hot cache; CPU tensors."""
        L = self.layout
        return {
            "pack": L.name, "tables": L.tables, "sharding": L.sharding, "ranks": L.ranks,
            "rows": torch.from_numpy(L.local_packed_rows()), "cols": list(self.my_cols if L.index >= 0 else (0, 0)),
            "weight": self.weight.cpu(), "state": None if self.state is None else self.state.cpu(),
            "hot_rows": self.hot_packed.cpu(), "hot_weight": self.hot_weight.cpu(),
            "hot_state": None if self.hot_state is None else self.hot_state.cpu(),
        }

    def load_full(self, weight: torch.Tensor, state: torch.Tensor | None) -> None:
        """Take this rank's shard and hot cache from full packed tensors (resharding)."""
        L = self.layout
        local = torch.from_numpy(L.local_packed_rows())
        w = weight[local]
        if L.sharding == "column_wise":
            w = w[:, self.my_cols[0] : self.my_cols[1]]
        self.weight = w.contiguous().to(self.dev)
        self.hot_weight = weight[self.hot_packed.cpu()].contiguous().to(self.dev)
        if self.adagrad:
            st = state if state is not None else torch.zeros(L.rows)
            self.state = st[local].contiguous().to(self.dev)
            self.hot_state = st[self.hot_packed.cpu()].contiguous().to(self.dev)
        self.zero_grad()


def assemble_pieces(pieces: list[dict], rows: int, dim: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Full packed weight (and row state) of a pack from every rank's `shard_state()`.

    The cold shards give every row; hot caches override the rows they hold (the cold
    copy of a hot row is never read, so it is stale).
    """
    weight = torch.zeros(rows, dim)
    has_state = any(p["state"] is not None for p in pieces)
    state = torch.zeros(rows) if has_state else None
    for p in pieces:
        if len(p["rows"]) and p["weight"].numel():
            c0, c1 = p["cols"]
            weight[p["rows"], c0:c1] = p["weight"]
            if state is not None and p["state"] is not None:
                state[p["rows"]] = p["state"]
    for p in pieces:
        if len(p["hot_rows"]):
            weight[p["hot_rows"]] = p["hot_weight"]
            if state is not None and p["hot_state"] is not None:
                state[p["hot_rows"]] = p["hot_state"]
    return weight, state
