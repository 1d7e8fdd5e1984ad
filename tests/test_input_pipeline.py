"""The input pipeline (Plan.input_pipeline): the next batch's IDs go to their owners during
this step, on a process group of their own (TorchRec's TrainPipelineSparseDist).

The IDs are data, so every plan trains the same weights as the reference with it: rows and
pooled exchanges, every sharding, hot rows synchronised densely and sparsely, replicated
packs, fused pooled groups, micro-batches, serial and overlapped steps, at 2 and 4 ranks.
A step given other rows than the ones whose IDs went ahead refuses. Lowering moves the ID
exchange off the step: its own lane, waited for by nothing.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from executor.spawn import run_ranks
from planner.errors import PlanError
from planner.plan import Plan
from tests.equivalence_cases import assert_cases_match
from tests.test_executor_equivalence import TOL, mixed_case
from tests.test_executor_fused_pooled import fused_plan
from tests.test_executor_pooled import ADAGRAD, HOT, pooled_plan


def piped(case: tuple) -> tuple:
    plan_d, *rest = case
    return ({**plan_d, "input_pipeline": True}, *rest)


def cases(world: int) -> list:
    plans = [pooled_plan(world), pooled_plan(world, "mean", hot_sync="sparse", opt=ADAGRAD),
             pooled_plan(world, k=4, opt=ADAGRAD, mixed=True), fused_plan(world, world // 2),
             fused_plan(world, world // 2, k=1, ki=True, hot_sync="sparse", mixed=True)]
    serial = mixed_case(world)  # every sharding; here as a serial step (1 micro-batch, no interleaving)
    serial = ({**serial[0], "micro_batches": 1, "kernel_interleaving": False}, *serial[1:])
    out = [piped(mixed_case(world)), piped(serial)]
    return out + [piped((p.to_dict(), HOT, 10 + i, 3)) for i, p in enumerate(plans)]


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_pipelined_plans_match_reference(world):
    assert_cases_match(world, cases(world), TOL,
                       lambda d: ([(p["name"], p["sharding"], p["exchange"]) for p in d["packs"]],
                                  d["micro_batches"], d["kernel_interleaving"]))


def _wrong_rows_worker(rank: int, world: int, plan_d: dict) -> str:
    from executor.comm import Comm
    from executor.trainer import Trainer
    from executor.verify import local_rows, synthetic_global_batches

    plan = Plan.from_dict(plan_d)
    batches = [local_rows(b, plan, rank) for b in synthetic_global_batches(plan, 3, seed=0)]
    tr = Trainer(plan, HOT, Comm())
    tr.step(batches[0], batches[1])  # batch 1's IDs go ahead
    try:
        tr.step(batches[2])
    except RuntimeError as e:
        return str(e)
    return "no error"


@pytest.mark.dist
def test_a_step_refuses_rows_other_than_those_sent_ahead():
    plan_d = {**pooled_plan(2).to_dict(), "input_pipeline": True}
    got = run_ranks(_wrong_rows_worker, 2, plan_d)
    assert all("not the ones whose IDs went ahead" in g for g in got), got


def test_plan_field_round_trips_and_is_checked():
    plan = replace(pooled_plan(2), input_pipeline=True)
    assert Plan.from_dict(plan.to_dict()).input_pipeline is True
    assert Plan.from_dict(pooled_plan(2).to_dict()).input_pipeline is False
    with pytest.raises(PlanError, match="input_pipeline"):
        Plan.from_dict({**plan.to_dict(), "input_pipeline": "yes"})


def _program(plan: Plan):
    from planner.access import table_access
    from planner.lowering import analyze, build_program
    from simulator.hardware import load_hardware

    hw = load_hardware("local-cpu", [f"gpus_per_node={plan.world_size}"])
    packs, _, dense = analyze(plan, hw, table_access(plan.model))
    return build_program(plan, packs, dense, hw)


@pytest.mark.parametrize("k,ki", [(1, False), (2, True)])
def test_lowering_moves_the_id_exchange_off_the_step(k, ki):
    base = pooled_plan(4, k=k, ki=ki, mixed=True)
    ops = {op.name: op for op in _program(replace(base, input_pipeline=True))}
    before = {op.name: op for op in _program(base)}
    ids = [n for n in ops if n.split("@")[0].endswith("/a2a_ids")]
    assert ids and set(ids) == {n for n in before if n.split("@")[0].endswith("/a2a_ids")}
    for n in ids:
        assert ops[n].lane == "input_dist" and ops[n].args.get("pipelined")
        assert ops[n].deps == []
        assert before[n].deps  # it waited for the lookups' routing before
    for op in ops.values():
        assert not set(op.deps) & set(ids), (op.name, op.deps)
    # what read the IDs waits for what the exchange waited for instead
    for n, op in before.items():
        for d in set(op.deps) & set(ids):
            assert set(before[d].deps) <= set(ops[n].deps), (n, ops[n].deps, before[d].deps)


def test_pipelining_never_predicts_a_slower_step():
    from planner.access import table_access
    from planner.search import evaluate
    from simulator.hardware import load_hardware

    hw = load_hardware("local-cpu", ["gpus_per_node=4"])
    for plan in (pooled_plan(4), pooled_plan(4, k=2, ki=True), fused_plan(4, 2)):
        access = table_access(plan.model)
        a = evaluate(plan, hw, access, "fast", True, "off").iteration_us
        b = evaluate(replace(plan, input_pipeline=True), hw, access, "fast", True, "on").iteration_us
        assert b <= a * (1 + 1e-9), (a, b)
        assert np.isfinite(b)
