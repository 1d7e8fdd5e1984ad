"""The calibration as a typed, saved object: round trip, old files' string keys, clear errors."""

from __future__ import annotations

import json

import pytest

from simulator.calibration_spec import Calibration, ClassFit, WorldFit
from simulator.hardware import HardwareError, HardwareSpec, load_hardware

# what `picasso validate` wrote before (a few keys of each kind from a real refined file)
OLD_KEYS = {
    "compute": 1.51, "hbm": 1.1, "all_to_all": 3.54,
    "w1.compute": 3.72, "w1.launch_us": 10.7, "w1.opgap": 1.96, "w1.stepgap": 42.1,
    "w4.compute": 1.51, "w4.all_to_all": 3.54, "w4.launch_us": 35.1, "w4.intra_latency_us": 853.9,
    "w2.collwait": 0.0606,
    "op:fwd/dense/top_mlp": 1.15, "opfixed:fwd/dense/top_mlp": 35.7,
    "w4.op:fwd/dense/top_mlp": 0.698, "w4.opfixed:fwd/dense/top_mlp": 15.2,
    "opfixed:comm#collective": 14.2, "op:comm#collective": 1.16, "lat:op:comm#collective": 0.859,
    "w4.opfixed:comm#collective": 3.05, "w4.op:comm#collective": 0.328, "w4.lat:op:comm#collective": 3.05,
    "opgap": 0.5,
}


def old_spec_dict() -> dict:
    d = load_hardware("local-cpu").to_dict()
    d["gpus_per_node"] = 4
    d["efficiency"] = dict(OLD_KEYS)
    return d


def test_old_string_keys_load_into_the_typed_calibration(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old_spec_dict()))
    hw = load_hardware(path)
    assert hw.efficiency == {"compute": 1.51, "hbm": 1.1, "all_to_all": 3.54}  # the plain factors only
    cal = hw.calibration
    assert sorted(cal.worlds) == [1, 2, 4]
    assert cal.worlds[1] == WorldFit(launch_us=10.7, efficiency={"compute": 3.72}, op_gap=1.96, step_gap=42.1)
    assert cal.worlds[2].coll_wait == 0.0606
    w4 = cal.worlds[4]
    assert (w4.launch_us, w4.intra_latency_us, w4.efficiency) == (35.1, 853.9, {"compute": 1.51, "all_to_all": 3.54})
    assert w4.classes["comm#collective"] == ClassFit(fixed_launches=3.05, rate=0.328, latency_scale=3.05)
    assert cal.classes["comm#collective"] == ClassFit(fixed_launches=14.2, rate=1.16, latency_scale=0.859)
    assert cal.classes["fwd/dense/top_mlp"] == ClassFit(fixed_launches=35.7, rate=1.15)
    assert cal.op_gap == 0.5
    # resolved for 4 ranks: the world's class fit over the pooled one, field by field
    at4 = cal.resolve(4)
    assert at4.classes["fwd/dense/top_mlp"] == ClassFit(fixed_launches=15.2, rate=0.698)
    assert (at4.op_gap, at4.step_gap, at4.coll_wait) == (0.5, 0.0, 0.0)
    assert cal.resolve(1).op_gap == 1.96 and cal.resolve(3).coll_wait == 0.0  # 3 -> nearest 4 (ties: larger)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_calibration_round_trips_through_a_saved_spec(tmp_path, suffix):
    hw = HardwareSpec.from_dict(old_spec_dict())
    path = tmp_path / f"hw{suffix}"
    hw.save(path)
    text = path.read_text()
    assert "lat:op:" not in text and "opfixed:" not in text and "w4." not in text  # the new layout only
    again = load_hardware(path)
    assert again.calibration == hw.calibration and again.to_dict() == hw.to_dict()
    assert Calibration.from_dict(hw.calibration.to_dict()) == hw.calibration


def test_an_old_file_predicts_as_its_resaved_form():
    from planner.access import table_access
    from planner.builders import naive_plan
    from planner.model_spec import ModelSpec, TableSpec
    from planner.search import evaluate

    m = ModelSpec("u", "dlrm", 13, tuple(TableSpec(f"C{i + 1}", n, 8) for i, n in enumerate([500, 40, 3000])),
                  bottom_mlp=(16, 8), top_mlp=(16, 1))
    plan = naive_plan(m, 4, 64)
    old = HardwareSpec.from_dict(old_spec_dict())
    new = HardwareSpec.from_dict(json.loads(json.dumps(old.to_dict())))
    acc = table_access(m, None)
    a, b = evaluate(plan, old, acc).iteration_us, evaluate(plan, new, acc).iteration_us
    assert a == b
    # and the collective fit of world 4 is what prices it: without the calibration it differs
    bare = HardwareSpec.from_dict({**old.to_dict(), "calibration": None})
    assert abs(evaluate(plan, bare, acc).iteration_us - a) > 0.05 * a


@pytest.mark.parametrize("bad, says", [
    ({"worlds": {"0": {}}}, "calibration.worlds.0: expected a positive world size"),
    ({"worlds": {"2": {"launch_us": -1}}}, "calibration.worlds.2.launch_us: expected a positive number"),
    ({"classes": {"fwd/dense/x": {"speed": 2}}}, "unknown key 'speed'"),
    ({"wolrds": {}}, "unknown key 'wolrds'"),
])
def test_a_bad_calibration_section_is_refused_in_one_line(bad, says):
    d = load_hardware("local-cpu").to_dict()
    d["calibration"] = bad
    with pytest.raises(HardwareError, match=says.replace(".", r"\.")) as e:
        HardwareSpec.from_dict(d, where="hw.json")
    assert "\n" not in str(e.value) and str(e.value).startswith("hw.json")
