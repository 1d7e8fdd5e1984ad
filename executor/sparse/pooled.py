"""A pack whose owners pool (PackPlan.exchange "pooled"; planner.exchange says when it pays).

Forward of a micro-batch, requester side: every lookup (no dedup) is split into hot IDs,
pooled here from the replicated cache into one partial sum per bag, and cold IDs, sent to
their owners (owner index ascending, bag order kept) together with the number of IDs each
bag sends to each owner (its lengths, a fixed-size all-to-all: one per bag and owner).
Owner side: the received IDs are gathered and summed per (source, bag), and one vector per
bag goes back to each source. The requester adds the owners' partial sums to its hot part;
a mean bag is divided by its whole length there, so mean pooling stays exact.
Backward: the gradient of every bag (divided by its length for mean) goes to each owner
(fixed size); the owner expands it to its lookups and applies them with the step's other
gradients; the hot lookups' gradients go to the hot cache as in the rows exchange.

Sizes: the cold IDs per owner ride in the step's one sizes exchange (the route's counts, as
for the rows exchange); the lengths and pooled vectors have sizes known from the batch
shape, so no further read of the device is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from executor.sparse import kernels, syncfree
from executor.sparse.embedding import Lookup, ShardedPack
from planner.modes import Exchange
from planner.plan import PackPlan, Plan, pooled_at_owners


@dataclass
class PooledLookup(Lookup):
    """A pooled lookup's extra state: bags of the IDs here and of the IDs received."""

    nbags: int = 0
    lengths: torch.Tensor | None = None  # IDs per bag (all of them: hot and cold)
    owner_lengths: torch.Tensor | None = None  # [owners, nbags] cold IDs each bag sends each owner
    hot_offsets: torch.Tensor | None = None  # CSR offsets of the hot lookups (they stay in bag order)
    hot_bag: torch.Tensor | None = None  # bag of every hot lookup
    recv_lengths: torch.Tensor | None = None  # owner: [sources * nbags] lengths received
    recv_bag: torch.Tensor | None = None  # owner: (source, bag) row of every received ID
    heard: int = 0  # owners whose partial sums this rank receives


class _Both:
    """Handle of two collectives launched in order (gloo completes them in launch order)."""

    def __init__(self, first, second) -> None:
        self.first, self.second = first, second
        if hasattr(second, "get_future"):  # the op timer ends the span on the later one's future
            self.get_future = second.get_future

    def wait(self) -> bool:
        self.first.wait()
        return self.second.wait()

    def is_completed(self) -> bool:
        return self.first.is_completed() and self.second.is_completed()


class PooledPack(ShardedPack):
    """ShardedPack with the pooled exchange; the trainer drives it through the same stages."""

    exchange = Exchange.POOLED

    def __init__(self, plan: Plan, pack: PackPlan, hot_ids: dict[str, np.ndarray], comm) -> None:
        super().__init__(plan, pack, hot_ids, comm)
        L = self.layout
        if not self.geometry.owns_whole_rows or L.mode == "none":
            raise ValueError(f"pack {L.name}: pooled exchange needs row/table-wise shards of pooled tables")
        self.owner = L.index >= 0

    # ---- forward, requester ---------------------------------------------------------------
    def dedup(self, indices: torch.Tensor, offsets: torch.Tensor) -> PooledLookup:
        """No dedup: the lookups as they are, their bags from the offsets (no read)."""
        nbags = len(offsets) - 1
        return PooledLookup(indices, offsets, indices, None, None, nbags=nbags, lengths=offsets[1:] - offsets[:-1])

    def prepare(self, lk: PooledLookup) -> None:
        """Send order (cold by owner, bag order kept; then hot) and each bag's IDs per owner and
        hot IDs (on the CPU both are single passes of the native kernels, no sort)."""
        n = self.num_owners
        lk.route = syncfree.route(lk.indices, None, self.hot_map, n)
        per_bag = kernels.bag_owner_counts(lk.indices, lk.offsets, self.hot_map, n)
        lk.owner_lengths = per_bag[:n]
        lk.hot_offsets = torch.zeros(lk.nbags + 1, dtype=torch.int64, device=self.dev)
        torch.cumsum(per_bag[n], 0, out=lk.hot_offsets[1:])

    def place(self, lk: PooledLookup, counts: list[int], recv: list[int]) -> None:
        """Slice the route with its host counts; per owner the segment is its cold IDs, and
        its bag lengths travel beside them (nbags each, known from the shape)."""
        L = self.layout
        owners, n_hot = counts[:-1], counts[-1]
        n_cold = sum(owners)
        order, value = lk.route.order, lk.route.value
        lk.hot_pos, lk.hot_slot = order[n_cold : n_cold + n_hot], value[n_cold : n_cold + n_hot]
        lk.hot_bag = torch.repeat_interleave(torch.arange(lk.nbags, device=self.dev), lk.hot_offsets.diff(),
                                             output_size=n_hot)
        starts = np.concatenate([[0], np.cumsum(owners)]).astype(int)
        splits = [0] * L.world
        parts, lens = [], []
        for dest in self.dest_order:
            i = self.geometry.route_slot(self.geometry.index(dest))
            parts.append(value[starts[i] : starts[i + 1]])
            lens.append(lk.owner_lengths[i])
            splits[dest] = owners[i]
        lk.send_rows = torch.cat(parts)
        lk.send_splits = splits
        lk.cold_local = torch.cat(lens)  # lengths, owner by owner in destination order
        lk.recv_splits = list(recv) if self.owner else [0] * L.world
        lk.heard = len(self.dest_order)

    def _bag_splits(self, width: int) -> tuple[list[int], list[int]]:
        """(to each rank, from each rank) for a per-bag exchange of `width` numbers per bag:
        a requester talks to every owner, an owner to every rank."""
        L = self.layout
        owners = set(L.ranks)
        to_owner = [width if r in owners else 0 for r in range(L.world)]
        from_all = [width if self.owner else 0] * L.world
        return to_owner, from_all

    def send_ids(self, lk: PooledLookup, async_op: bool) -> None:
        """Launch the cold IDs' exchange (sizes from the step's read) and the lengths' (fixed)."""
        lk.recv_rows = torch.empty(sum(lk.recv_splits), dtype=self.id_dtype, device=self.dev)
        h_ids = self.comm.a2a(lk.recv_rows, lk.send_rows.to(self.id_dtype), lk.recv_splits, lk.send_splits,
                              async_op)
        to_owner, from_all = self._bag_splits(lk.nbags)
        lk.recv_lengths = torch.empty(sum(from_all), dtype=self.id_dtype, device=self.dev)
        h_len = self.comm.a2a(lk.recv_lengths, lk.cold_local.to(self.id_dtype), from_all, to_owner, async_op)
        lk.handle = _Both(h_ids, h_len)

    # ---- forward, owner -------------------------------------------------------------------
    @property
    def in_place(self) -> bool:
        """The owner's rows are pooled where they lie and their bags' gradients applied without
        expanding them to every lookup (the native CPU kernels, fp32 rows in this process's
        memory): the same sums in the same order as gathering first, without the copies."""
        return not self.host and not self.low and self.weight.dtype == torch.float32 and syncfree._native(self.weight)

    def gather(self, lk: PooledLookup, async_op: bool) -> None:
        lk.handle.wait()
        lk.recv_rows, lk.recv_lengths = lk.recv_rows.long(), lk.recv_lengths.long()
        self.send_back(lk, None if self.in_place else self.read_local(lk.recv_rows), async_op)

    def owner_sums(self, lk: PooledLookup, rows: torch.Tensor | None) -> torch.Tensor:
        """Owner: the received lookups summed per (source, bag) in fp32, from the gathered
        `rows`, or (None) read and pooled from this rank's shard in one pass."""
        nb = len(lk.recv_lengths)
        lk.recv_bag = torch.repeat_interleave(torch.arange(nb, device=self.dev), lk.recv_lengths,
                                              output_size=len(lk.recv_rows))
        if rows is None:
            offsets = torch.zeros(nb + 1, dtype=torch.int64, device=self.dev)
            torch.cumsum(lk.recv_lengths, 0, out=offsets[1:])
            return kernels.bag_forward(self.weight, lk.recv_rows, offsets)
        return torch.zeros(nb, self.layout.dim, device=self.dev).index_add_(0, lk.recv_bag, rows.float())

    def send_back(self, lk: PooledLookup, rows: torch.Tensor | None, async_op: bool) -> None:
        """Sum the received rows per (source, bag) in fp32 and return one vector per bag."""
        dim = self.layout.dim
        lk.handle.wait()
        pooled = self.owner_sums(lk, rows)
        to_owner, from_all = self._bag_splits(lk.nbags * dim)
        lk.emb_recv = torch.empty(sum(to_owner), device=self.dev)
        lk.handle = self.comm.a2a(lk.emb_recv, pooled.reshape(-1), to_owner, from_all, async_op)

    # ---- forward, requester again ---------------------------------------------------------
    def hot_gather(self, lk: PooledLookup) -> torch.Tensor:
        """The bags' hot part, pooled from the replicated cache (fp32): an fp32 cache is pooled
        in place by bag_forward (the same adds in the same order as gathering, then adding)."""
        if self.hot_weight.dtype == torch.float32:
            part = syncfree.bag_forward(self.hot_weight, lk.hot_slot, lk.hot_offsets, "sum")
        else:
            part = torch.zeros(lk.nbags, self.layout.dim, device=self.dev)
            if len(lk.hot_pos):
                part.index_add_(0, lk.hot_bag, self.hot_weight.index_select(0, lk.hot_slot).float())
        lk.unique_emb = part
        return part

    def assemble(self, lk: PooledLookup, cold: torch.Tensor | None = None) -> torch.Tensor:
        """Hot part plus every owner's partial sums (waited for)."""
        lk.handle.wait()
        parts = lk.emb_recv.view(lk.heard, lk.nbags, self.layout.dim)
        return lk.unique_emb + parts.sum(dim=0)

    def pool(self, lk: PooledLookup, u: torch.Tensor) -> torch.Tensor:
        if self.layout.mode == "mean":
            return u / lk.lengths.clamp(min=1).unsqueeze(1).to(u.dtype)
        return u

    # ---- backward -------------------------------------------------------------------------
    def unique_grad(self, lk: PooledLookup, grad_out: torch.Tensor) -> torch.Tensor:
        """The gradient of every bag's sum (a mean bag's divided by its length)."""
        if self.layout.mode == "mean":
            return grad_out / lk.lengths.clamp(min=1).unsqueeze(1).to(grad_out.dtype)
        return grad_out

    def hot_backward(self, lk: PooledLookup, g: torch.Tensor) -> None:
        """The hot lookups' gradients to the hot cache's (dense) or to the sparse sync's list."""
        if len(lk.hot_pos):
            hg = g.index_select(0, lk.hot_bag)
            if self.sparse_hot:
                self.hot_pending.append((lk.hot_slot, hg))
            else:
                self.hot_grad.index_add_(0, lk.hot_slot, hg)
        elif self.sparse_hot:
            self.hot_pending.append((lk.hot_slot, g[:0]))

    def backward(self, lk: PooledLookup, g: torch.Tensor, async_op: bool) -> None:
        """Hot lookups' gradients to the cache's; every bag's gradient launched to each owner."""
        self.hot_backward(lk, g)
        dim = self.layout.dim
        to_owner, from_all = self._bag_splits(lk.nbags * dim)
        send = g.contiguous().reshape(-1).repeat(lk.heard)
        recv = torch.empty(sum(from_all), device=self.dev)
        h = self.comm.a2a(recv, send, from_all, to_owner, async_op)
        self.grad_handles.append((h, lk.recv_rows, recv.view(-1, dim), lk.recv_bag))

    def wait_grads(self) -> None:
        """Owner: each received lookup's gradient is its bag's (applied with the step's others)."""
        for h, rows, g, bag in self.grad_handles:
            h.wait()
            self.owe(rows, g, bag)
        self.grad_handles = []

    def owe(self, rows: torch.Tensor, bag_grads: torch.Tensor, bag: torch.Tensor) -> None:
        """Owner: rows[i] is owed bag_grads[bag[i]], kept unexpanded where `in_place` allows."""
        if not len(rows):
            return
        if self.in_place:
            self.bag_pending.append((rows, bag_grads, bag))
        else:
            self.pending.append((rows, bag_grads.index_select(0, bag)))

    def zero_grad(self) -> None:
        super().zero_grad()
        self.bag_pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def apply_cold(self, on_gathered=None) -> None:
        """The step's owed rows in one update: their bags' gradients read in place (`owe`),
        summed per row in the order expanding them would give (one update per row)."""
        if self.bag_pending and not self.pending:
            rows, grads, index, base = [], [], [], 0
            for r, g, bag in self.bag_pending:
                rows.append(r)
                grads.append(g)
                index.append(bag + base)
                base += len(g)
            self.bag_pending = []
            L = self.layout
            syncfree.sparse_update_indexed(self.weight, self.state, torch.cat(rows), torch.cat(grads),
                                           torch.cat(index), L.optimizer, self.lr, self.eps, self.step_index)
            return
        for r, g, bag in self.bag_pending:  # mixed with expanded ones: expand these too
            self.pending.append((r, g.index_select(0, bag)))
        self.bag_pending = []
        super().apply_cold(on_gathered)


def make_pack(plan: Plan, pack: PackPlan, hot_ids: dict[str, np.ndarray], comm) -> ShardedPack:
    """The pack as its plan exchanges it (planner.plan.pooled_at_owners: on one rank, as rows)."""
    if pooled_at_owners(plan, pack):
        return PooledPack(plan, pack, hot_ids, comm)
    return ShardedPack(plan, pack, hot_ids, comm)
