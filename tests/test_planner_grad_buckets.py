"""Lowering: the dense gradients' all-reduce in buckets, each after its stage's last backward."""

from __future__ import annotations

import pytest

from planner import op_names as on
from planner.lowering import lower
from planner.plan import PackPlan, Plan
from planner.presets import get_model
from planner.program_ops import GRAD_LANE
from simulator.engine import simulate
from simulator.hardware import load_hardware

DENSE = "bwd/dense/allreduce_dense"


def _plan(model: str = "dlrm-criteo-kaggle", **kw) -> Plan:
    m = get_model(model)
    kw.setdefault("packs", [PackPlan("pack0", m.table_names)])
    return Plan(model=m, world_size=8, batch_size_per_rank=2048, **kw)


@pytest.mark.parametrize("exchange", ["per_pack", "torchrec"])
def test_the_bucket_waits_for_the_last_dense_backward_and_the_update_for_it(exchange):
    plan = _plan(micro_batches=2, kernel_interleaving=True)
    plan.exchange = exchange
    lo = lower(plan, load_hardware("dgx-h100"))
    names = [o.name for o in lo.ops]
    bucket = lo.op(DENSE)
    assert bucket.deps == ["bwd/dense/bottom_mlp@mb1"]
    assert bucket.collective == ("all_reduce", pytest.approx(lo.dense.params * 4))
    assert "bwd/dense/allreduce" not in names  # no hot rows, no data-parallel tables: nothing left for it
    assert lo.op("opt/dense/update").deps == [DENSE]
    # issued where the executor launches it, before the last micro-batch's gradient exchange: in
    # picasso's program on a lane of its own (its own process group); in TorchRec's on the comm
    # lane, where DDP's all-reduce and the exchange queue behind each other
    assert names.index(DENSE) < names.index("bwd/pack0/a2a_grad@mb1")
    assert bucket.lane == ("comm" if exchange == "torchrec" else GRAD_LANE)


def test_hot_rows_keep_the_last_all_reduce_after_the_packs_backward():
    lo = lower(_plan(micro_batches=2, hot_rows={"C3": 100}, hot_ids_file="x"), load_hardware("dgx-h100"))
    ar = lo.op("bwd/dense/allreduce")
    assert ar.collective[1] == pytest.approx(100 * 16 * 4)
    assert "bwd/pack0/pool@mb1" in ar.deps and DENSE not in ar.deps  # another group: no order between them
    assert set(lo.op("opt/dense/update").deps) == {DENSE, "bwd/dense/allreduce"}


def test_a_serial_plan_runs_its_bucket_beside_the_packs_backward():
    hw = load_hardware("dgx-h100")
    lo = lower(_plan(), hw, symmetric=True)
    waited = {d for o in lo.ops for d in o.deps if o.name != "opt/dense/update"}
    assert DENSE not in waited  # off the serial chain: only the update waits
    res = simulate(lo.graph, hw, engine="simpy")
    ev = {e["name"]: e for e in res.timeline.to_dict()["events"] if e["rank"] == 0}
    # the dense gradients are on the wire while the packs' backward and update compute
    assert ev[DENSE]["start_us"] < ev["opt/pack0/cold_update"]["start_us"]


def test_each_layout_of_buckets_is_lowered_after_its_last_stage(monkeypatch):
    monkeypatch.setattr(on, "GRAD_BUCKETS", (("allreduce_top_mlp", ("top_mlp",)),
                                             ("allreduce_interaction", ("interaction", "bottom_mlp"))))
    lo = lower(_plan("dlrm-dcnv2", micro_batches=2), load_hardware("dgx-h100"))
    d = lo.dense.ops
    top, inter = lo.op("bwd/dense/allreduce_top_mlp"), lo.op("bwd/dense/allreduce_interaction")
    assert top.deps == ["bwd/dense/top_mlp@mb1"] and inter.deps == ["bwd/dense/bottom_mlp@mb1"]
    assert inter.collective[1] == pytest.approx((d["interaction"].params + d["bottom_mlp"].params) * 4)
    assert set(lo.op("opt/dense/update").deps) == {top.name, inter.name}
    names = [o.name for o in lo.ops]
    assert names.index(top.name) < names.index("bwd/dense/interaction@mb1") < names.index(inter.name)
    assert all(not n.startswith("bwd/dense/allreduce") or on.split_name(n)[3] is None for n in names)
