"""The validation sweep: a deterministic list of varied plans for one model and machine.

Every knob the issue names is varied across the list: packing on/off, hot-set sizes,
sharding types (row-wise, table-wise, column-wise, replicated, mixed), micro-batches
1/2/4 with kernel interleaving, batch sizes, 1/2/4 ranks; the baselines and the
planner's own choice are among them. Plans are built with planner's Plan/PackPlan and
baselines; hot IDs come from the access statistics (hottest rows first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Case:
    name: str
    plan: Any  # planner.plan.Plan
    hot_ids: dict[str, np.ndarray]
    knobs: dict[str, Any] = field(default_factory=dict)
    role: str = "validate"  # or "fit"


def _groups(model: Any) -> list[list[str]]:
    groups: dict[tuple, list[str]] = {}
    for t in model.tables:
        groups.setdefault(t.attributes(), []).append(t.name)
    return list(groups.values())


def _hot(model: Any, access: dict[str, Any], fraction: float, min_rows: int = 0) -> tuple[dict, dict]:
    """Hot sets of `fraction` of each table's rows (at least min_rows, at most the table)."""
    rows, ids = {}, {}
    if fraction <= 0:
        return rows, ids
    for t in model.tables:
        n = int(min(t.num_rows, max(min_rows, round(fraction * t.num_rows))))
        if n > 0:
            rows[t.name] = n
            ids[t.name] = np.asarray(access[t.name].hot_rows(n), dtype=np.int64)
    return rows, ids


def _make(model: Any, world: int, batch: int, packs: list[Any], *, hot: tuple[dict, dict] = ({}, {}),
          mb: int = 1, ki: bool = False, seed: int = 0) -> tuple[Any, dict]:
    from planner.plan import Plan

    hot_rows, hot_ids = hot
    plan = Plan(model=model, world_size=world, batch_size_per_rank=batch, packs=packs, hot_rows=hot_rows,
                hot_ids_file="hot.npz" if hot_rows else None, micro_batches=mb, kernel_interleaving=ki,
                hardware="local-cpu", seed=seed)
    plan.validate()
    return plan, hot_ids


PLANNER_BUDGET_S = 5.0  # the search is deterministic; a short budget keeps the sweep quick

# A recipe builds one plan: (model, world, batch, access, hw) -> (Plan, hot ids, knobs).
Recipe = Callable[[Any, int, int, dict, Any], tuple[Any, dict, dict]]


def r_baseline(name: str) -> Recipe:
    def build(model: Any, world: int, batch: int, access: dict, hw: Any) -> tuple[Any, dict, dict]:
        from planner.baselines import baseline_plan

        plan = baseline_plan(name, model, world, batch, hw=hw, access=access)
        return plan, {}, {"baseline": name}
    return build


def r_packed(sharding: str, hot: float = 0.0, mb: int = 1, ki: bool = False, packing: bool = True) -> Recipe:
    def build(model: Any, world: int, batch: int, access: dict, hw: Any) -> tuple[Any, dict, dict]:
        from planner.plan import PackPlan

        groups = _groups(model) if packing else [[t.name] for t in model.tables]
        packs = []
        for i, g in enumerate(groups):
            s = sharding
            if s == "column_wise" and model.table(g[0]).dim < world:
                s = "row_wise"
            ranks = [i % world] if s == "table_wise" else None
            packs.append(PackPlan(f"p{i}", g, s, ranks))
        plan, ids = _make(model, world, batch, packs, hot=_hot(model, access, hot, min_rows=16 if hot else 0),
                          mb=mb, ki=ki)
        return plan, ids, {"packing": packing, "sharding": sharding, "hot_fraction": hot, "micro_batches": mb,
                           "kernel_interleaving": ki}
    return build


def r_mixed(hot: float = 0.0, mb: int = 1, ki: bool = False) -> Recipe:
    """Large tables row-wise in one pack, small tables replicated in another (P2RES two-fold)."""
    def build(model: Any, world: int, batch: int, access: dict, hw: Any) -> tuple[Any, dict, dict]:
        from planner.plan import PackPlan

        rows = sorted(t.num_rows for t in model.tables)
        cut = rows[len(rows) // 2]
        big = [t.name for t in model.tables if t.num_rows > cut]
        small = [t.name for t in model.tables if t.num_rows <= cut]
        packs = [PackPlan("big", big, "row_wise")] if big else []
        if small:
            packs.append(PackPlan("small", small, "replicated"))
        plan, ids = _make(model, world, batch, packs, hot=_hot(model, access, hot, min_rows=16 if hot else 0),
                          mb=mb, ki=ki)
        return plan, ids, {"packing": True, "sharding": "mixed", "hot_fraction": hot, "micro_batches": mb,
                           "kernel_interleaving": ki}
    return build


def r_planner() -> Recipe:
    def build(model: Any, world: int, batch: int, access: dict, hw: Any) -> tuple[Any, dict, dict]:
        from planner.search import search  # the planner's own choice; required, fails loudly

        res = search(model, hw, access=access, batch_size_per_rank=batch, time_budget_s=PLANNER_BUDGET_S)
        plan = res.plan
        ids = dict(getattr(res, "hot_ids", None) or {})
        if not ids and any(plan.hot_rows.values()):
            ids = {t: np.asarray(access[t].hot_rows(n), dtype=np.int64) for t, n in plan.hot_rows.items() if n}
        return plan, ids, {"planner": True}
    return build


# The sweep, in order: (recipe name, recipe, micro-batches is set inside the recipe).
RECIPES: list[tuple[str, Recipe]] = [
    ("planner", r_planner()),
    ("naive", r_baseline("naive")),
    ("torchrec-like", r_baseline("torchrec-like")),
    ("dp-hot-only", r_baseline("dp-hot-only")),
    ("packed-rw", r_packed("row_wise")),
    ("unpacked-rw", r_packed("row_wise", packing=False)),
    ("packed-rw-hot1%", r_packed("row_wise", hot=0.01)),
    ("packed-rw-hot20%", r_packed("row_wise", hot=0.2)),
    ("packed-cw", r_packed("column_wise")),
    ("packed-tw", r_packed("table_wise")),
    ("mixed", r_mixed()),
    ("packed-rw-mb2", r_packed("row_wise", mb=2)),
    ("packed-rw-mb4-ki", r_packed("row_wise", mb=4, ki=True)),
    ("unpacked-tw-hot5%", r_packed("table_wise", hot=0.05, packing=False)),
    ("mixed-hot5%-mb2-ki", r_mixed(hot=0.05, mb=2, ki=True)),
    ("packed-cw-hot1%-mb2", r_packed("column_wise", hot=0.01, mb=2)),
    ("packed-rw-ki", r_packed("row_wise", ki=True)),
    ("unpacked-rw-mb4", r_packed("row_wise", mb=4, packing=False)),
    ("packed-repl", r_packed("replicated")),
    ("packed-rw-hot100%", r_packed("row_wise", hot=1.0)),
]


def build_sweep(
    model: Any,
    access: dict[str, Any],
    hw_for_world: Callable[[int], Any],
    n_plans: int = 24,
    worlds: tuple[int, ...] = (1, 2, 4),
    batches: tuple[int, ...] = (256, 512, 1024),
    include_planner: bool = True,
    fit_count: int = 0,
) -> list[Case]:
    """`n_plans` cases cycling through the recipes, worlds and batch sizes.

    Worlds and batches advance at different strides so that recipes meet different
    ones on later rounds. `fit_count` cases, evenly spread over the list, are marked role
    "fit": a set disjoint from the validated ones, for `picasso validate --fit-plans`.
    Where those leave a world size without fit plans at some batch size, a case of that
    world and batch size joins them (`cover_batches`), and the sweep grows by as many
    cases so that `n_plans - fit_count` are still validated.
    """
    if n_plans < 1:
        raise ValueError(f"--plans must be at least 1, got {n_plans}")
    gen = _cases(model, access, hw_for_world, worlds, batches, include_planner, n_plans * 4)
    cases = [c for _, c in zip(range(n_plans), gen)]
    if fit_count:
        n = len(cases)
        for i in range(min(fit_count, n)):
            cases[min(n - 1, int((i + 0.5) * n / fit_count))].role = "fit"
        for _ in cover_batches(cases):  # each added fit plan costs a validated one: add one back
            more = next(gen, None)
            if more is not None:
                cases.append(more)
    return cases


FIXED_RECIPES = ("planner", "naive", "torchrec-like", "dp-hot-only")  # left to be validated where possible


def cover_batches(cases: list[Case]) -> list[Case]:
    """Mark as "fit" one case for each (world size, batch size) pair that the fit cases
    lack, if the sweep has one (a recipe other than the planner's and the baselines'
    first); returns the cases marked. A world fitted at one batch size only cannot tell
    its ops' fixed part from their rate: measured here, the default fit set had its 2-rank
    plans at batch 256 only and over-predicted 2-rank plans at 512-1024 by 15-31% (MAPE
    10.0% on the sweep; 7.7% with the pairs covered, refitted on the same measurements)."""
    fit_worlds = {c.plan.world_size for c in cases if c.role == "fit"}
    have = {(c.plan.world_size, c.plan.batch_size_per_rank) for c in cases if c.role == "fit"}
    added = []
    for c in sorted((c for c in cases if c.role != "fit"), key=lambda c: c.knobs.get("recipe") in FIXED_RECIPES):
        pair = (c.plan.world_size, c.plan.batch_size_per_rank)
        if c.plan.world_size in fit_worlds and pair not in have:
            c.role = "fit"
            have.add(pair)
            added.append(c)
    return added


def _cases(model: Any, access: dict[str, Any], hw_for_world: Callable[[int], Any], worlds: tuple[int, ...],
           batches: tuple[int, ...], include_planner: bool, limit: int) -> Iterator[Case]:
    """The sweep's cases in order, distinct by recipe, world and batch size."""
    recipes = [r for r in RECIPES if include_planner or r[0] != "planner"]
    seen: set[str] = set()
    for i in range(limit):
        name, recipe = recipes[i % len(recipes)]
        rnd = i // len(recipes)
        world = worlds[(i + rnd) % len(worlds)]
        batch = batches[(i // len(worlds) + rnd) % len(batches)]
        if world == 1 and name in ("naive", "torchrec-like", "dp-hot-only", "packed-tw"):
            world = worlds[-1]  # a one-rank baseline is the same program as any other plan
        key = f"{name}-w{world}-b{batch}"
        if key in seen:
            continue
        seen.add(key)
        plan, ids, knobs = recipe(model, world, batch, access, hw_for_world(world))
        if plan.batch_size_per_rank % plan.micro_batches:
            continue
        knobs = {"recipe": name, "world": world, "batch": plan.batch_size_per_rank, **knobs}
        yield Case(key, plan, ids, knobs)
