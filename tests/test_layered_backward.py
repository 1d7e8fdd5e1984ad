"""The backward layer by layer over the micro-batches (Plan.backward_by_layer).

Micro-batch by micro-batch, a dense gradient is final only after the last micro-batch's
backward, so with several micro-batches every bucket's all-reduce waited for the end of the
backward. Layer by layer (every micro-batch's top MLP, then each one's interaction, gradient
exchange and bottom MLP), the top MLP's buckets go while the rest of the backward runs.

- Every parameter adds the micro-batches in the same order, so every plan trains the same
  weights as the reference (rows, pooled and fused pooled exchanges, every sharding, hot rows,
  buckets, the input pipeline, DCN, DeepFM and DIN) at 2 and 4 ranks.
- The executor issues the backward in lowering's order, and lowering launches the top MLP's
  buckets before the first interaction backward.
- The search takes it where it pays: DLRM-DCNv2 on 4 x 8 H100 with 400 Gb/s per node.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from planner.errors import PlanError
from planner.plan import PackPlan, Plan
from simulator.measured import BUCKET_LANE
from tests.equivalence_cases import assert_shared_cases_match, shared_cases
from tests.shared_ranks import shared_call
from tests.test_executor_equivalence import TOL, mixed_case, other_models
from tests.test_executor_fused_pooled import fused_plan
from tests.test_executor_grad_buckets import TINY, _lowered, dcn_plan
from tests.test_executor_pooled import ADAGRAD, HOT, pooled_plan

DCN_HOT = {"C2": np.arange(40) * 3}


def layered(case: tuple, **kw) -> tuple:
    plan_d, *rest = case
    return ({**plan_d, "backward_by_layer": True, **kw}, *rest)


def cases(world: int) -> list:
    pooled = (pooled_plan(world, k=4, opt=ADAGRAD, mixed=True).to_dict(), HOT, 4, 3)
    out = [layered(mixed_case(world), grad_bucket_mb=TINY), layered(pooled, input_pipeline=True, ids_after_mb=1),
           layered((dcn_plan(world, k=4).to_dict(), DCN_HOT, 5, 2), grad_bucket_mb=TINY),
           layered((fused_plan(world, world // 2, k=2, hot_sync="sparse", mixed=True).to_dict(), HOT, 6, 2))]
    if world == 2:  # the other architectures: an FM interaction without weights, attention over sequences
        for i, m in enumerate(x for x in other_models() if x.arch in ("deepfm", "din")):
            plan = Plan(m, world, 16, [PackPlan(t.name, [t.name]) for t in m.tables],
                        micro_batches=2, optimizer=ADAGRAD, backward_by_layer=True, grad_bucket_mb=TINY)
            out.append((plan.to_dict(), {}, 7 + i, 2))
    return out


SHARED = {w: shared_cases(__name__, w, cases(w)) for w in (2, 4)}


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_layered_plans_match_reference(world, shared_ranks):
    assert_shared_cases_match(shared_ranks, SHARED[world], TOL,
                              lambda d: (d["model"]["name"], [(p["name"], p["sharding"]) for p in d["packs"]],
                                         d["micro_batches"]))


def _issued_worker(rank: int, world: int, plan_d: dict) -> list[tuple[str, str]]:
    from executor.comm import Comm
    from executor.run.verify import local_rows, synthetic_global_batches
    from executor.step.timing import OpTimer
    from executor.step.trainer import Trainer

    plan = Plan.from_dict(plan_d)
    timer = OpTimer(rank, Comm().device, enabled=True, micro_batches=plan.micro_batches)
    tr = Trainer(plan, DCN_HOT, Comm(), timer)
    tr.step(local_rows(synthetic_global_batches(plan, 1, seed=0)[0], plan, rank))
    return [(e[0], e[1]) for e in timer._open]


def _backward(names) -> list[str]:
    return [n for n in names if n.startswith("bwd/")]


def layer_by_layer_plan() -> Plan:
    return replace(dcn_plan(2, k=4), grad_bucket_mb=TINY, backward_by_layer=True)


ISSUED = shared_call(__name__, 2, _issued_worker, layer_by_layer_plan().to_dict())


@pytest.mark.dist
def test_the_executor_runs_the_backward_in_lowerings_order(shared_ranks):
    plan = layer_by_layer_plan()
    issued = shared_ranks(ISSUED)[0]
    ops, _ = _lowered(plan)
    measured = [n for n, _ in issued]
    computed = [n for n, lane in issued if lane == "compute"]
    assert _backward(computed) == _backward(n for n in ops if n in set(computed))
    # layer by layer: every top MLP before the first interaction, whose bucket follows the last
    at = measured.index
    assert at("bwd/dense/top_mlp@mb3") < at("bwd/dense/allreduce_top_mlp") < at("bwd/dense/interaction@mb0")
    assert at("bwd/dense/interaction@mb3") < at("bwd/dense/allreduce_interaction") < at("bwd/b/pool@mb3")


def test_lowering_sends_the_top_mlps_buckets_while_the_interactions_backward_runs():
    base = replace(dcn_plan(4, k=4), grad_bucket_mb=TINY)
    by_mb, _ = _lowered(base)
    ops, _ = _lowered(replace(base, backward_by_layer=True))
    assert set(ops) == set(by_mb)  # the same ops, issued in another order
    names = list(ops)
    top = ops["bwd/dense/allreduce_top_mlp"]
    assert top.deps == ["bwd/dense/top_mlp@mb3"] and top.lane == BUCKET_LANE
    assert names.index(top.name) < names.index("bwd/dense/interaction@mb0")
    assert max(names.index(f"bwd/dense/top_mlp@mb{i}") for i in range(4)) < names.index("bwd/dense/interaction@mb0")
    # micro-batch by micro-batch it waited for the last micro-batch's whole backward
    old = list(by_mb)
    assert old.index("bwd/dense/allreduce_top_mlp") > old.index("bwd/dense/interaction@mb2")


def test_memory_holds_every_micro_batchs_activations():
    from planner.access import table_access
    from planner.lowering import analyze
    from simulator.hardware import load_hardware

    plan = replace(dcn_plan(2, k=4), grad_bucket_mb=TINY)
    hw = load_hardware("local-cpu", ["gpus_per_node=2"])
    acts = [analyze(p, hw, table_access(p.model))[1].hbm["activations"][0]
            for p in (plan, replace(plan, backward_by_layer=True), replace(plan, micro_batches=1))]
    assert acts[1] > acts[0] and acts[1] == pytest.approx(acts[2])


def test_plan_field_round_trips_and_is_checked():
    plan = replace(dcn_plan(2, k=2), backward_by_layer=True)
    assert Plan.from_dict(plan.to_dict()).backward_by_layer
    assert not Plan.from_dict({k: v for k, v in plan.to_dict().items() if k != "backward_by_layer"}).backward_by_layer
    assert not replace(plan, micro_batches=1).layered_backward  # one micro-batch has no other order
    with pytest.raises(PlanError, match="backward_by_layer"):
        Plan.from_dict({**plan.to_dict(), "backward_by_layer": "yes"})


def test_the_search_takes_it_for_dcnv2_on_four_nodes():
    from planner.access import table_access
    from planner.presets import get_model
    from planner.search import evaluate, full_symmetry, search
    from simulator.hardware import load_hardware

    hw = load_hardware("dgx-h100", ["nodes=4", "nic_per=node"])
    model = get_model("dlrm-dcnv2")
    acc = table_access(model)
    res = search(model, hw, None, 4096, access=acc, time_budget_s=30)
    assert res.plan.backward_by_layer and res.plan.micro_batches > 1, res.best.label
    flat = replace(res.plan, backward_by_layer=False)
    by_mb = evaluate(flat, hw, acc, "simpy", full_symmetry(flat), "by micro-batch").iteration_us
    # with kernel gaps, skinny-GEMM rates and the elementwise passes priced (GPU presets' perf)
    # the step is compute-heavier (15.8 ms at 4 micro-batches against 9.9 ms at 8 before) and
    # the layered order gains less than 1%, where it had gained 10%: still the faster one
    assert res.best.iteration_us < by_mb, (res.best.iteration_us, by_mb)


def test_its_variants_never_crowd_a_better_plan_out_of_the_final_simulation(monkeypatch):
    """Layered twins ranked first by the fast evaluator had pushed DCNv2's best plan on 16 x 8
    out of the discrete-event re-simulation (7925.7 -> 7944.7 us): the search with the stage
    must do at least as well as without it."""
    import planner.search as search_mod
    from planner.access import table_access
    from planner.presets import get_model
    from simulator.hardware import load_hardware

    hw = load_hardware("dgx-h100", ["nodes=16"])
    model = get_model("dlrm-dcnv2")
    acc = table_access(model)
    with_stage = search_mod.search(model, hw, None, 4096, access=acc, time_budget_s=30).best.iteration_us
    monkeypatch.setattr(search_mod, "STAGES", tuple(s for s in search_mod.STAGES if s is not search_mod.layer_stage))
    without = search_mod.search(model, hw, None, 4096, access=acc, time_budget_s=30).best.iteration_us
    assert with_stage <= without + 1e-6, (with_stage, without)
