"""Gradient buckets (Plan.grad_bucket_mb): the dense gradients are all-reduced in buckets
launched during the last micro-batch's backward, on a process group of their own, as DDP
does; the last bucket travels with the hot rows' gradients after the packs' backward, on a
second group of its own.

The buckets sum the same gradients, so every plan trains the same weights as the reference
with them (rows and pooled exchanges, every sharding, hot rows, micro-batches, a cross
network with weights in the interaction stage, serial and overlapped steps) at 2 and 4 ranks.
The executor names and lanes the buckets as lowering does, and lowering takes their bytes
out of the step's one all-reduce.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from planner.errors import PlanError
from planner.plan import PackPlan, Plan
from simulator.measured import BUCKET_LANE, SYNC_LANE
from tests.equivalence_cases import assert_shared_cases_match, shared_cases
from tests.shared_ranks import shared_call
from tests.test_executor_equivalence import TOL, mixed_case, other_models
from tests.test_executor_pooled import ADAGRAD, HOT, pooled_plan

TINY = 1e-6  # MiB: every stage with weights is a bucket of its own


def bucketed(case: tuple, **kw) -> tuple:
    plan_d, *rest = case
    return ({**plan_d, "grad_bucket_mb": TINY, **kw}, *rest)


def dcn_plan(world: int, k: int = 2) -> Plan:
    # with a bottom MLP, so that the cross network's bucket is not the last one
    model = replace(next(m for m in other_models() if m.arch == "dcn"), bottom_mlp=(16, 8))
    packs = [PackPlan("a", ["C1"], "table_wise", ranks=[world - 1]), PackPlan("b", ["C2", "C3"], "row_wise")]
    return Plan(model, world, 16, packs, hot_rows={"C2": 40}, hot_ids_file="hot.npz", micro_batches=k,
                kernel_interleaving=k > 1, optimizer=ADAGRAD)


def cases(world: int) -> list:
    serial = mixed_case(world)
    serial = ({**serial[0], "micro_batches": 1, "kernel_interleaving": False}, *serial[1:])
    pooled = (pooled_plan(world, k=4, opt=ADAGRAD, mixed=True).to_dict(), HOT, 4, 3)
    return [bucketed(mixed_case(world)), bucketed(serial), bucketed(pooled, input_pipeline=True),
            bucketed((dcn_plan(world).to_dict(), {"C2": np.arange(40) * 3}, 5, 2)),
            bucketed((dcn_plan(world, k=1).to_dict(), {"C2": np.arange(40) * 3}, 6, 2))]


SHARED = {w: shared_cases(__name__, w, cases(w)) for w in (2, 4)}


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_bucketed_plans_match_reference(world, shared_ranks):
    assert_shared_cases_match(shared_ranks, SHARED[world], TOL,
                              lambda d: (d["model"]["name"], d["micro_batches"], d["kernel_interleaving"]))


def _timed_worker(rank: int, world: int, plan_d: dict) -> list[tuple[str, str]]:
    from executor.comm import Comm
    from executor.run.verify import local_rows, synthetic_global_batches
    from executor.step.timing import OpTimer
    from executor.step.trainer import Trainer

    plan = Plan.from_dict(plan_d)
    timer = OpTimer(rank, Comm().device, enabled=True, micro_batches=plan.micro_batches)
    tr = Trainer(plan, {"C2": np.arange(40) * 3}, Comm(), timer)
    tr.step(local_rows(synthetic_global_batches(plan, 1, seed=0)[0], plan, rank))
    return [(e[0], e[1]) for e in timer._open]


def _lowered(plan: Plan):
    from planner.access import table_access
    from planner.lowering import analyze, build_program
    from simulator.hardware import load_hardware

    hw = load_hardware("local-cpu", [f"gpus_per_node={plan.world_size}"])
    packs, _, dense = analyze(plan, hw, table_access(plan.model))
    return {op.name: op for op in build_program(plan, packs, dense, hw)}, dense


TIMED = shared_call(__name__, 2, _timed_worker, replace(dcn_plan(2), grad_bucket_mb=TINY).to_dict())


@pytest.mark.dist
def test_the_executor_runs_lowerings_buckets_on_their_own_lane(shared_ranks):
    plan = replace(dcn_plan(2), grad_bucket_mb=TINY)
    seen = shared_ranks(TIMED)[0]
    ops, _ = _lowered(plan)
    predicted = {(n, op.lane) for n, op in ops.items() if n.startswith("bwd/dense/allreduce")}
    measured = {(n, lane) for n, lane in seen if n.startswith("bwd/dense/allreduce")}
    assert measured == predicted == {("bwd/dense/allreduce_top_mlp", BUCKET_LANE),
                                     ("bwd/dense/allreduce_interaction", BUCKET_LANE), ("bwd/dense/allreduce", SYNC_LANE)}


def test_lowering_launches_the_buckets_during_the_last_backward_and_leaves_the_rest():
    base = dcn_plan(4)
    before, dense = _lowered(base)
    ops, _ = _lowered(replace(base, grad_bucket_mb=TINY))
    top, inter = ops["bwd/dense/allreduce_top_mlp"], ops["bwd/dense/allreduce_interaction"]
    assert top.deps == ["bwd/dense/top_mlp@mb1"] and inter.deps == ["bwd/dense/interaction@mb1"]
    assert top.lane == inter.lane == BUCKET_LANE
    d = dense.ops
    assert top.collective[1] == pytest.approx(d["top_mlp"].params * 4)
    assert inter.collective[1] == pytest.approx(d["interaction"].params * 4)
    # the step's one all-reduce keeps the bottom MLP's and the hot rows' gradients, on a process
    # group of its own: it queues neither behind the packs' gradient exchange nor the buckets
    moved = (d["top_mlp"].params + d["interaction"].params) * 4
    assert ops["bwd/dense/allreduce"].collective[1] == pytest.approx(before["bwd/dense/allreduce"].collective[1] - moved)
    assert ops["bwd/dense/allreduce"].lane == SYNC_LANE and before["bwd/dense/allreduce"].lane == "comm"
    assert {top.name, inter.name} <= set(ops["opt/dense/update"].deps)
    # a dense model under the cap is one bucket: only the step's all-reduce moves to its group
    same, _ = _lowered(replace(base, grad_bucket_mb=25.0))
    assert set(same) == set(before) and same["bwd/dense/allreduce"].lane == SYNC_LANE


def test_buckets_never_predict_a_slower_step_on_a_gpu_cluster():
    from planner.access import table_access
    from planner.presets import get_model
    from planner.search import evaluate, full_symmetry, search
    from simulator.hardware import load_hardware

    hw = load_hardware("dgx-h100", ["nodes=4", "nic_per=node"])
    model = get_model("dlrm-dcnv2")
    acc = table_access(model)
    plan = search(model, hw, None, 4096, access=acc, time_budget_s=30).plan
    a = evaluate(replace(plan, grad_bucket_mb=0.0), hw, acc, "simpy", full_symmetry(plan), "off").iteration_us
    b = evaluate(replace(plan, grad_bucket_mb=25.0), hw, acc, "simpy", full_symmetry(plan), "on").iteration_us
    assert b < a, (a, b)


def test_plan_field_round_trips_and_is_checked():
    plan = replace(pooled_plan(2), grad_bucket_mb=25.0)
    assert Plan.from_dict(plan.to_dict()).grad_bucket_mb == 25.0
    assert Plan.from_dict(pooled_plan(2).to_dict()).grad_bucket_mb == 0.0
    assert not replace(plan, world_size=1, packs=[PackPlan("a", list(plan.model.table_names))]).buckets_grads
    for bad in ("25", -1.0, float("nan")):
        with pytest.raises(PlanError, match="grad_bucket_mb"):
            Plan.from_dict({**plan.to_dict(), "grad_bucket_mb": bad})
