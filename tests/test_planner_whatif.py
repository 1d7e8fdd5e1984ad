"""planner/whatif.py: a saved plan's prediction on changed hardware, and one key swept."""

import pytest

from planner.builders import baseline_plan
from planner.errors import PlanError
from planner.inputs import load_inputs
from planner.throughput import samples_per_s
from planner.whatif import inputs_for, parse_sweep, predict, sweep


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model, hw, _, access = load_inputs("dlrm-criteo-kaggle", "dgx-h100", ["nodes=1"], None, None, 50_000)
    plan = baseline_plan("naive", model, hw.world_size, 1024, hw, access)
    plan.hardware = hw.name
    plan.provenance.hardware_overrides = ["nodes=1"]
    path = tmp_path_factory.mktemp("whatif") / "plan.json"
    plan.save(path)
    return path


def test_sweep_predicts_each_value_on_the_plans_own_spec(saved):
    from planner.plan import Plan

    plan, hw, access = inputs_for(Plan.load(saved))
    assert hw.world_size == 8  # the plan's own override (nodes=1) applies
    points = sweep(plan, hw, access, "gpu.hbm_bw", ["0.5TB/s", "3.35TB/s"], engine="fast")
    assert [p.value for p in points] == ["0.5TB/s", "3.35TB/s"]
    assert points[0].iteration_us > points[1].iteration_us  # the naive plan's gathers read HBM
    for p in points:
        assert p.samples_per_s == pytest.approx(plan.global_batch / p.iteration_us * 1e6) and p.fits_in_memory
    one = predict(plan, hw, access, "fast").evaluation.iteration_us
    assert points[1].iteration_us == pytest.approx(one)  # the preset's own value: no change


def test_overrides_replace_the_plans_hardware_only_when_named(saved):
    from planner.plan import Plan

    _, hw, _ = inputs_for(Plan.load(saved), "dgx-h100", ["nodes=1", "gpus_per_node=8"])
    assert hw.world_size == 8
    with pytest.raises(PlanError, match="KEY=V1,V2"):
        parse_sweep("gpu.hbm_bw")
    assert parse_sweep("nic_bw=1GB/s, 2GB/s") == ("nic_bw", ["1GB/s", "2GB/s"])
    assert samples_per_s(Plan.load(saved), None) is None
