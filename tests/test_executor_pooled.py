"""The pooled exchange (PackPlan.exchange "pooled") trains the same weights as the reference.

Owners pool their part of every bag and return partial sums; the requester adds its hot
part (exact for sum; mean bags divided by their whole length). Every pooled sharding, hot
rows synchronised densely and sparsely, mean pooling, host placement, micro-batches with
interleaving, row-wise Adagrad, and a plan mixing rows and pooled packs, at 2 and 4 ranks.
"""

from __future__ import annotations

import numpy as np
import pytest

from planner.errors import PlanError
from planner.model_spec import ModelSpec, TableSpec
from planner.plan import OptimizerPlan, PackPlan, Plan
from tests.equivalence_cases import assert_shared_cases_match, shared_cases

TOL = 1e-5
SGD = OptimizerPlan("sgd", 0.5, "sgd", 0.1)
ADAGRAD = OptimizerPlan("rowwise_adagrad", 0.1, "adagrad", 0.05, eps=1e-4)


def model(pooling: str = "sum") -> ModelSpec:
    t = [TableSpec("C1", 40, 8, pooling=pooling, pooling_factor=4.0), TableSpec("C2", 300, 8, pooling=pooling),
         TableSpec("C3", 1000, 8, pooling=pooling, pooling_factor=6.0), TableSpec("C4", 7, 8, pooling=pooling),
         TableSpec("C5", 120, 8, pooling=pooling, pooling_factor=3.0)]
    return ModelSpec("tiny-multihot", "dlrm", 13, tuple(t), bottom_mlp=(16, 8), top_mlp=(16, 1))


HOT = {"C2": np.arange(30) * 7 % 300, "C3": np.arange(200) * 3, "C5": np.arange(20)}


def pooled_plan(world: int, pooling: str = "sum", *, hot_sync: str = "dense", placement: str = "hbm",
                k: int = 1, ki: bool = False, opt: OptimizerPlan = SGD, mixed: bool = False) -> Plan:
    last = world - 1
    packs = [PackPlan("a", ["C1", "C2"], "row_wise", ranks=[last, 0], hot_sync=hot_sync, placement=placement,
                      exchange="pooled"),
             PackPlan("b", ["C3"], "row_wise", exchange="pooled", hot_sync=hot_sync),
             PackPlan("c", ["C4"], "table_wise", ranks=[last], exchange="pooled"),
             PackPlan("d", ["C5"], "table_wise" if mixed else "table_row_wise",
                      ranks=[0] if mixed else list(range(min(2, world))), exchange="rows" if mixed else "pooled")]
    if mixed:
        packs[1] = PackPlan("b", ["C3"], "column_wise")
    hot = {"C2": 30, "C3": 200, "C5": 20}
    return Plan(model(pooling), world, 16, packs, hot_rows=hot, hot_ids_file="hot.npz", micro_batches=k,
                kernel_interleaving=ki, optimizer=opt)


def cases(world: int) -> list:
    plans = [pooled_plan(world), pooled_plan(world, "mean", hot_sync="sparse", opt=ADAGRAD),
             pooled_plan(world, k=2, ki=True, placement="host"), pooled_plan(world, k=4, opt=ADAGRAD, mixed=True)]
    return [(p.to_dict(), HOT, i, 2) for i, p in enumerate(plans)]


SHARED = {w: shared_cases(__name__, w, cases(w)) for w in (2, 4)}


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_pooled_plans_match_reference(world, shared_ranks):
    assert_shared_cases_match(shared_ranks, SHARED[world], TOL,
                              lambda d: [(p["name"], p["sharding"], p["exchange"]) for p in d["packs"]])


def test_pooled_refused_where_it_cannot_run():
    m = model()
    for pack, why in ((PackPlan("a", ["C1"], "column_wise", exchange="pooled"), "column_wise"),
                      (PackPlan("a", ["C1"], "replicated", exchange="pooled"), "replicated")):
        packs = [pack] + [PackPlan(t, [t]) for t in ("C2", "C3", "C4", "C5")]
        with pytest.raises(PlanError, match=f"exchange pooled needs sharding .* not {why}"):
            Plan(m, 2, 16, packs).validate()
    seq = ModelSpec("s", "din", 0, (TableSpec("user", 8, 8), TableSpec("item", 50, 8),
                                    TableSpec("hist", 50, 8, pooling="none", max_len=4)),
                    top_mlp=(8, 1), extra={"attention_mlp": [8], "query": {"hist": "item"}})
    packs = [PackPlan("u", ["user"]), PackPlan("i", ["item"]), PackPlan("h", ["hist"], exchange="pooled")]
    with pytest.raises(PlanError, match="hist has pooling none"):
        Plan(seq, 2, 16, packs).validate()
    with pytest.raises(PlanError, match="exchange"):
        Plan.from_dict({**Plan(m, 2, 16, [PackPlan("a", [t.name for t in m.tables])]).to_dict(),
                        "packs": [{"name": "a", "tables": ["C1", "C2", "C3", "C4", "C5"], "exchange": "owner"}]})


def test_old_plans_load_as_rows():
    m = model()
    d = Plan(m, 2, 16, [PackPlan("a", [t.name for t in m.tables])]).to_dict()
    del d["packs"][0]["exchange"]
    assert Plan.from_dict(d).packs[0].exchange == "rows"
