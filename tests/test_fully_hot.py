"""A rows pack whose hot set holds every row (Plan.fully_hot) reads every lookup from its
replica: lowering gives it no all-to-all, the executor launches none, and training matches
the single-process reference."""

from __future__ import annotations

import numpy as np
import pytest

from planner.access import table_access
from planner.lowering import lower
from planner.plan import PackPlan, Plan
from simulator.hardware import load_hardware
from tests.equivalence_cases import assert_shared_cases_match, shared_cases
from tests.shared_ranks import shared_call
from tests.test_executor_equivalence import TOL
from tests.test_executor_pooled import ADAGRAD, SGD, model

HOT = {"C1": np.arange(40), "C2": np.arange(300)[::-1].copy(), "C3": np.arange(0, 1000, 5)}


def hot_plan(world: int, *, k: int = 1, ki: bool = False, opt=SGD, sync: str = "dense", piped: bool = False) -> Plan:
    m = model()
    packs = [PackPlan("full", ["C1", "C2"], "row_wise", hot_sync=sync), PackPlan("part", ["C3"], "row_wise"),
             PackPlan("rep", ["C4", "C5"], "replicated")]
    return Plan(m, world, 16, packs, hot_rows={"C1": 40, "C2": 300, "C3": 200}, hot_ids_file="hot.npz",
                micro_batches=k, kernel_interleaving=ki, optimizer=opt, input_pipeline=piped)


def test_the_rule():
    plan = hot_plan(2)
    assert [plan.fully_hot(p) for p in plan.packs] == [True, False, False]
    plan.hot_rows["C2"] = 299
    assert not plan.fully_hot(plan.packs[0])


def test_lowering_gives_a_fully_hot_pack_no_exchange():
    plan = hot_plan(2, k=2, ki=True)
    hw = load_hardware("local-cpu", ["nodes=1", "gpus_per_node=2"])
    lo = lower(plan, hw, access=table_access(plan.model))
    full = [o.name for o in lo.ops if "/full/" in o.name]
    part = [o.name for o in lo.ops if "/part/" in o.name]
    assert not [n for n in full if "a2a" in n], full
    assert "fwd/full/cold_gather@mb0" in full and lo.op("fwd/full/cold_gather@mb0").ranks is None
    assert [n for n in part if "a2a" in n]  # the other pack still exchanges


def _a2a_worker(rank: int, world: int, plan_d: dict, hot: dict) -> int:
    """All-to-alls with split sizes (ID, row and gradient exchanges) over two steps."""
    import torch.distributed as dist

    from executor.comm import Comm
    from executor.run.verify import local_rows, synthetic_global_batches
    from executor.step.trainer import Trainer

    calls = [0]
    real = dist.all_to_all_single

    def spy(out, inp, out_splits=None, in_splits=None, *a, **kw):
        calls[0] += out_splits is not None
        return real(out, inp, out_splits, in_splits, *a, **kw)

    dist.all_to_all_single = spy
    try:
        plan = Plan.from_dict(plan_d)
        tr = Trainer(plan, hot, Comm())
        for b in synthetic_global_batches(plan, 2, seed=0):
            tr.step(local_rows(b, plan, rank))
        tr.comm.barrier()
    finally:
        dist.all_to_all_single = real
    return calls[0]


def nothing_to_exchange() -> tuple[dict, dict]:
    """The fully hot pack and a replica: nothing to exchange (the plan, its hot IDs)."""
    plan = hot_plan(2)
    plan.packs = plan.packs[:1] + [PackPlan("rep", ["C3", "C4", "C5"], "replicated")]
    del plan.hot_rows["C3"]
    return plan.to_dict(), {t: v for t, v in HOT.items() if t != "C3"}


A2A = shared_call(__name__, 2, _a2a_worker, *nothing_to_exchange())


@pytest.mark.dist
def test_the_executor_launches_no_exchange_for_a_fully_hot_pack(shared_ranks):
    assert shared_ranks(A2A) == [0, 0]


def cases(world: int) -> list:
    plans = [hot_plan(world), hot_plan(world, k=2, ki=True, opt=ADAGRAD), hot_plan(world, opt=ADAGRAD, sync="sparse"),
             hot_plan(world, k=2, piped=True)]
    return [(p.to_dict(), HOT, 30 + i, 3) for i, p in enumerate(plans)]


SHARED = {w: shared_cases(__name__, w, cases(w)) for w in (2, 4)}


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_fully_hot_plans_match_reference(world, shared_ranks):
    assert_shared_cases_match(shared_ranks, SHARED[world], TOL,
                              lambda d: (d["micro_batches"], d["packs"][0]["hot_sync"]))
