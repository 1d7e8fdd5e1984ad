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
    # the executor times one h2d per step (split and zeroed buffers); the copy of a batch ahead
    # runs on a stream of its own (executor.data.batches.DeviceFeeder), waited for by nothing
    assert [o.name for o in inputs] == ["fwd/input/h2d", "fwd/input/h2d_next"]
    nxt = four.op("fwd/input/h2d_next")
    assert nxt.demand["pcie_bytes"] > 0
    assert nxt.demand["pcie_bytes"] == pytest.approx(one.op("fwd/input/h2d_next").demand["pcie_bytes"])
    assert four.op("fwd/input/h2d").demand["pcie_bytes"] == 0
    assert nxt.lane == "input_copy" and nxt.deps == [] and nxt.args.get("pipelined")
    assert not any("fwd/input/h2d_next" in o.deps for o in four.ops)
    # every micro-batch's first pack op and dense step wait for the step's h2d
    for mb in range(4):
        assert "fwd/input/h2d" in four.op(f"fwd/pack0/dedup@mb{mb}").deps
        assert "fwd/input/h2d" in four.op(f"fwd/dense/bottom_mlp@mb{mb}").deps


def test_id_exchange_pays_for_the_counts_exchange_first():
    from simulator.cost import own_fixed_us

    one_node = load_hardware("dgx-h100")
    lo = lower(kaggle_plan(), one_node)
    assert lo.op("fwd/pack0/a2a_ids").args["lat_steps"] == 1  # a demand: one link latency
    assert own_fixed_us(lo.op("fwd/pack0/a2a_ids").args, one_node) == one_node.intra_latency_us
    two_nodes = load_hardware("dgx-h100", ["nodes=2"])
    lo2 = lower(kaggle_plan(world=16), two_nodes)
    assert own_fixed_us(lo2.op("fwd/pack0/a2a_ids").args, two_nodes) == two_nodes.nic_latency_us


@pytest.mark.parametrize("setting", ["intra_latency_us=900", "gpu.hbm_bw=1TB/s", "efficiency.hbm=0.25"])
def test_a_graph_simulated_under_another_spec_keeps_none_of_the_first_specs_microseconds(setting):
    """Lowering emits demands (latency steps, bytes), so a graph lowered under one spec and
    simulated under another costs exactly what that other spec's own graph costs (before,
    the counts exchange's latency and a replica's update time were baked in as microseconds)."""
    from planner.plan import PackPlan
    from simulator.engine import simulate

    m = get_model("dlrm-criteo-kaggle")
    plan = Plan(model=m, world_size=8, batch_size_per_rank=2048,
                packs=[PackPlan("rows", m.table_names[:20]),
                       PackPlan("repl", m.table_names[20:], sharding="replicated")])
    first = load_hardware("dgx-h100")
    other = load_hardware("dgx-h100", [setting])
    graph = lower(plan, first).graph
    own = lower(plan, other).graph
    assert simulate(graph, other).iteration_us == pytest.approx(simulate(own, other).iteration_us, rel=1e-12)
    assert simulate(graph, other).iteration_us != pytest.approx(simulate(graph, first).iteration_us, rel=1e-6)


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
