"""The input pipeline (Plan.input_pipeline): the next batch's IDs go to their owners during
this step, on a process group of their own (TorchRec's TrainPipelineSparseDist).

The IDs are data, so every plan trains the same weights as the reference with it: rows and
pooled exchanges, every sharding, hot rows synchronised densely and sparsely, replicated
packs, fused pooled groups, micro-batches, serial and overlapped steps, at 2 and 4 ranks.
A step given other rows than the ones whose IDs went ahead refuses. Lowering moves the next
step's routing and ID exchange where the executor runs them: the routing after the step's
gathers, the IDs on their own lane after the step's last pooling, waited for by nothing.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from executor.process.spawn import run_ranks
from planner.errors import PlanError
from planner.plan import Plan
from tests.equivalence_cases import assert_shared_cases_match, shared_cases
from tests.shared_ranks import shared_call
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
    # the next step's IDs sent after an earlier micro-batch's pooling (Plan.ids_after_mb)
    early = ({**pooled_plan(world, k=4, opt=ADAGRAD, mixed=True).to_dict(), "ids_after_mb": 1}, HOT, 20, 3)
    return out + [piped((p.to_dict(), HOT, 10 + i, 3)) for i, p in enumerate(plans)] + [piped(early)]


SHARED = {w: shared_cases(__name__, w, cases(w)) for w in (2, 4)}


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_pipelined_plans_match_reference(world, shared_ranks):
    assert_shared_cases_match(shared_ranks, SHARED[world], TOL,
                              lambda d: ([(p["name"], p["sharding"], p["exchange"]) for p in d["packs"]],
                                         d["micro_batches"], d["kernel_interleaving"]))


def _wrong_rows_worker(rank: int, world: int, plan_d: dict) -> str:
    from executor.comm import Comm
    from executor.run.verify import local_rows, synthetic_global_batches
    from executor.step.trainer import Trainer

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


def _ordered_worker(rank: int, world: int, plan_d: dict) -> list[tuple[str, str, float, float]]:
    from executor.comm import Comm
    from executor.run.verify import local_rows, synthetic_global_batches
    from executor.step.timing import OpTimer
    from executor.step.trainer import Trainer

    plan = Plan.from_dict(plan_d)
    batches = [local_rows(b, plan, rank) for b in synthetic_global_batches(plan, 3, seed=0)]
    timer = OpTimer(rank, Comm().device, enabled=True, micro_batches=plan.micro_batches)
    tr = Trainer(plan, HOT, Comm(), timer)
    tr.step(batches[0], batches[1])
    timer._open = []  # the second step: its own lookups went ahead, the third's go during it
    tr.step(batches[1], batches[2])
    tr.comm.barrier()
    events = []
    for name, lane, a, b in timer._open:
        b = timer._completed(b) if isinstance(b, list) else b
        events.append((name, lane, a, b))
    return events


ORDERED = {(k, ki): shared_call(__name__, 2, _ordered_worker,
                                {**pooled_plan(2, k=k, ki=ki, mixed=True).to_dict(), "input_pipeline": True})
           for k, ki in [(1, False), (2, True)]}


@pytest.mark.dist
@pytest.mark.parametrize("k,ki", [(1, False), (2, True)])
def test_the_executor_routes_ahead_after_the_gathers_and_sends_ids_after_the_last_pooling(k, ki, shared_ranks):
    events = shared_ranks(ORDERED[k, ki])[0]
    fwd = [e for e in events if e[0].startswith("fwd/")]

    def op(e):
        return e[0].split("@")[0].rsplit("/", 1)[1]

    routing = [e for e in fwd if op(e) in ("dedup", "bags", "route")]
    ids = [e for e in fwd if op(e) == "a2a_ids"]
    pools = [e for e in fwd if op(e) == "pool"]
    last_pools = [e for e in pools if e[0].endswith(f"@mb{k - 1}")] if k > 1 else pools
    assert routing and ids and pools
    assert all(e[1] == "input_dist" for e in ids), ids
    # the next step's routing runs before the step's first pooling, its IDs after the last
    assert max(e[3] for e in routing) <= min(e[2] for e in pools)
    assert min(e[2] for e in ids) >= max(e[3] for e in last_pools)


def test_plan_field_round_trips_and_is_checked():
    plan = replace(pooled_plan(2), input_pipeline=True)
    assert Plan.from_dict(plan.to_dict()).input_pipeline is True
    assert Plan.from_dict(pooled_plan(2).to_dict()).input_pipeline is False
    with pytest.raises(PlanError, match="input_pipeline"):
        Plan.from_dict({**plan.to_dict(), "input_pipeline": "yes"})


def test_ids_after_mb_round_trips_and_must_name_a_micro_batch():
    plan = replace(pooled_plan(2, k=4, ki=True), input_pipeline=True, ids_after_mb=1)
    assert Plan.from_dict(plan.to_dict()).ids_launch_mb == 1
    assert replace(plan, ids_after_mb=None).ids_launch_mb == 3
    for bad in (4, -1):
        with pytest.raises(PlanError, match="ids_after_mb"):
            Plan.from_dict({**plan.to_dict(), "ids_after_mb": bad})


def test_lowering_sends_the_ids_after_the_chosen_micro_batch():
    base = replace(pooled_plan(4, k=4, ki=True, mixed=True), input_pipeline=True)
    for mb in (0, 2):
        ops = {op.name: op for op in _program(replace(base, ids_after_mb=mb))}
        ids = [n for n in ops if n.split("@")[0].endswith("/a2a_ids")]
        pools = {d for n in ids for d in ops[n].deps if d.split("@")[0].endswith("/pool")}
        assert pools and all(p.endswith(f"@mb{mb}") for p in pools), pools


def _program(plan: Plan):
    from planner.access import table_access
    from planner.lowering import analyze, build_program
    from simulator.hardware import load_hardware

    hw = load_hardware("local-cpu", [f"gpus_per_node={plan.world_size}"])
    packs, _, dense = analyze(plan, hw, table_access(plan.model))
    return build_program(plan, packs, dense, hw)


@pytest.mark.parametrize("k,ki", [(1, False), (2, True)])
def test_lowering_moves_the_next_steps_routing_and_ids_where_the_executor_runs_them(k, ki):
    base = pooled_plan(4, k=k, ki=ki, mixed=True)
    program = _program(replace(base, input_pipeline=True))
    ops = {op.name: op for op in program}
    order = {op.name: i for i, op in enumerate(program)}
    before = {op.name: op for op in _program(base)}
    ids = [n for n in ops if n.split("@")[0].endswith("/a2a_ids")]
    routing = [n for n in ops if n.startswith("fwd/") and n.split("@")[0].rsplit("/", 1)[1] in ("dedup", "bags", "route")]
    assert ids and routing and set(ids) == {n for n in before if n.split("@")[0].endswith("/a2a_ids")}
    moved = set(ids) | set(routing)
    fwd_pools = [n for n in ops if n.startswith("fwd/") and n.split("@")[0].endswith("/pool")]
    last_pools = [n for n in fwd_pools if n.endswith(f"@mb{k - 1}")] if k > 1 else fwd_pools
    gathers = [n for n in ops if n.split("@")[0].endswith("/cold_gather") and n.startswith("fwd/")]
    for n in routing:  # the next step's routing: after the step's gathers, before its first pooling
        prev = program[order[n] - 1].name  # a serial step chains every op to the one issued before
        assert set(ops[n].deps) <= set(routing) | {prev}, (n, ops[n].deps)
        assert max(order[g] for g in gathers) < order[n] < min(order[p] for p in fwd_pools)
    for n in ids:  # its IDs: once the routing is done and the step's own rows are pooled
        assert ops[n].lane == "input_dist" and ops[n].args.get("pipelined")
        assert set(ops[n].deps) - set(routing) == set(last_pools), (n, ops[n].deps)
        assert set(ops[n].deps) & set(routing)
        assert before[n].deps  # it waited for the lookups' routing before
    for i, op in enumerate(program):  # (but for a serial step's chain to the op issued before)
        if op.name not in moved:
            assert not set(op.deps) & moved - {program[i - 1].name}, (op.name, op.deps)
    # what read a moved op waits for what that op waited for instead
    for n, op in before.items():
        if n in moved:
            continue
        for d in set(op.deps) & moved:
            stays = {x for x in before[d].deps if x not in moved}
            assert stays <= set(ops[n].deps), (n, ops[n].deps, before[d].deps)


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
