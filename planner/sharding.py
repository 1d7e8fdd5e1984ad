"""planner/sharding.py: how a pack's tables are spread over its ranks (the one Sharding type)."""

from __future__ import annotations

from planner.modes import Mode


class Sharding(Mode):
    """A pack's sharding. A str enum: plan files keep the plain names and compare equal to them.

    - table_wise: each table whole on one of the pack's ranks;
    - row_wise: every table's rows split round-robin over the pack's ranks;
    - column_wise: every table's columns split over the pack's ranks;
    - table_row_wise: row-wise inside one node (TorchRec's TWRW); its fused pooled exchange is
      hierarchical (planner.pooled_twrw), its rows exchange that of row-wise over the node;
    - replicated: every rank holds every table (data parallel).
    """

    ROW_WISE = "row_wise"
    TABLE_WISE = "table_wise"
    COLUMN_WISE = "column_wise"
    REPLICATED = "replicated"
    TABLE_ROW_WISE = "table_row_wise"

    @property
    def exchanges(self) -> bool:
        """Whether lookups cross ranks (planner.geometry: every sharding but a replica)."""
        from planner.geometry import geometry_kind  # the geometry imports this enum

        return geometry_kind(self).is_partitioned

    @property
    def can_pool_at_owner(self) -> bool:
        """Whether an owner may pool its part of a bag (PackPlan.exchange "pooled"; planner.geometry)."""
        from planner.geometry import geometry_kind

        return geometry_kind(self).owns_whole_rows


SHARDINGS = tuple(s.value for s in Sharding)
