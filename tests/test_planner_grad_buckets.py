"""Lowering: TorchRec's plans all-reduce the dense gradients as DDP does, in buckets during the backward."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner import op_names as on
from planner.dense import DenseCost, DenseOp
from planner.grad_buckets import grad_buckets as ddp_buckets
from planner.lowering import lower
from planner.plan import PackPlan, Plan
from planner.presets import get_model
from simulator.engine import simulate
from simulator.hardware import load_hardware

DENSE = "bwd/dense/allreduce_dense"


def _plan(model: str = "dlrm-criteo-kaggle", exchange: str = "torchrec", **kw) -> Plan:
    m = get_model(model)
    kw.setdefault("packs", [PackPlan("pack0", m.table_names)])
    plan = Plan(model=m, world_size=8, batch_size_per_rank=2048, **kw)
    plan.exchange = exchange  # scored as TorchRec runs it: its DDP overlaps the dense all-reduce
    return plan


def test_torchrec_ddp_bucket_waits_for_the_last_dense_backward_and_the_update_for_it():
    lo = lower(_plan(micro_batches=2, kernel_interleaving=True), load_hardware("dgx-h100"))
    names = [o.name for o in lo.ops]
    bucket = lo.op(DENSE)
    assert bucket.deps == ["bwd/dense/bottom_mlp@mb1"] and bucket.lane == "comm"
    assert bucket.collective == ("all_reduce", pytest.approx(lo.dense.params * 4))
    assert "bwd/dense/allreduce" not in names  # no data-parallel table: nothing left for it
    assert lo.op("opt/dense/update").deps == [DENSE]
    # issued where DDP launches it: after the last micro-batch's gradient exchange, which
    # autograd reaches before the bottom MLP that completes the bucket (one process group:
    # the comm lane keeps that order)
    assert names.index("bwd/pack0/a2a_grad@mb1") < names.index(DENSE)
    # picasso's own plans keep one all-reduce, of the dense and hot gradients, after the packs'
    # backward (bench/results/ab/cpu-2core-grad-buckets.json: why)
    lo = lower(_plan(exchange="per_pack", micro_batches=2, hot_rows={"C3": 100}, hot_ids_file="x"),
               load_hardware("dgx-h100"))
    assert DENSE not in [o.name for o in lo.ops]
    ar = lo.op("bwd/dense/allreduce")
    assert ar.collective[1] == pytest.approx(lo.dense.params * 4 + 100 * 16 * 4)
    assert "bwd/pack0/pool@mb1" in ar.deps and lo.op("opt/dense/update").deps == ["bwd/dense/allreduce"]


def test_torchrec_data_parallel_tables_travel_in_ddps_last_bucket():
    m = get_model("dlrm-criteo-kaggle")
    plan = _plan(packs=[PackPlan("tw", m.table_names[:13], "table_wise", [0]),
                        PackPlan("dp", m.table_names[13:], "replicated")])
    lo = lower(plan, load_hardware("dgx-h100"))
    # DDP holds the data-parallel tables with the dense weights: one bucket, no second all-reduce
    assert "bwd/dense/allreduce" not in [o.name for o in lo.ops]
    ar = lo.op(DENSE)
    assert "bwd/dp/pool" in ar.deps
    dp = sum(float(pv.rows * pv.row_bytes) for pv in lo.packs if pv.name == "dp")
    assert ar.collective[1] == pytest.approx(lo.dense.params * 4 + dp)
    assert DENSE in lo.op("opt/dense/update").deps and DENSE in lo.op("opt/dp/cold_update").deps


def test_a_serial_torchrec_plan_runs_its_bucket_beside_the_packs_backward():
    hw = load_hardware("dgx-h100")
    lo = lower(_plan(), hw, symmetric=True)
    waited = {d for o in lo.ops for d in o.deps if o.name != "opt/dense/update"}
    assert DENSE not in waited  # off the serial chain: only the update waits
    res = simulate(lo.graph, hw, engine="simpy")
    ev = {e["name"]: e for e in res.timeline.to_dict()["events"] if e["rank"] == 0}
    # the dense gradients are on the wire while the pack's backward and update compute
    cold = ev["opt/pack0/cold_update"]["start_us"]
    assert ev[DENSE]["start_us"] <= cold < ev[DENSE]["start_us"] + ev[DENSE]["dur_us"]


def test_ddps_cap_splits_a_large_dense_model_into_buckets_launched_during_the_backward():
    # DCNv2's 64 MB of dense weights overflow DDP's 25 MiB bucket: the top MLP's gradients go
    # while the cross network's backward computes, the cross network's before the packs' exchange
    lo = lower(_plan("dlrm-dcnv2", micro_batches=2), load_hardware("dgx-h100"))
    d = lo.dense.ops
    assert [n for n, _ in ddp_buckets(lo.dense)] == ["allreduce_top_mlp", "allreduce_interaction", "allreduce_dense"]
    top, inter = lo.op("bwd/dense/allreduce_top_mlp"), lo.op("bwd/dense/allreduce_interaction")
    last = lo.op(DENSE)
    assert top.deps == ["bwd/dense/top_mlp@mb1"] and inter.deps == ["bwd/dense/interaction@mb1"]
    assert last.deps == ["bwd/dense/bottom_mlp@mb1"]
    assert top.collective[1] == pytest.approx(d["top_mlp"].params * 4)
    assert inter.collective[1] == pytest.approx(d["interaction"].params * 4)
    assert {top.name, inter.name, DENSE} <= set(lo.op("opt/dense/update").deps)
    names = [o.name for o in lo.ops]
    assert names.index(top.name) < names.index("bwd/dense/interaction@mb1") < names.index(inter.name)
    assert names.index(inter.name) < names.index("bwd/pack0/a2a_grad@mb1") < names.index(DENSE)
    assert all(not n.startswith("bwd/dense/allreduce") or on.split_name(n)[3] is None for n in names)
    # a dense model under the cap stays one bucket (DLRM on Criteo Kaggle)
    assert [n for n, _ in ddp_buckets(lower(_plan(), load_hardware("dgx-h100")).dense)] == ["allreduce_dense"]


def test_ddp_buckets_close_before_the_cap_and_skip_stages_without_weights():
    def dense(**mb):
        return DenseCost({s: DenseOp(1.0, int(v * 2**20 / 4), 0.0) for s, v in mb.items()}, feature_width=1)
    assert ddp_buckets(dense(top_mlp=10, interaction=0, bottom_mlp=1)) == [("allreduce_dense", ("top_mlp", "bottom_mlp"))]
    assert ddp_buckets(dense(top_mlp=20, interaction=10, bottom_mlp=1)) == [
        ("allreduce_top_mlp", ("top_mlp",)), ("allreduce_dense", ("interaction", "bottom_mlp"))]
    assert ddp_buckets(dense(top_mlp=30, interaction=0, bottom_mlp=0)) == [("allreduce_dense", ("top_mlp",))]


def test_the_search_tries_smaller_buckets_and_keeps_them_when_faster():
    from planner.access import table_access
    from planner.search import evaluate, full_symmetry, search

    model = get_model("dlrm-criteo-kaggle")
    acc = table_access(model)
    # Kaggle's 1.85 MB dense part is one bucket at DDP's cap; at 1 MiB its top MLP's gradients
    # leave during the rest of the backward. Over 4 nodes on one EDR link each, the dense
    # all-reduce is long enough to be on the step's critical path: the smaller buckets win.
    hw = load_hardware("p2res-v100")
    res = search(model, hw, None, 1024, access=acc)
    assert any("buckets=1MiB" in e.label for e in res.candidates)
    assert res.plan.grad_bucket_mb == 1.0
    at_cap = evaluate(replace(res.plan, grad_bucket_mb=25.0), hw, acc, "simpy", full_symmetry(res.plan), "cap")
    assert res.best.iteration_us < at_cap.iteration_us
    # on one NVLink node the all-reduce hides behind the embedding backward (random rows,
    # sort, segment sums): smaller buckets gain nothing, and DDP's cap is kept
    hw = load_hardware("dgx-h100")
    res = search(model, hw, None, 4096, access=acc)
    assert any("buckets=1MiB" in e.label for e in res.candidates)
    at_1 = evaluate(replace(res.plan, grad_bucket_mb=1.0), hw, acc, "simpy", full_symmetry(res.plan), "1MiB")
    assert res.best.iteration_us <= at_1.iteration_us
    assert res.plan.grad_bucket_mb == 25.0
