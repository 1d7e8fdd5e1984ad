"""planner/geometry.py: which rows and columns each shard of a pack holds, and who owns a row.

The one owner of the sharding rule. Each Sharding has a small geometry class here, chosen once
by `geometry_kind`; the planner's volumes and memory and the executor's layout, lookup and
collection ask it rather than branching on the sharding:

- row-wise: packed row r on shard r mod n, at local index r div n (a cyclic partition, so the
  hottest rows of every table spread over the shards);
- table-row-wise: row-wise over the ranks of one node;
- table-wise: the whole pack on its one rank;
- column-wise: every row on every shard, the columns split as numpy's array_split splits the
  dim (the first dim mod n shards one column wider);
- replicated: every row and column on every rank of the world.

As in TorchRec's ShardMetadata, a Shard is fully determined by its sizes and offsets (here
with a row step, which makes a cyclic row-wise shard one strided block). Torch-free: the
formulas (`owner`, `local_row`, `packed_row`) work on ints, numpy arrays and tensors alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np

from planner.sharding import Sharding


@dataclass(frozen=True)
class Shard:
    """Packed rows row_offset, row_offset + row_step, ... (`rows` of them), columns
    [col_offset, col_offset + cols), held by `rank`."""

    rank: int
    row_offset: int
    row_step: int
    rows: int
    col_offset: int
    cols: int

    @property
    def row_slice(self) -> slice:
        """The shard's rows as a slice of the packed table."""
        return slice(self.row_offset, self.row_offset + self.rows * self.row_step, self.row_step)

    def packed_rows(self) -> np.ndarray:
        """Its packed rows in local order."""
        s = self.row_slice
        return np.arange(s.start, s.stop, s.step, dtype=np.int64)

    @property
    def col_range(self) -> tuple[int, int]:
        return self.col_offset, self.col_offset + self.cols


@dataclass(frozen=True)
class ShardGeometry:
    """A pack of `rows` packed rows and `dim` columns spread over `ranks` (shard i on ranks[i])."""

    rows: int
    dim: int
    ranks: tuple[int, ...]

    sharding: ClassVar[Sharding]
    # the sharding's own facts (planner.sharding), on the class: each rank holds a part (lookups
    # cross ranks); each owner holds whole rows, so it may pool its part of a bag (PackPlan.exchange
    # "pooled") and a fully hot pack's replica replaces it (Plan.fully_hot: a hot row is read whole)
    is_partitioned: ClassVar[bool]
    owns_whole_rows: ClassVar[bool]
    splits_rows: ClassVar[bool] = False  # each row on one shard (owner = row mod n)
    splits_columns: ClassVar[bool] = False  # each row on every shard, a slice of its columns each
    within_node: ClassVar[bool] = False  # the shards are the ranks of one node

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.is_partitioned = cls.sharding.exchanges
        cls.owns_whole_rows = cls.sharding.can_pool_at_owner

    @classmethod
    def misfit(cls, ranks: list[int], dim: int) -> str | None:
        """Why a pack of this sharding cannot have these ranks and this dim; None when it can."""
        return None

    @property
    def n(self) -> int:
        return len(self.ranks)

    @cached_property
    def shards(self) -> tuple[Shard, ...]:
        return tuple(self._shard(i, r) for i, r in enumerate(self.ranks))

    @property
    def layout_name(self) -> Sharding:
        """The sharding checkpoints name this layout by."""
        return self.sharding

    def _shard(self, i: int, rank: int) -> Shard:
        """The whole pack (table-wise and replicated shards; subclasses split it)."""
        return Shard(rank, 0, 1, self.rows, 0, self.dim)

    def index(self, rank: int) -> int:
        """Position of `rank`'s shard, -1 when it holds none."""
        return self.ranks.index(rank) if rank in self.ranks else -1

    def on_rank(self, rank: int) -> Shard | None:
        i = self.index(rank)
        return self.shards[i] if i >= 0 else None

    @property
    def row_owners(self) -> int:
        """Shards the rows are divided among: a row's owner is `owner(row)` of these."""
        return self.n if self.splits_rows else 1

    @property
    def id_fanout(self) -> int:
        """Shards each requested row goes to (every slice holder when the columns are split)."""
        return self.n if self.splits_columns else 1

    def owner(self, rows):
        """Index of the shard owning each packed row (column-wise and whole shards: 0)."""
        return rows % self.row_owners

    def local_row(self, rows):
        """Each packed row's local index on its owner."""
        return rows // self.row_owners

    def packed_row(self, local, index: int):
        """Packed rows of shard `index`'s local rows."""
        s = self.shards[index]
        return local * s.row_step + s.row_offset

    def route_slot(self, index: int) -> int:
        """Shard `index`'s slot among a lookup's per-owner counts: its own when the rows are
        split (it owns rows index mod n), else the one slot every shard is sent."""
        return index if self.splits_rows else 0

    def col_slices(self) -> list[tuple[int, int]]:
        return [s.col_range for s in self.shards]


class RowWise(ShardGeometry):
    sharding = Sharding.ROW_WISE
    splits_rows = True

    def _shard(self, i: int, rank: int) -> Shard:
        return Shard(rank, i, self.n, len(range(i, self.rows, self.n)), 0, self.dim)


class TableRowWise(RowWise):
    """Row-wise over the ranks of one node (TorchRec's TWRW); only its fused pooled exchange
    (planner.pooled_twrw) is hierarchical."""

    sharding = Sharding.TABLE_ROW_WISE
    within_node = True

    @property
    def layout_name(self) -> Sharding:
        return RowWise.sharding  # its rows lie as row-wise ones do: checkpoints say so


class TableWise(ShardGeometry):
    """The pack whole on its first rank (a fused run of table-wise packs names several)."""

    sharding = Sharding.TABLE_WISE

    @classmethod
    def misfit(cls, ranks: list[int], dim: int) -> str | None:
        return None if len(ranks) == 1 else f"{cls.sharding} sharding needs exactly one rank, got {ranks}"

    def _shard(self, i: int, rank: int) -> Shard:
        return Shard(rank, 0, 1, self.rows if i == 0 else 0, 0, self.dim)


class ColumnWise(ShardGeometry):
    sharding = Sharding.COLUMN_WISE
    splits_columns = True

    @classmethod
    def misfit(cls, ranks: list[int], dim: int) -> str | None:
        return None if dim >= len(ranks) else f"{cls.sharding} over {len(ranks)} ranks needs dim >= ranks"

    def _shard(self, i: int, rank: int) -> Shard:
        base, wide = divmod(self.dim, self.n)  # numpy's array_split: the first `wide` one wider
        return Shard(rank, 0, 1, self.rows, i * base + min(i, wide), base + (i < wide))


class Replicated(ShardGeometry):
    """Every rank of the world holds the whole pack (data parallel)."""

    sharding = Sharding.REPLICATED


KINDS: dict[Sharding, type[ShardGeometry]] = {k.sharding: k for k in (RowWise, TableRowWise, TableWise, ColumnWise,
                                                                      Replicated)}


def geometry_kind(sharding: Sharding | str) -> type[ShardGeometry]:
    """The geometry class of a sharding (ValueError for a name that is none)."""
    return KINDS[Sharding(sharding)]


def shard_geometry(sharding: Sharding | str, rows: int, dim: int, ranks: list[int] | tuple[int, ...],
                   world: int) -> ShardGeometry:
    """The geometry of a pack; a replica is held by every rank of the world whatever `ranks` says."""
    kind = geometry_kind(sharding)
    return kind(rows, dim, tuple(ranks) if kind.is_partitioned else tuple(range(world)))
