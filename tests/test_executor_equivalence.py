"""Any valid plan trains the same weights as the single-process reference (fp32, 1e-5 relative)."""

from __future__ import annotations

import numpy as np
import pytest

from executor.comm import Comm
from executor.run.verify import equivalence_worker, synthetic_global_batches, train_and_compare
from planner.builders import random_plan
from planner.model_spec import ModelSpec, TableSpec
from planner.plan import OptimizerPlan, PackPlan, Plan
from tests.shared_ranks import shared_call

TOL = 1e-5
# Adagrad's and Adam's first steps are lr * g / (|g| + eps): for gradient entries near eps
# an fp32 rounding difference of g (unavoidable: ranks and micro-batches sum in another
# order) moves the weight by up to lr * dg / eps. eps = 1e-4 keeps that below 1e-5 relative;
# with eps = 1e-8 single entries differ by ~4e-5 (measured), with SGD by ~1e-7.
OPTS = [
    OptimizerPlan("sgd", 0.5, "sgd", 0.1),
    OptimizerPlan("rowwise_adagrad", 0.1, "adagrad", 0.05, eps=1e-4),
    OptimizerPlan("rowwise_adagrad", 0.1, "adam", 0.01, eps=1e-4),
]


def dlrm_model(dim: int = 8) -> ModelSpec:
    rows = [40, 300, 1000, 7, 120]
    tables = [TableSpec(f"C{i + 1}", n, dim) for i, n in enumerate(rows)]
    tables[4] = TableSpec("C5", 120, dim, pooling_factor=3.0)  # multi-hot
    return ModelSpec("tiny-dlrm", "dlrm", 13, tuple(tables), bottom_mlp=(16, dim), top_mlp=(16, 1))


def other_models() -> list[ModelSpec]:
    t = lambda n, r, d=8, **kw: TableSpec(n, r, d, **kw)  # noqa: E731
    return [
        ModelSpec("tiny-deepfm", "deepfm", 13, (t("C1", 50), t("C2", 400), t("C3", 9, pooling="mean", pooling_factor=2.0)),
                  top_mlp=(16, 1), interaction="fm"),
        ModelSpec("tiny-dcn", "dcn", 13, (t("C1", 50, 4), t("C2", 400), t("C3", 30)), top_mlp=(16, 1),
                  extra={"cross_layers": 2}),
        ModelSpec("tiny-wd", "wide_deep", 13,
                  (t("C1", 60), t("C2", 300), t("W1", 60, 1, optimizer="rowwise_adagrad", initializer="zeros"),
                   t("W2", 300, 1, optimizer="rowwise_adagrad", initializer="zeros")),
                  top_mlp=(16, 1), extra={"wide_tables": ["W1", "W2"]}),
        ModelSpec("tiny-din", "din", 0,
                  (t("user", 80), t("item", 500), t("hist_item", 500, pooling="none", max_len=6),
                   t("hist_cate", 40, pooling="none", max_len=6), t("cate", 40)),
                  top_mlp=(16, 1), extra={"attention_mlp": [8], "query": {"hist_item": "item", "hist_cate": "cate"}}),
    ]


def check(res: dict) -> None:
    assert res["max_rel_diff"] < TOL, res
    assert res["reference_moved"] > 1e-3, res  # the weights moved, so the comparison means something


@pytest.mark.parametrize("model", [dlrm_model(), *other_models()], ids=lambda m: m.name)
def test_single_rank_any_plan_matches_reference(model):
    rng = np.random.default_rng(1)
    for i in range(3):
        plan, hot = random_plan(model, 1, 16, rng, micro_batches=[1, 2, 4][i], optimizer=OPTS[i])
        check(train_and_compare(plan, hot, synthetic_global_batches(plan, 3, seed=i), Comm()))


def test_wrong_plan_is_detected():
    """A trainer whose plan differs from the reference's (another seed) is caught."""
    model = dlrm_model()
    plan, hot = random_plan(model, 1, 16, np.random.default_rng(0), optimizer=OPTS[0])
    batches = synthetic_global_batches(plan, 2, seed=0)
    from executor.run.verify import compare
    from executor.step.trainer import Trainer

    tr = Trainer(plan, hot, Comm())
    for b in batches:
        tr.step(b)
    tr.plan = Plan.from_dict({**plan.to_dict(), "seed": 5, "hot_ids_file": plan.hot_ids_file})
    assert compare(tr, batches)["max_rel_diff"] > 1e-2


def dist_cases(world: int, n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    model = dlrm_model(dim=8)
    cases = []
    shardings = ["row_wise", "table_wise", "column_wise", "replicated", None]
    hots = ["none", "some", "all", None]
    for i in range(n):
        plan, hot = random_plan(
            model, world, 16, rng, packing=bool(i % 2), sharding=shardings[i % len(shardings)],
            micro_batches=[1, 2, 4][i % 3], hot=hots[i % len(hots)], optimizer=OPTS[i % 3],
        )
        cases.append((plan.to_dict(), hot, i, 2))
    return cases


def mixed_case(world: int) -> tuple:
    """Every sharding at once, rank subsets in odd orders, packing, hot rows, micro-batches."""
    model = dlrm_model()
    plan = Plan(
        model, world, 16,
        [PackPlan("a", ["C1", "C2"], "row_wise", ranks=[world - 1, 0]), PackPlan("b", ["C3"], "column_wise"),
         PackPlan("c", ["C4"], "replicated"), PackPlan("d", ["C5"], "table_wise", ranks=[world - 1])],
        hot_rows={"C2": 30, "C3": 500}, hot_ids_file="hot.npz", micro_batches=2, kernel_interleaving=True,
        optimizer=OPTS[2],
    )
    return (plan.to_dict(), {"C2": np.arange(30) * 7 % 300, "C3": np.arange(500) * 2}, 9, 2)


def arch_cases(world: int) -> list:
    rng = np.random.default_rng(7)
    cases = []
    for i, model in enumerate(other_models()):
        plan, hot = random_plan(model, world, 16, rng, micro_batches=2, optimizer=OPTS[i % 3])
        cases.append((plan.to_dict(), hot, i, 2))
    return cases


def dist_world_cases(world: int) -> list:
    cases = dist_cases(world, 6 if world == 2 else 4, seed=world) + [mixed_case(world)]
    return cases + arch_cases(world) if world == 2 else cases


SHARED = {w: shared_call(__name__, w, equivalence_worker, dist_world_cases(w)) for w in (2, 4)}


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_distributed_plans_match_reference(shared_ranks, world):
    cases, results = SHARED[world].args[0], shared_ranks(SHARED[world])[0]
    assert len(results) == len(cases)
    for (plan_d, _, _, _), res in zip(cases, results):
        assert res is not None
        assert res["max_rel_diff"] < TOL, (plan_d["model"]["arch"], plan_d["packs"], plan_d["micro_batches"], res)
        assert res["reference_moved"] > 1e-3, res
