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
        """Whether lookups cross ranks (every sharding but a replica)."""
        return self is not Sharding.REPLICATED

    @property
    def can_pool_at_owner(self) -> bool:
        """Whether an owner may pool its part of a bag (PackPlan.exchange "pooled"): it pools whole
        rows of its bags. Column-wise would pool slices and need full-row gradients for row-wise
        Adagrad; a replica exchanges nothing."""
        return self in (Sharding.ROW_WISE, Sharding.TABLE_WISE, Sharding.TABLE_ROW_WISE)


SHARDINGS = tuple(s.value for s in Sharding)
POOLED_SHARDINGS = tuple(s.value for s in Sharding if s.can_pool_at_owner)
