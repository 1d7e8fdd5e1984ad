"""Where every embedding row lives under a Plan, and the deterministic initial weights.

Initial weights depend only on (plan seed, table, row): each table is generated in
chunks of INIT_CHUNK rows from a per-(seed, table, chunk) generator, so any rank can
build any shard, the hot cache or the whole table, and all of them agree bit for bit
with the single-process reference. Rows are written into their destination one chunk
at a time: building a shard costs the shard plus one chunk (the planner counts it so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from planner.model_spec import ModelSpec, TableSpec
from planner.plan import PackPlan, Plan, table_optimizer
from planner.sharding import Sharding

INIT_CHUNK = 1 << 14


def init_scale(table: TableSpec) -> float:
    """Uniform bound / normal std of a table's initial weights (DLRM uses 1/sqrt(rows))."""
    if table.initializer == "uniform":
        return math.sqrt(1.0 / table.num_rows)
    return 1.0 / math.sqrt(table.dim)


def _chunk(table: TableSpec, table_index: int, seed: int, chunk: int) -> np.ndarray:
    start = chunk * INIT_CHUNK
    n = min(INIT_CHUNK, table.num_rows - start)
    if table.initializer == "zeros":
        return np.zeros((n, table.dim), dtype=np.float32)
    rng = np.random.default_rng([seed, table_index, chunk])
    a = init_scale(table)
    if table.initializer == "uniform":
        return (rng.random((n, table.dim), dtype=np.float32) * (2 * a) - a).astype(np.float32)
    return (rng.standard_normal((n, table.dim), dtype=np.float32) * a).astype(np.float32)


def _fill_strided(dst: np.ndarray, spec: TableSpec, index: int, seed: int, first: int, step: int) -> None:
    """dst[j] = initial row `first + step * j` of a table, one generator chunk at a time
    (no index arrays: a 10M-row shard costs its own rows plus one chunk)."""
    n = len(dst)
    if n == 0:
        return
    last = first + step * (n - 1)
    for c in range(first // INIT_CHUNK, last // INIT_CHUNK + 1):
        base = c * INIT_CHUNK
        j0 = max(0, -(-(base - first) // step))
        j1 = min(n, -(-(base + INIT_CHUNK - first) // step))
        if j1 > j0:
            lo = first + step * j0 - base
            dst[j0:j1] = _chunk(spec, index, seed, c)[lo : lo + step * (j1 - j0) : step]


def _fill_rows(dst: np.ndarray, spec: TableSpec, index: int, seed: int, rows: np.ndarray) -> None:
    """dst[i] = initial row rows[i] (any order): rows grouped by chunk with one sort."""
    chunks = rows // INIT_CHUNK
    order = np.argsort(chunks, kind="stable")
    sorted_chunks = chunks[order]
    starts = np.flatnonzero(np.r_[True, sorted_chunks[1:] != sorted_chunks[:-1]])
    ends = np.r_[starts[1:], len(order)]
    for a, b in zip(starts, ends):
        c = int(sorted_chunks[a])
        sel = order[a:b]
        dst[sel] = _chunk(spec, index, seed, c)[rows[sel] - c * INIT_CHUNK]


def _progression(rows: np.ndarray) -> tuple[int, int] | None:
    """(first, step) when `rows` is first + step * arange(n) with step >= 1 (whole tables,
    row-wise shards), else None. Checked in slices: no full-size temporaries."""
    n = len(rows)
    if n == 0:
        return 0, 1
    first = int(rows[0])
    step = int(rows[1] - rows[0]) if n > 1 else 1
    if step < 1:
        return None
    block = 1 << 20
    for a in range(0, n, block):
        b = min(n, a + block)
        if not np.array_equal(rows[a:b], first + step * np.arange(a, b, dtype=np.int64)):
            return None
    return first, step


def init_table_rows(model: ModelSpec, table: str, seed: int, rows: np.ndarray | None = None) -> torch.Tensor:
    """Initial weights of `rows` (table-local, any order) of a table, or of all rows."""
    spec = model.table(table)
    index = model.table_names.index(table)
    n = spec.num_rows if rows is None else len(rows)
    out = torch.empty(n, spec.dim, dtype=torch.float32)
    if rows is None:
        _fill_strided(out.numpy(), spec, index, seed, 0, 1)
    elif n:
        _fill_rows(out.numpy(), spec, index, seed, np.asarray(rows, dtype=np.int64))
    return out


@dataclass
class PackLayout:
    """One pack as seen from one rank: which packed rows and columns it holds."""

    name: str
    tables: list[str]
    table_offsets: dict[str, int]
    table_rows: dict[str, int]
    rows: int
    dim: int
    mode: str  # sum | mean | none
    sharding: str
    ranks: list[int]  # ranks holding a shard (every rank for replicated)
    rank: int
    world: int
    optimizer: str

    @property
    def n(self) -> int:
        return len(self.ranks)

    @property
    def index(self) -> int:
        """This rank's position in `ranks`, -1 when it holds nothing."""
        return self.ranks.index(self.rank) if self.rank in self.ranks else -1

    def col_slices(self) -> list[tuple[int, int]]:
        """Column range of each shard (the whole dim unless column-wise)."""
        if self.sharding != Sharding.COLUMN_WISE:
            return [(0, self.dim)] * self.n
        parts = np.array_split(np.arange(self.dim), self.n)
        return [(int(p[0]), int(p[-1]) + 1) for p in parts]

    def local_packed_rows(self, index: int | None = None) -> np.ndarray:
        """Packed rows of shard `index` (default: this rank's), in local-row order."""
        i = self.index if index is None else index
        if i < 0:
            return np.zeros(0, dtype=np.int64)
        if self.sharding == Sharding.ROW_WISE:
            return np.arange(i, self.rows, self.n, dtype=np.int64)
        if self.sharding == Sharding.TABLE_WISE and i != 0:
            return np.zeros(0, dtype=np.int64)
        return np.arange(self.rows, dtype=np.int64)

    def split_packed(self, packed: np.ndarray) -> list[tuple[str, np.ndarray, np.ndarray]]:
        """(table, positions into `packed`, table-local rows) for each table of the pack."""
        out = []
        for t in self.tables:
            lo = self.table_offsets[t]
            hi = lo + self.table_rows[t]
            sel = np.nonzero((packed >= lo) & (packed < hi))[0]
            out.append((t, sel, packed[sel] - lo))
        return out


def pack_layout(plan: Plan, pack: PackPlan, rank: int) -> PackLayout:
    first = plan.model.table(pack.tables[0])
    ranks = list(range(plan.world_size)) if pack.sharding == Sharding.REPLICATED else plan.pack_ranks(pack)
    return PackLayout(
        name=pack.name,
        tables=list(pack.tables),
        table_offsets=plan.table_offsets(pack),
        table_rows={t: plan.model.table(t).num_rows for t in pack.tables},
        rows=plan.pack_rows(pack),
        dim=first.dim,
        mode=first.pooling,
        # table-row-wise lays rows out as row-wise over the node's ranks (planner.plan)
        sharding=Sharding.ROW_WISE if pack.sharding == Sharding.TABLE_ROW_WISE else pack.sharding,
        ranks=ranks,
        rank=rank,
        world=plan.world_size,
        optimizer=table_optimizer(plan, first),
    )


def init_packed_rows(model: ModelSpec, layout: PackLayout, seed: int, packed: np.ndarray) -> torch.Tensor:
    """Initial full-width weights of packed rows of a pack, written in place chunk by chunk."""
    packed = np.asarray(packed, dtype=np.int64)
    out = torch.empty(len(packed), layout.dim, dtype=torch.float32)
    dst = out.numpy()
    prog = _progression(packed)
    for t in layout.tables:
        lo = layout.table_offsets[t]
        hi = lo + layout.table_rows[t]
        spec = model.table(t)
        index = model.table_names.index(t)
        if prog is not None:  # positions i with lo <= first + step * i < hi
            first, step = prog
            i0 = max(0, -(-(lo - first) // step))
            i1 = min(len(packed), max(0, -(-(hi - first) // step)))
            if i1 > i0:
                _fill_strided(dst[i0:i1], spec, index, seed, first + step * i0 - lo, step)
            continue
        sel = np.flatnonzero((packed >= lo) & (packed < hi))
        if len(sel):
            part = np.empty((len(sel), layout.dim), dtype=np.float32)
            _fill_rows(part, spec, index, seed, packed[sel] - lo)
            dst[sel] = part
    return out
