"""Baseline plans, scored by the same lowering and simulator as the planner's own plans.

- `naive`: table-wise round-robin model parallelism, one pack (so one set of ops) per
  table, no hot cache, no interleaving: the PyTorch model-parallel baseline of PICASSO.
- `torchrec-like`: cost-balanced placement as TorchRec's planner does it: tables too big
  or too busy for one rank are row-wise over all ranks (one fused pack per attribute
  group), the others are placed table-wise by greedy cost balancing, one pack per rank
  and group; scored as one fused exchange per group (notes["fused_exchange"]), as
  TorchRec runs it; no hot replication, no interleaving.
- `dp-hot-only`: every table replicated (pure data parallelism, the "all hot" extreme of
  P2RES): no all-to-all at all, a full-table gradient all-reduce; only where it fits.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from planner.access import TableAccess, table_access
from planner.errors import PlanError
from planner.model_spec import ModelSpec, TableSpec
from planner.plan import PackPlan, Plan, model_optimizer
from planner.volumes import ID_BYTES, STATE_BYTES

BASELINES = ("naive", "torchrec-like", "dp-hot-only")
# TorchRec's own planner (planner.torchrec_bridge): needs the optional TorchRec install
TORCHREC = "torchrec"


def attribute_groups(model: ModelSpec) -> list[list[TableSpec]]:
    """Tables grouped by packing attributes, groups and tables in model order."""
    groups: dict[tuple, list[TableSpec]] = {}
    for t in model.tables:
        groups.setdefault(t.attributes(), []).append(t)
    return list(groups.values())


def _plan(model: ModelSpec, world: int, batch: int, packs: list[PackPlan], hw_name: str | None,
          baseline: str) -> Plan:
    plan = Plan(model=model, world_size=world, batch_size_per_rank=batch, packs=packs, hardware=hw_name,
                notes={"baseline": baseline}, optimizer=model_optimizer(model))
    plan.validate()
    return plan


def naive_plan(model: ModelSpec, world: int, batch: int, hw_name: str | None = None) -> Plan:
    """One table-wise pack per table, table i on rank i % world."""
    packs = [PackPlan(f"t_{t.name}", [t.name], "table_wise", [i % world]) for i, t in enumerate(model.tables)]
    return _plan(model, world, batch, packs, hw_name, "naive")


def table_cost(t: TableSpec, acc: TableAccess, world: int, batch: int) -> float:
    """Bytes an owner moves per step for table t: distinct rows requested by every rank, ids and rows."""
    return world * acc.distinct(batch * acc.pooling) * (t.bytes_per_row + ID_BYTES)


def torchrec_like_plan(
    model: ModelSpec, world: int, batch: int, hw: Any | None = None,
    access: dict[str, TableAccess] | None = None, hw_name: str | None = None,
) -> Plan:
    """Cost-balanced table-wise / row-wise placement with fused per-group lookups, no hot rows."""
    access = access if access is not None else table_access(model)
    hbm = float(hw.gpu.hbm_bytes) if hw is not None else 16e9
    packs: list[PackPlan] = []
    for gi, group in enumerate(attribute_groups(model)):
        costs = {t.name: table_cost(t, access[t.name], world, batch) for t in group}
        fair = sum(costs.values()) / world
        big, small = [], []
        for t in group:
            size = t.num_rows * (t.bytes_per_row + STATE_BYTES.get(t.optimizer, 0))
            # TorchRec shards row-wise what would dominate a rank's memory or time
            (big if world > 1 and (costs[t.name] > fair or size > 0.25 * hbm) else small).append(t)
        if big:
            packs.append(PackPlan(f"g{gi}_rw", [t.name for t in big], "row_wise"))
        load = [0.0] * world
        on_rank: dict[int, list[str]] = defaultdict(list)
        for t in sorted(small, key=lambda t: (-costs[t.name], t.name)):  # greedy LPT, deterministic
            r = min(range(world), key=lambda r: (load[r], r))
            load[r] += costs[t.name]
            on_rank[r].append(t.name)
        order = {t.name: i for i, t in enumerate(group)}
        for r in sorted(on_rank):
            names = sorted(on_rank[r], key=order.__getitem__)
            packs.append(PackPlan(f"g{gi}_r{r}", names, "table_wise", [r]))
    plan = _plan(model, world, batch, packs, hw_name, "torchrec-like")
    # TorchRec runs all table-wise tables of a group in one all-to-all; explain() scores it
    # so (lower(..., fuse_table_wise=True)); the executor runs the packs one by one
    plan.notes["fused_exchange"] = True
    return plan


def dp_hot_only_plan(model: ModelSpec, world: int, batch: int, hw_name: str | None = None) -> Plan:
    """Every table replicated on every rank, one replicated pack per attribute group."""
    packs = [PackPlan(f"g{gi}_dp", [t.name for t in g], "replicated") for gi, g in enumerate(attribute_groups(model))]
    return _plan(model, world, batch, packs, hw_name, "dp-hot-only")


def baseline_plan(
    name: str, model: ModelSpec, world: int, batch: int, hw: Any | None = None,
    access: dict[str, TableAccess] | None = None,
) -> Plan:
    """A baseline by name (see BASELINES)."""
    hw_name = getattr(hw, "name", None)
    if name == "naive":
        return naive_plan(model, world, batch, hw_name)
    if name == "torchrec-like":
        return torchrec_like_plan(model, world, batch, hw, access, hw_name)
    if name == "dp-hot-only":
        return dp_hot_only_plan(model, world, batch, hw_name)
    if name == TORCHREC:
        from planner.torchrec_bridge import torchrec_plan

        if hw is None:
            raise PlanError("the torchrec baseline needs the hardware spec (its topology)")
        return torchrec_plan(model, hw, batch, access)
    raise PlanError(f"unknown baseline {name!r}; known: {', '.join(BASELINES + (TORCHREC,))}")
