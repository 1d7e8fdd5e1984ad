"""One prediction path: `picasso simulate` with a calibrated spec gives exactly validate's prediction."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from planner.access import table_access
from planner.builders import naive_plan
from planner.model_spec import ModelSpec, TableSpec
from simulator.hardware import load_hardware


def refined_spec(path) -> None:
    """local-cpu with what `picasso validate` adds: factors of one world, per-op-class coefficients, host gaps."""
    d = load_hardware("local-cpu").to_dict()
    d["calibration"] = {"worlds": {"2": {"launch_us": 7.0}}, "op_gap": 1.5,
                        "classes": {"fwd/dense/top_mlp": {"rate": 4.0}, "fwd/pack/dedup": {"fixed_launches": 3.0}}}
    path.write_text(json.dumps(d))


@pytest.mark.parametrize("engine", ["fast", "simpy"])
def test_simulate_with_a_refined_spec_gives_validates_prediction(tmp_path, engine):
    from planner.search import evaluate
    from validation.compare import predict

    m = ModelSpec("u", "dlrm", 13, tuple(TableSpec(f"C{i + 1}", n, 8) for i, n in enumerate([500, 40, 3000])),
                  bottom_mlp=(16, 8), top_mlp=(16, 1))
    plan = naive_plan(m, 2, 64)
    plan.save(tmp_path / "plan.json")
    refined_spec(tmp_path / "hw.json")
    hw = load_hardware(str(tmp_path / "hw.json"))
    want = predict(plan, hw, access=table_access(m, None), engine=engine).iteration_us
    out = subprocess.run([sys.executable, "-m", "picasso", "simulate", str(tmp_path / "plan.json"), "--hardware",
                          str(tmp_path / "hw.json"), "--engine", engine, "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["predicted_iteration_us"] == pytest.approx(want, rel=1e-9)
    # and the calibration is applied: the same plan on the spec without it predicts otherwise
    plain = evaluate(plan, load_hardware("local-cpu", ["gpus_per_node=2"]), table_access(m, None), engine).iteration_us
    assert abs(plain - want) > 0.05 * want
