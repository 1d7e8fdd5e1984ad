"""Plans the executor's tests and benchmarks build without the planner.

`naive_plan`: one table per pack, table-wise round-robin over the ranks, no hot rows,
one micro-batch. `random_plan`: a random valid plan (packing, shardings, rank subsets,
hot sets from empty to whole tables, micro-batches), for the equivalence tests.
"""

from __future__ import annotations

import numpy as np

from planner.model_spec import ModelSpec
from planner.plan import OptimizerPlan, PackPlan, Plan

# the shardings random plans draw from (fixed, so seeded tests keep their plans;
# table_row_wise runs as row_wise over a rank subset and is tested on its own)
RANDOM_SHARDINGS = ("row_wise", "table_wise", "column_wise", "replicated")


def naive_plan(model: ModelSpec, world: int, batch_per_rank: int, seed: int = 0) -> Plan:
    packs = [
        PackPlan(f"pack{i}", [t.name], "table_wise", ranks=[i % world]) for i, t in enumerate(model.tables)
    ]
    plan = Plan(model, world, batch_per_rank, packs, seed=seed, notes={"baseline": "naive"})
    plan.validate()
    return plan


def packed_groups(model: ModelSpec) -> list[list[str]]:
    """Tables grouped by packing attributes, in model order."""
    groups: dict[tuple, list[str]] = {}
    for t in model.tables:
        groups.setdefault(t.attributes(), []).append(t.name)
    return list(groups.values())


def random_plan(
    model: ModelSpec,
    world: int,
    batch_per_rank: int,
    rng: np.random.Generator,
    packing: bool | None = None,
    sharding: str | None = None,
    micro_batches: int | None = None,
    hot: str | None = None,
    optimizer: OptimizerPlan | None = None,
    seed: int = 0,
) -> tuple[Plan, dict[str, np.ndarray]]:
    """A random valid plan and its hot IDs; any argument given fixes that choice."""
    packing = bool(rng.integers(2)) if packing is None else packing
    groups = packed_groups(model) if packing else [[t.name] for t in model.tables]
    packs = []
    for i, g in enumerate(groups):
        s = sharding or str(rng.choice(RANDOM_SHARDINGS))
        dim = model.table(g[0]).dim
        if s == "column_wise" and dim < world:
            s = "row_wise"
        if s == "table_wise":
            ranks = [int(rng.integers(world))]
        elif s == "replicated" or rng.random() < 0.5:
            ranks = None
        else:
            n = int(rng.integers(1, world + 1))
            ranks = [int(r) for r in rng.permutation(world)[:n]]
            if s == "column_wise" and dim < len(ranks):
                ranks = ranks[:dim]
        packs.append(PackPlan(f"pack{i}", g, s, ranks=ranks))
    hot_rows, hot_ids = {}, {}
    for t in model.tables:
        mode = hot or str(rng.choice(["none", "some", "all"]))
        n = {"none": 0, "some": int(rng.integers(1, t.num_rows + 1)), "all": t.num_rows}[mode]
        if n:
            hot_rows[t.name] = n
            hot_ids[t.name] = rng.permutation(t.num_rows)[:n].astype(np.int64)
    k = micro_batches or int(rng.choice([1, 2, 4]))
    plan = Plan(
        model, world, batch_per_rank, packs, hot_rows=hot_rows,
        hot_ids_file="hot.npz" if hot_rows else None, micro_batches=k,
        kernel_interleaving=bool(rng.integers(2)), optimizer=optimizer or OptimizerPlan(), seed=seed,
    )
    plan.validate()
    return plan, hot_ids
