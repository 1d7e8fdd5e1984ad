"""Where every embedding row lives under a Plan, and the deterministic initial weights.

Initial weights depend only on (plan seed, table, row, column): a counter-based generator
in torch integer ops (executor.sparse.init_rng) gives every element from its own counter, so
any rank builds any shard, the hot cache or the whole table, on the CPU or on its GPU, and
all of them agree bit for bit with the single-process reference. Rows are generated into
their destination one chunk at a time: building a shard costs the shard plus one chunk's
temporaries (the planner counts it so).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from executor.sparse.init_rng import init_values
from planner.geometry import ShardGeometry
from planner.model_spec import ModelSpec, TableSpec
from planner.plan import PackPlan, Plan, table_optimizer
from planner.sharding import Sharding

# elements generated per call: bounds the generator's int64 temporaries (a few per element)
INIT_CHUNK_ELEMS = {"cpu": 1 << 20, "cuda": 1 << 24}


def _chunk_rows(device: torch.device, width: int) -> int:
    return max(1, INIT_CHUNK_ELEMS.get(device.type, 1 << 20) // max(1, width))


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


def _fill(out: torch.Tensor, spec: TableSpec, index: int, seed: int, rows: np.ndarray | range,
          cols: tuple[int, int] | None, compute: torch.device) -> None:
    """out[i] = initial row rows[i] (table-local; a range is generated on `compute` without an
    index array on the host), `compute` generating one chunk at a time."""
    n = len(rows)
    step = _chunk_rows(compute, out.shape[1])
    for a in range(0, n, step):
        b = min(n, a + step)
        if isinstance(rows, range):
            part = rows[a:b]
            idx = torch.arange(part.start, part.stop, part.step, dtype=torch.int64, device=compute)
        else:
            idx = torch.from_numpy(np.ascontiguousarray(rows[a:b])).to(compute)
        out[a:b] = init_values(spec, index, seed, idx, cols).to(out.dtype)


def init_table_rows(model: ModelSpec, table: str, seed: int, rows: np.ndarray | None = None,
                    device: torch.device | str = "cpu") -> torch.Tensor:
    """Initial weights of `rows` (table-local, any order) of a table, or of all rows, on `device`."""
    spec = model.table(table)
    index = model.table_names.index(table)
    dev = torch.device(device)
    order: np.ndarray | range = range(spec.num_rows) if rows is None else np.asarray(rows, dtype=np.int64)
    out = torch.empty(len(order), spec.dim, dtype=torch.float32, device=dev)
    _fill(out, spec, index, seed, order, None, dev)
    return out


@dataclass
class PackLayout:
    """One pack as seen from one rank: which packed rows and columns it holds (planner.geometry)."""

    name: str
    tables: list[str]
    table_offsets: dict[str, int]
    table_rows: dict[str, int]
    mode: str  # sum | mean | none
    geometry: ShardGeometry
    rank: int
    world: int
    optimizer: str

    @property
    def rows(self) -> int:
        return self.geometry.rows

    @property
    def dim(self) -> int:
        return self.geometry.dim

    @property
    def ranks(self) -> list[int]:
        """Ranks holding a shard (every rank for replicated)."""
        return list(self.geometry.ranks)

    @property
    def sharding(self) -> Sharding:
        """The layout's name in checkpoints (planner.geometry: ShardGeometry.layout_name)."""
        return self.geometry.layout_name

    @property
    def n(self) -> int:
        return self.geometry.n

    @property
    def index(self) -> int:
        """This rank's position in `ranks`, -1 when it holds nothing."""
        return self.geometry.index(self.rank)

    def col_slices(self) -> list[tuple[int, int]]:
        """Column range of each shard (the whole dim unless column-wise)."""
        return self.geometry.col_slices()

    def local_packed_rows(self, index: int | None = None) -> np.ndarray:
        """Packed rows of shard `index` (default: this rank's), in local-row order."""
        i = self.index if index is None else index
        return self.geometry.shards[i].packed_rows() if i >= 0 else np.zeros(0, dtype=np.int64)


def pack_layout(plan: Plan, pack: PackPlan, rank: int) -> PackLayout:
    first = plan.model.table(pack.tables[0])
    return PackLayout(
        name=pack.name,
        tables=list(pack.tables),
        table_offsets=plan.table_offsets(pack),
        table_rows={t: plan.model.table(t).num_rows for t in pack.tables},
        mode=first.pooling,
        geometry=plan.geometry(pack),
        rank=rank,
        world=plan.world_size,
        optimizer=table_optimizer(plan, first),
    )


def init_packed_rows(model: ModelSpec, layout: PackLayout, seed: int, packed: np.ndarray,
                     device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                     cols: tuple[int, int] | None = None, compute: torch.device | str | None = None) -> torch.Tensor:
    """Initial weights of packed rows of a pack, columns `cols` (default all), as `dtype` on
    `device`, generated chunk by chunk on `compute` (default `device`: a GPU builds its shard in
    place; a host-placed shard can be generated on the GPU and copied)."""
    packed = np.asarray(packed, dtype=np.int64)
    dev = torch.device(device)
    comp = dev if compute is None else torch.device(compute)
    width = layout.dim if cols is None else cols[1] - cols[0]
    out = torch.empty(len(packed), width, dtype=dtype, device=dev)
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
                start = first + step * i0 - lo
                _fill(out[i0:i1], spec, index, seed, range(start, start + step * (i1 - i0), step), cols, comp)
            continue
        sel = np.flatnonzero((packed >= lo) & (packed < hi))
        if len(sel):
            part = torch.empty(len(sel), width, dtype=dtype, device=dev)
            _fill(part, spec, index, seed, packed[sel] - lo, cols, comp)
            out[torch.from_numpy(sel).to(dev)] = part
    return out
