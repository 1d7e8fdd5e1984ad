"""Plan builders live in one planner module: one naive plan, the baselines, the sweep, random plans."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from planner.builders import baseline_plan, naive_plan, random_plan
from planner.model_spec import ModelSpec, TableSpec


def model(opt: str = "sgd") -> ModelSpec:
    return ModelSpec("u", "dlrm", 2, (TableSpec("C1", 50, 4, optimizer=opt), TableSpec("C2", 30, 4, optimizer=opt),
                                      TableSpec("C3", 20, 8)), bottom_mlp=(8, 4), top_mlp=(8, 1))


def test_one_naive_plan_for_planner_executor_and_benchmarks():
    m = model("rowwise_adagrad")
    plan = naive_plan(m, 2, 32, "local-cpu", seed=3)
    assert plan.to_dict() == {**baseline_plan("naive", m, 2, 32).to_dict(), "hardware": "local-cpu", "seed": 3}
    assert [(p.sharding, p.ranks) for p in plan.packs] == [("table_wise", [0]), ("table_wise", [1]),
                                                           ("table_wise", [0])]
    assert plan.optimizer.sparse == "rowwise_adagrad"  # the model's optimizer, whoever builds it
    root = Path(__file__).resolve().parents[1]
    for gone in ("planner/baselines.py", "executor/plans.py", "picasso/workflows/sweep.py"):
        assert not (root / gone).exists(), gone


def test_random_plans_are_valid_and_seeded():
    a, ida = random_plan(model(), 2, 16, np.random.default_rng(4))
    b, idb = random_plan(model(), 2, 16, np.random.default_rng(4))
    a.validate()
    assert a.to_dict() == b.to_dict() and ida.keys() == idb.keys()
