"""Where every embedding row lives under a Plan, and the deterministic initial weights.

Initial weights depend only on (plan seed, table, row): each table is generated in
chunks of INIT_CHUNK rows from a per-(seed, table, chunk) generator, so any rank can
build any shard, the hot cache or the whole table, and all of them agree bit for bit
with the single-process reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from planner.model_spec import ModelSpec, TableSpec
from planner.plan import PackPlan, Plan

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


def init_table_rows(model: ModelSpec, table: str, seed: int, rows: np.ndarray | None = None) -> torch.Tensor:
    """Initial weights of `rows` (table-local, any order) of a table, or of all rows."""
    spec = model.table(table)
    index = model.table_names.index(table)
    if rows is None:
        rows = np.arange(spec.num_rows, dtype=np.int64)
    rows = np.asarray(rows, dtype=np.int64)
    out = np.empty((len(rows), spec.dim), dtype=np.float32)
    if len(rows):
        chunks = rows // INIT_CHUNK
        for c in np.unique(chunks):
            sel = np.nonzero(chunks == c)[0]
            out[sel] = _chunk(spec, index, seed, int(c))[rows[sel] - c * INIT_CHUNK]
    return torch.from_numpy(out)


def sparse_optimizer(plan: Plan, table: TableSpec) -> str:
    """A table's own optimizer when it names one other than the default, else the plan's."""
    return table.optimizer if table.optimizer != "sgd" else plan.optimizer.sparse


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
        if self.sharding != "column_wise":
            return [(0, self.dim)] * self.n
        parts = np.array_split(np.arange(self.dim), self.n)
        return [(int(p[0]), int(p[-1]) + 1) for p in parts]

    def local_packed_rows(self, index: int | None = None) -> np.ndarray:
        """Packed rows of shard `index` (default: this rank's), in local-row order."""
        i = self.index if index is None else index
        if i < 0:
            return np.zeros(0, dtype=np.int64)
        if self.sharding == "row_wise":
            return np.arange(i, self.rows, self.n, dtype=np.int64)
        if self.sharding == "table_wise" and i != 0:
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
    ranks = list(range(plan.world_size)) if pack.sharding == "replicated" else plan.pack_ranks(pack)
    return PackLayout(
        name=pack.name,
        tables=list(pack.tables),
        table_offsets=plan.table_offsets(pack),
        table_rows={t: plan.model.table(t).num_rows for t in pack.tables},
        rows=plan.pack_rows(pack),
        dim=first.dim,
        mode=first.pooling,
        # table-row-wise lays rows out as row-wise over the node's ranks (planner.plan)
        sharding="row_wise" if pack.sharding == "table_row_wise" else pack.sharding,
        ranks=ranks,
        rank=rank,
        world=plan.world_size,
        optimizer=sparse_optimizer(plan, first),
    )


def init_packed_rows(model: ModelSpec, layout: PackLayout, seed: int, packed: np.ndarray) -> torch.Tensor:
    """Initial full-width weights of packed rows of a pack."""
    out = torch.empty(len(packed), layout.dim, dtype=torch.float32)
    for t, sel, rows in layout.split_packed(np.asarray(packed, dtype=np.int64)):
        if len(sel):
            out[torch.from_numpy(sel)] = init_table_rows(model, t, seed, rows)
    return out
