"""Per-pack traffic and memory of a plan, from the access statistics (no graph yet).

For one micro-batch of `B` samples per rank and each table t of a pack:
- lookups L_t = B * pooling_t per rank;
- hot hits: coverage_at(hot_t) of them, read from the local replica; their distinct
  rows U_hot = distinct(L) - distinct(L, skip=hot);
- cold distinct rows U_cold = distinct(L, skip=hot) (sum over rows of 1-(1-p)^L): the
  IDs a rank sends to owners after dedup, and the rows it gets back;
- per owner, the IDs arriving from all W ranks: an even share of the tail plus the
  exact owner (planner.geometry: row-wise, packed row mod n) of the hottest cold rows,
  which is where the row partition is imbalanced.
Everything is per rank, as numpy arrays of length world_size.

Table-row-wise packs (rows cyclic over one node's g ranks, planner.geometry) exchange their
rows as row-wise over the node's ranks, each rank's distinct rows straight to their owners (no
per-node merge of requests; only the fused pooled exchange of planner.pooled_twrw is
hierarchical).

A pack with PackPlan.exchange "pooled" sends every cold lookup's ID (no dedup) with the
bag lengths per owner (one per bag; IDs and lengths at the wire width, Plan.wire_id_bytes), each owner pools its part of every bag, and
one partial sum per bag comes back from each owner (row-wise: every owner; table-wise:
the one); the backward sends the pooled gradient of every bag to each owner. Hot IDs are
pooled locally, and their gradients are counted per lookup (the executor does not dedup).

With `dedup=False` (how TorchRec runs a plan: planner.torchrec_exchange) every lookup's
ID travels and is read by its owner, the owner pools, and pooled vectors come back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from planner.access import TableAccess
from planner.geometry import ShardGeometry
from planner.host_access import HostAccess
from planner.model_spec import TableSpec, optimizer_state_bytes
from planner.modes import Exchange, HotSync
from planner.plan import PackPlan, Plan, pooled_at_owners, table_optimizer, wire_id_bytes
from traces.coverage import presence

ID_BYTES = 8  # int64 IDs in memory, and in the sparse gradient all-gathers (row, gradient)
GRAD_BYTES = 4  # embedding gradients are fp32 whatever the table's storage dtype
HEAD_ROWS = 64  # hottest cold rows placed exactly on their owner (imbalance)


@dataclass
class PackVolumes:
    """Traffic of one pack for one micro-batch (per rank) and its memory (per rank)."""

    name: str
    tables: list[str]
    sharding: str
    geometry: ShardGeometry  # which rows and columns each of its shards holds
    ranks: list[int]
    placement: str
    dim: int
    row_bytes: int  # dim * dtype size
    state_bytes: int  # optimizer state per row
    samples: float  # samples per rank per micro-batch
    pooled_width: int  # floats per sample the pack outputs (sum of dims; sequences: dim * max_len)
    rows: int  # rows of the packed table
    lookups: float  # per rank
    hot_lookups: float
    hot_unique: float
    cold_unique: float  # distinct cold rows per rank (after dedup)
    cold_unique_nohot: float  # the same with no hot set (what the hot set saves)
    hot_rows: int  # replicated hot rows (sum over tables)
    recv_ids: np.ndarray  # IDs arriving at each rank as owner
    shard_rows: np.ndarray  # rows of the pack stored on each rank
    slice_bytes: float  # bytes of one row held by one owner (row_bytes / n for column_wise)
    coverage: dict[str, float] = field(default_factory=dict)  # per table hot coverage
    gpus_per_node: int = 1
    # floats per sample each rank computes for every requester when owners pool (TorchRec):
    # table-wise the pack's width on its rank, column-wise a slice, row-wise partial sums
    owned_width: np.ndarray | None = None
    # TorchRec: distinct rows each owner updates per micro-batch (its TBE sorts and merges)
    update_rows: np.ndarray | None = None
    optimizer: str = "sgd"  # the pack's tables' sparse optimizer (planner.plan.table_optimizer)
    hot_sync: HotSync = HotSync.DENSE  # PackPlan.hot_sync: how the hot rows' gradients are synchronised
    exchange: Exchange = Exchange.ROWS  # PackPlan.exchange: rows back to the requester, or pooled at the owner
    id_bytes: int = ID_BYTES  # one ID or bag length on the wire (Plan.wire_id_bytes)
    fully_hot: bool = False  # Plan.fully_hot: every row replicated, nothing exchanged
    # lookups of the pack's most frequent row in one micro-batch (planner.kernel_passes: the
    # longest run its backward sums; set by lowering's analyze)
    longest_run: float = 0.0
    # how a rank reaches the rows of a host-placed pack (planner.host_access): set by lowering from the hardware
    host_access: HostAccess = HostAccess.STAGED
    # scored as TorchRec runs it (Plan.exchange torchrec: planner.lowering's own path, every
    # lookup's ID sent); the exchange above is then not PICASSO's rows or pooled path
    torchrec: bool = False

    # ---- pooled exchange (PackPlan.exchange "pooled"; see the module docstring) ----------
    @property
    def pooled(self) -> bool:
        return self.exchange == Exchange.POOLED and not self.torchrec

    @property
    def bags(self) -> float:
        """Bags a rank looks up per micro-batch (one per sample and table)."""
        return self.samples * len(self.tables)

    @property
    def owners_heard(self) -> int:
        """Owners that return a partial sum of each bag: every shard row-wise, one table-wise."""
        return self.geometry.row_owners

    def _at_owners(self, v: float) -> np.ndarray:
        out = np.zeros(self.world)
        out[np.asarray(self.ranks)] = v
        return out

    @cached_property
    def pooled_ids_bytes(self) -> np.ndarray:
        """ID all-to-all of a pooled pack per rank, max(send, recv): cold IDs and the bag
        lengths for each owner out; at an owner, every rank's IDs and lengths in."""
        b = self.id_bytes
        send = self.cold_unique * b + self.owners_heard * self.bags * b
        recv = self.recv_ids * b + self._at_owners(self.world * self.bags * b)
        return np.maximum(send, recv)

    @cached_property
    def pooled_out_bytes(self) -> np.ndarray:
        """Pooled vectors (fp32) per rank, max(send, recv): a requester gets one per bag from
        each owner it hears from, an owner returns one per bag to every rank. The pooled
        gradients travel the other way in the same amounts."""
        recv = self.owners_heard * self.samples * self.pooled_width * 4.0
        send = self._at_owners(self.world * self.samples * self.pooled_width * 4.0)
        return np.maximum(send, recv)

    def exchange_bytes(self, micro_batches: int) -> float:
        """All-to-all bytes a rank sends and receives per iteration for its cold lookups."""
        if not self.geometry.is_partitioned:
            return 0.0
        if self.pooled:
            return float(np.max(self.pooled_ids_bytes + 2 * self.pooled_out_bytes)) * micro_batches
        return self.cold_unique * (self.id_bytes + 2 * self.row_bytes) * micro_batches

    @property
    def grad_row_bytes(self) -> int:
        """Bytes of one row's gradient: fp32 whatever the table's storage (the executor keeps
        gradients, and 16-bit tables' updates, in fp32)."""
        return self.dim * GRAD_BYTES

    @property
    def sparse_hot(self) -> bool:
        """The hot gradients travel as an all-gather of the touched rows (several ranks only)."""
        return self.hot_sync == HotSync.SPARSE and self.world > 1 and self.hot_rows > 0

    def hot_sync_bytes(self, micro_batches: int) -> float:
        """Sparse hot sync: each rank's contribution to the all-gather (touched rows + IDs)."""
        return self.hot_unique * micro_batches * (self.grad_row_bytes + ID_BYTES)

    @property
    def world(self) -> int:
        return len(self.recv_ids)

    @cached_property
    def a2a_ids_bytes(self) -> np.ndarray:
        """Whole ID all-to-all buffer per rank, max(send, recv), own share included.

        The simulator's all_to_all takes the whole send buffer and charges the remote part;
        an owner that receives more than it sends (table-wise, a hot owner) pays for that.
        """
        if not self.geometry.is_partitioned:
            return np.zeros(self.world)
        fanout = self.geometry.id_fanout
        return np.maximum(self.cold_unique * self.id_bytes * fanout, self.recv_ids * self.id_bytes)

    @cached_property
    def a2a_emb_bytes(self) -> np.ndarray:
        """Whole embedding all-to-all buffer per rank (the gradient all-to-all mirrors it)."""
        if not self.geometry.is_partitioned:
            return np.zeros(self.world)
        return np.maximum(self.cold_unique * self.row_bytes, self.recv_ids * self.slice_bytes)

    @property
    def local(self) -> bool:
        """Each rank reads its lookups where it is: a replica, or a fully hot pack."""
        return not self.geometry.is_partitioned or self.fully_hot

    @property
    def gather_rows(self) -> np.ndarray:
        """Rows each rank reads as owner (replicated: its own cold rows from its replica)."""
        if self.local:
            return np.full(self.world, self.cold_unique)
        return self.recv_ids

    @property
    def allreduce_bytes(self) -> float:
        """Hot-gradient all-reduce per iteration: the whole hot cache's gradient buffer (none
        when the pack synchronises its hot rows sparsely)."""
        return 0.0 if self.sparse_hot else float(self.hot_rows * self.grad_row_bytes)

    @property
    def a2a_grad_bytes(self) -> np.ndarray:
        """Gradient all-to-all buffer; column-wise with row-wise Adagrad sends full rows to every owner
        (the row's state needs the whole gradient)."""
        g = self.grad_row_bytes
        if not self.geometry.is_partitioned:
            return np.zeros(self.world)
        if self.state_bytes:
            return np.maximum(self.cold_unique * g * self.geometry.id_fanout, self.recv_ids * g)
        return np.maximum(self.cold_unique * g, self.recv_ids * self.slice_bytes * g / self.row_bytes)

    def allgather_bytes(self, micro_batches: int) -> float:
        """Replicated packs: each rank's contribution to the sparse gradient all-gather (rows + IDs)."""
        return self.cold_unique * micro_batches * (self.grad_row_bytes + ID_BYTES)

    def bytes_saved_per_step(self, micro_batches: int) -> float:
        """All-to-all bytes per rank per iteration the hot set saves: per cold row no longer
        exchanged, its ID, its row and its gradient; pooled at the owner, only the ID (one
        pooled vector per bag and owner travels whether or not some of its rows are hot)."""
        per_row = self.id_bytes if self.pooled else self.id_bytes + 2 * self.row_bytes
        return (self.cold_unique_nohot - self.cold_unique) * per_row * micro_batches


def _table_stats(acc: TableAccess, lookups: float, hot: int, head: bool) -> tuple:
    """(hot coverage, distinct rows, distinct cold rows, hottest cold rows, their presence q),
    memoised on the access object: the search asks the same questions many times."""
    memo = acc.__dict__.setdefault("_volume_memo", {})
    key = (round(lookups, 6), hot, head)
    got = memo.get(key)
    if got is None:
        cov = acc.coverage_at(hot) if hot else 0.0
        d_all = acc.distinct(lookups, 0)
        d_cold = acc.distinct(lookups, hot) if hot else d_all
        rows = q = None
        if head:
            rows, p = acc.head(hot, HEAD_ROWS)
            q = presence(p, lookups)
        got = memo[key] = (cov, d_all, d_cold, rows, q)
    return got


def pack_volumes(
    plan: Plan, pack: PackPlan, access: dict[str, TableAccess], samples: float,
    gpus_per_node: int | None = None, dedup: bool = True,
) -> PackVolumes:
    """Traffic of `pack` when each rank looks up `samples` samples (`dedup=False`: every
    lookup travels, as TorchRec sends them)."""
    model = plan.model
    world = plan.world_size
    geo = plan.geometry(pack)
    ranks = plan.pack_ranks(pack)
    owners = geo.row_owners
    specs = [model.table(t) for t in pack.tables]
    first = specs[0]
    row_bytes = first.bytes_per_row
    state = optimizer_state_bytes(table_optimizer(plan, first), first.dim)
    offsets = plan.table_offsets(pack)
    rows = plan.pack_rows(pack)

    lookups = hot_l = hot_u = cold_u = cold_u0 = 0.0
    hot_rows = 0
    head_load = np.zeros(owners)  # expected distinct head rows per owner index, per requester
    tail = upd = 0.0
    coverage = {}
    g = max(1, min(gpus_per_node or world, world))
    exchange = Exchange.POOLED if pooled_at_owners(plan, pack) else Exchange.ROWS
    for spec in specs:
        acc = access[spec.name]
        hot = int(plan.hot_rows.get(spec.name, 0))
        L = samples * acc.pooling
        if not dedup:  # TorchRec: no dedup, no hot rows: every lookup is a row to send and read
            upd += acc.distinct(L * world, 0)
            lookups += L
            cold_u += L
            cold_u0 += L
            tail += L
            coverage[spec.name] = 0.0
            continue
        if exchange == Exchange.POOLED:  # every lookup travels; hot ones pooled locally
            cov = _table_stats(acc, L, hot, False)[0]
            lookups += L
            hot_l += L * cov
            hot_u += L * cov  # hot gradients are sent per lookup
            cold_u += L * (1.0 - cov)
            cold_u0 += L
            tail += L * (1.0 - cov)
            hot_rows += hot
            coverage[spec.name] = cov
            continue
        cov, d_all, d_cold, head_rows, q = _table_stats(acc, L, hot, owners > 1)
        lookups += L
        hot_l += L * cov
        hot_u += max(d_all - d_cold, 0.0)
        cold_u += d_cold
        cold_u0 += d_all
        hot_rows += hot
        coverage[spec.name] = cov
        if head_rows is not None:
            np.add.at(head_load, geo.owner(offsets[spec.name] + head_rows), q)
            tail += max(d_cold - q.sum(), 0.0)
        else:
            tail += d_cold

    recv = np.zeros(world)
    shard = np.zeros(world)
    idx = np.asarray(geo.ranks)
    owned = np.zeros(world)
    width = sum(s.dim * (s.max_len if s.pooling == "none" else 1) for s in specs)
    col_share = np.array([s.cols for s in geo.shards], dtype=float) / geo.dim
    shard[idx] = np.array([s.rows for s in geo.shards]) * col_share  # a slice counted as its share of rows
    slice_bytes = row_bytes / geo.id_fanout  # the bytes of a row one owner holds
    if geo.is_partitioned:
        # each owner hears of its share of the rows (all of them when it holds a slice of each)
        recv[idx] = world * (head_load + tail / owners)
        owned[idx] = width * col_share
    return PackVolumes(
        name=pack.name, tables=list(pack.tables), sharding=pack.sharding, geometry=geo, ranks=ranks,
        placement=pack.placement, hot_sync=pack.hot_sync, exchange=exchange, torchrec=not dedup, dim=first.dim, row_bytes=row_bytes, state_bytes=state,
        optimizer=table_optimizer(plan, first),
        samples=samples, pooled_width=width,
        rows=rows, lookups=lookups,
        hot_lookups=hot_l, hot_unique=hot_u, cold_unique=cold_u, cold_unique_nohot=cold_u0,
        hot_rows=hot_rows, recv_ids=recv, shard_rows=shard, slice_bytes=slice_bytes, coverage=coverage,
        gpus_per_node=g, owned_width=owned, id_bytes=plan.wire_id_bytes(pack), fully_hot=plan.fully_hot(pack),
        update_rows=None if dedup else np.where(recv > 0, upd / owners, 0.0),
    )


FUSED = ".."  # a fused run of packs is named first..last


def fused_members(name: str, order: list[str]) -> list[str] | None:
    """The packs of `order` (a plan's pack names, in order) a fuse_table_wise name stands for;
    None when `name` is not such a name."""
    first, sep, last = name.partition(FUSED)
    if not sep or first not in order or last not in order:
        return None
    return order[order.index(first) : order.index(last) + 1]


def fuse_table_wise(packs: list[PackVolumes]) -> PackVolumes:
    """Table-wise (or table-row-wise) packs of one attribute group lowered as one exchange
    (TorchRec's fused sharding: one collective in which each rank owns its own tables)."""
    first = packs[0]
    owned = None if first.owned_width is None else sum(p.owned_width for p in packs)
    recv = sum(p.recv_ids for p in packs)
    shard = sum(p.shard_rows for p in packs)
    cov: dict[str, float] = {}
    for p in packs:
        cov.update(p.coverage)
    return PackVolumes(
        name=f"{first.name}{FUSED}{packs[-1].name}" if len(packs) > 1 else first.name,
        tables=[t for p in packs for t in p.tables], sharding=first.sharding,
        geometry=type(first.geometry)(sum(p.rows for p in packs), first.dim, tuple(sorted({r for p in packs
                                                                                              for r in p.ranks}))),
        ranks=sorted({r for p in packs for r in p.ranks}), placement=first.placement, dim=first.dim,
        row_bytes=first.row_bytes, state_bytes=first.state_bytes, optimizer=first.optimizer, samples=first.samples,
        pooled_width=sum(p.pooled_width for p in packs), rows=sum(p.rows for p in packs),
        lookups=sum(p.lookups for p in packs), hot_lookups=sum(p.hot_lookups for p in packs),
        hot_unique=sum(p.hot_unique for p in packs), cold_unique=sum(p.cold_unique for p in packs),
        cold_unique_nohot=sum(p.cold_unique_nohot for p in packs), hot_rows=sum(p.hot_rows for p in packs),
        recv_ids=recv, shard_rows=shard, slice_bytes=first.slice_bytes, coverage=cov,
        gpus_per_node=first.gpus_per_node, owned_width=owned,
        update_rows=None if first.update_rows is None else sum(p.update_rows for p in packs),
        exchange=first.exchange, torchrec=first.torchrec, id_bytes=max(p.id_bytes for p in packs),
    )


def table_cost(t: TableSpec, acc: TableAccess, world: int, batch: int) -> float:
    """Bytes an owner moves per step for table t: distinct rows requested by every rank, ids and rows."""
    return world * acc.distinct(batch * acc.pooling) * (t.bytes_per_row + wire_id_bytes(t.num_rows))
