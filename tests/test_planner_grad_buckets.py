"""Lowering: the dense gradients' all-reduce in buckets, each after its stage's last backward."""

from __future__ import annotations

import pytest

from planner import op_names as on
from planner.lowering import lower
from planner.plan import PackPlan, Plan
from planner.presets import get_model
from simulator.engine import simulate
from simulator.hardware import load_hardware

TOP, INTER = "bwd/dense/allreduce_top_mlp", "bwd/dense/allreduce_interaction"


def _plan(model: str = "dlrm-criteo-kaggle", **kw) -> Plan:
    m = get_model(model)
    kw.setdefault("packs", [PackPlan("pack0", m.table_names)])
    return Plan(model=m, world_size=8, batch_size_per_rank=2048, **kw)


@pytest.mark.parametrize("exchange", ["per_pack", "torchrec"])
def test_buckets_wait_for_the_last_micro_batch_and_the_update_for_every_bucket(exchange):
    plan = _plan(micro_batches=2, kernel_interleaving=True)
    plan.exchange = exchange
    lo = lower(plan, load_hardware("dgx-h100"))
    names = [o.name for o in lo.ops]
    top, inter = lo.op(TOP), lo.op(INTER)
    assert top.deps == ["bwd/dense/top_mlp@mb1"] and inter.deps == ["bwd/dense/bottom_mlp@mb1"]
    assert top.collective == ("all_reduce", pytest.approx(lo.dense.ops["top_mlp"].params * 4))
    assert top.collective[1] + inter.collective[1] == pytest.approx(lo.dense.params * 4)
    assert "bwd/dense/allreduce" not in names  # no hot rows, no data-parallel tables: nothing left for it
    assert set(lo.op("opt/dense/update").deps) == {TOP, INTER}
    # issued where the executor launches them: on the comm lane, before the last micro-batch's
    # gradient exchange, so that exchange queues behind them as it does in gloo
    assert names.index(TOP) < names.index("bwd/dense/interaction@mb1") < names.index(INTER)
    assert names.index(INTER) < names.index("bwd/pack0/a2a_grad@mb1")


def test_hot_rows_keep_the_last_all_reduce_after_the_buckets():
    lo = lower(_plan(micro_batches=2, hot_rows={"C3": 100}, hot_ids_file="x"), load_hardware("dgx-h100"))
    ar = lo.op("bwd/dense/allreduce")
    assert ar.collective[1] == pytest.approx(100 * 16 * 4)
    assert {TOP, INTER} <= set(ar.deps) and "bwd/pack0/pool@mb1" in ar.deps
    assert set(lo.op("opt/dense/update").deps) == {TOP, INTER, "bwd/dense/allreduce"}


def test_a_serial_plan_runs_its_buckets_beside_the_backward():
    hw = load_hardware("dgx-h100")
    lo = lower(_plan(), hw, symmetric=True)
    waited = {d for o in lo.ops for d in o.deps if o.name != "opt/dense/update"}
    assert TOP not in waited and INTER not in waited  # off the serial chain: only the update waits
    res = simulate(lo.graph, hw, engine="simpy")
    ev = {e["name"]: e for e in res.timeline.to_dict()["events"] if e["rank"] == 0}
    inter_bwd = ev["bwd/dense/interaction"]
    # the top MLP's gradients are on the wire while the interaction's backward computes
    assert ev[TOP]["start_us"] < inter_bwd["start_us"] + inter_bwd["dur_us"]


def test_dcn_interaction_parameters_get_their_own_bucket():
    lo = lower(_plan("dlrm-dcnv2"), load_hardware("dgx-h100"))
    inter = lo.op(INTER)
    d = lo.dense.ops
    assert inter.collective[1] == pytest.approx((d["interaction"].params + d["bottom_mlp"].params) * 4)
    assert d["interaction"].params > d["top_mlp"].params  # DCNv2's cross layers outweigh its top MLP
    assert all(not n.startswith("bwd/dense/allreduce") or on.split_name(n)[3] is None for n in (o.name for o in lo.ops))
