"""Lowering details that follow what the executor does (calibration findings)."""

import pytest

from planner.lowering import lower
from planner.plan import PackPlan, Plan
from planner.presets import get_model
from simulator.cost import op_busy
from simulator.hardware import load_hardware


def kaggle_plan(world: int = 8, **kw) -> Plan:
    m = get_model("dlrm-criteo-kaggle")
    return Plan(model=m, world_size=world, batch_size_per_rank=kw.pop("batch", 2048),
                packs=[PackPlan("pack0", m.table_names)], **kw)


def test_one_input_copy_per_step_carries_every_micro_batch():
    hw = load_hardware("dgx-h100")
    one, four = lower(kaggle_plan(), hw), lower(kaggle_plan(micro_batches=4), hw)
    inputs = [o for o in four.ops if o.name.startswith("fwd/input/")]
    assert [o.name for o in inputs] == ["fwd/input/h2d"]  # the executor times one copy per step
    assert inputs[0].demand["pcie_bytes"] == pytest.approx(one.op("fwd/input/h2d").demand["pcie_bytes"])
    # every micro-batch's first pack op and dense step wait for it
    for mb in range(4):
        assert "fwd/input/h2d" in four.op(f"fwd/pack0/dedup@mb{mb}").deps
        assert "fwd/input/h2d" in four.op(f"fwd/dense/bottom_mlp@mb{mb}").deps


def test_id_exchange_pays_for_the_counts_exchange_first():
    one_node = load_hardware("dgx-h100")
    lo = lower(kaggle_plan(), one_node)
    assert lo.op("fwd/pack0/a2a_ids").args["fixed_us"] == one_node.intra_latency_us
    two_nodes = load_hardware("dgx-h100", ["nodes=2"])
    lo2 = lower(kaggle_plan(world=16), two_nodes)
    assert lo2.op("fwd/pack0/a2a_ids").args["fixed_us"] == two_nodes.nic_latency_us


def test_dlrm_interaction_moves_its_features_and_is_memory_bound():
    hw = load_hardware("dgx-h100")
    lo = lower(kaggle_plan(), hw)
    m = lo.plan.model
    f, d = len(m.tables) + 1, m.tables[0].dim  # 27 fields of 16
    top_in = f * (f - 1) // 2 + m.bottom_mlp[-1]
    # stack (r+w F*D), bmm (r F*D, w F*F), tril gather (r F*F, w F(F-1)/2), cat (r+w top input)
    per_sample = 4 * (2 * f * d + f * d + 2 * f * f + f * (f - 1) / 2 + 2 * top_in)
    fwd, bwd = lo.op("fwd/dense/interaction"), lo.op("bwd/dense/interaction")
    assert fwd.demand["hbm_bytes"] == pytest.approx(2048 * per_sample)
    assert bwd.demand["hbm_bytes"] == pytest.approx(2 * 2048 * per_sample)
    attrs = next(a for _, a in lo.graph.ops() if a["name"] == "fwd/dense/interaction")
    busy = op_busy(attrs, hw)[2]
    assert busy[1] > busy[0]  # HBM time exceeds FLOP time: FLOPs alone underestimate it
