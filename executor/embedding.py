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

from executor import kernels
from executor.comm import Comm
from executor.layout import PackLayout, init_packed_rows, pack_layout
from planner.plan import PackPlan, Plan


@dataclass
class Lookup:
    """The in-flight state of one pack's lookup for one micro-batch."""

    indices: torch.Tensor  # packed row of every ID
    offsets: torch.Tensor  # bag offsets (B+1), bags table-major
    uniq: torch.Tensor
    inverse: torch.Tensor
    hot_pos: torch.Tensor
    hot_slot: torch.Tensor
    cold_pos: torch.Tensor  # positions into uniq, in send order (destination rank ascending)
    cold_local: torch.Tensor
    send_rows: torch.Tensor  # local rows sent, grouped by destination rank ascending
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

    @property
    def num_hot(self) -> int:
        return len(self.hot_packed)

    def zero_grad(self) -> None:
        self.hot_grad = torch.zeros_like(self.hot_weight)
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.grad_handles: list[tuple[object, torch.Tensor, torch.Tensor]] = []

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
        offsets = torch.cat(offs + [torch.tensor([base], device=indices.device)])
        return indices, offsets

    def dedup(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        uniq, inverse, _ = kernels.unique(indices)
        return uniq, inverse

    def prepare(
        self, indices: torch.Tensor, offsets: torch.Tensor, deduped: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> Lookup:
        """Route the unique rows: hot slots, cold rows grouped by destination rank."""
        L = self.layout
        uniq, inverse = deduped if deduped is not None else self.dedup(indices)
        r = kernels.route_ids(uniq, self.hot_map, self.num_owners)
        splits = [0] * L.world
        cold_pos, cold_local = r.cold_pos, r.cold_local
        send_rows = cold_local
        if L.sharding == "row_wise":
            counts = r.counts.tolist()
            starts = np.concatenate([[0], np.cumsum(counts)])
            parts = []
            for dest in self.dest_order:
                i = L.ranks.index(dest)
                parts.append(torch.arange(int(starts[i]), int(starts[i + 1]), device=uniq.device))
                splits[dest] = counts[i]
            if L.ranks != self.dest_order:
                perm = torch.cat(parts)
                cold_pos, cold_local = cold_pos[perm], cold_local[perm]
            send_rows = cold_local
        elif L.sharding == "table_wise":
            splits[L.ranks[0]] = len(cold_pos)
        elif L.sharding == "column_wise":
            for dest in self.dest_order:
                splits[dest] = len(cold_pos)
            send_rows = cold_local.repeat(len(self.dest_order))
        return Lookup(indices, offsets, uniq, inverse, r.hot_pos, r.hot_slot, cold_pos, cold_local,
                      send_rows, send_splits=splits)

    @property
    def local_only(self) -> bool:
        """Replicated packs (and single-rank runs) need no exchange."""
        return self.layout.sharding == "replicated"

    def send_ids(self, lk: Lookup, recv_counts: list[int], async_op: bool) -> None:
        """Launch the ID exchange (counts already exchanged)."""
        lk.recv_splits = recv_counts
        lk.recv_rows = torch.empty(sum(recv_counts), dtype=torch.int64, device=self.dev)
        lk.handle = self.comm.a2a(lk.recv_rows, lk.send_rows, recv_counts, lk.send_splits, async_op)

    def gather(self, lk: Lookup, async_op: bool) -> None:
        """Owner side: wait for the IDs, gather local rows, launch their return."""
        lk.handle.wait()
        width = self.my_cols[1] - self.my_cols[0] if self.layout.sharding == "column_wise" else self.layout.dim
        out = self.weight[lk.recv_rows].reshape(-1)
        lk.emb_recv = torch.empty(sum(s * self.dest_width(d) for d, s in enumerate(lk.send_splits)),
                                  device=self.dev)
        lk.handle = self.comm.a2a(
            lk.emb_recv, out, [s * self.dest_width(d) for d, s in enumerate(lk.send_splits)],
            [s * width for s in lk.recv_splits], async_op,
        )

    def dest_width(self, dest: int) -> int:
        if self.layout.sharding != "column_wise":
            return self.layout.dim
        if dest not in self.layout.ranks:
            return 0
        c0, c1 = self.cols[self.layout.ranks.index(dest)]
        return c1 - c0

    def hot_gather(self, lk: Lookup) -> torch.Tensor:
        u = torch.empty(len(lk.uniq), self.layout.dim, device=self.dev)
        if len(lk.hot_pos):
            u[lk.hot_pos] = self.hot_weight[lk.hot_slot]
        lk.unique_emb = u
        return u

    def assemble(self, lk: Lookup) -> torch.Tensor:
        """Wait for the returned rows and place them among the unique rows."""
        L = self.layout
        u = lk.unique_emb
        if self.local_only:
            u[lk.cold_pos] = self.weight[lk.cold_local]
            return u
        lk.handle.wait()
        if L.sharding != "column_wise":
            u[lk.cold_pos] = lk.emb_recv.view(-1, L.dim)
            return u
        off, nc = 0, len(lk.cold_pos)
        for dest in self.dest_order:
            c0, c1 = self.cols[L.ranks.index(dest)]
            seg = lk.emb_recv[off : off + nc * (c1 - c0)].view(nc, c1 - c0)
            u[lk.cold_pos, c0:c1] = seg
            off += nc * (c1 - c0)
        return u

    def pool(self, lk: Lookup, u: torch.Tensor) -> torch.Tensor:
        if self.layout.mode == "none":
            return u[lk.inverse]
        return kernels.bag_forward(u, lk.inverse, lk.offsets, self.layout.mode)

    # ---- backward -----------------------------------------------------------------
    def unique_grad(self, lk: Lookup, grad_out: torch.Tensor) -> torch.Tensor:
        mode = "sum" if self.layout.mode == "none" else self.layout.mode
        rows, g = kernels.bag_backward(grad_out, lk.inverse, lk.offsets, mode)
        gu = torch.zeros(len(lk.uniq), self.layout.dim, device=self.dev)
        gu[rows] = g
        return gu

    def backward(self, lk: Lookup, gu: torch.Tensor, async_op: bool) -> None:
        """Hot gradients into the local buffer; cold gradients launched to their owners."""
        L = self.layout
        if len(lk.hot_pos):
            self.hot_grad.index_add_(0, lk.hot_slot, gu[lk.hot_pos])
        g = gu[lk.cold_pos]
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
        """Replicated packs: launch the all-gather of the (locally summed) row gradients, so
        every replica applies the same concatenation and replicas stay identical."""
        rows, g = self._pending_rows()
        if len(rows):
            rows, inv = torch.unique(rows, sorted=True, return_inverse=True)
            g = torch.zeros(len(rows), g.shape[1], device=self.dev).index_add_(0, inv, g)
        self._replica_sync = self.comm.start_all_gather_rows(rows, g, async_op)

    def apply_cold(self, on_gathered: Callable[[], None] | None = None) -> None:
        """Apply the cold rows' gradients; a replicated pack first completes its all-gather
        and then calls `on_gathered` (the trainer ends the collective's timed span there)."""
        L = self.layout
        if self.local_only:
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
        if L.sharding == "column_wise" and self.adagrad:
            uniq, inv = torch.unique(rows, sorted=True, return_inverse=True)
            acc = torch.zeros(len(uniq), g.shape[1], device=self.dev).index_add_(0, inv, g)
            self.state.index_add_(0, uniq, (acc * acc).mean(dim=1))
            c0, c1 = self.my_cols
            step = acc[:, c0:c1] / (self.state[uniq].sqrt() + self.eps).unsqueeze(1)
            self.weight.index_add_(0, uniq, step, alpha=-self.lr)
            return
        kernels.sparse_update(self.weight, self.state, rows, g, L.optimizer, self.lr, self.eps)

    def apply_hot(self) -> None:
        if self.num_hot == 0:
            return
        rows = torch.nonzero(self.hot_grad.abs().sum(dim=1)).flatten()
        kernels.sparse_update(self.hot_weight, self.hot_state, rows, self.hot_grad[rows], self.layout.optimizer,
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
