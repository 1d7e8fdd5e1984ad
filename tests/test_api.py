"""picasso/api.py: the loop as typed Python functions, each the command's own work."""

import pytest

import picasso
from planner.plan import Plan
from planner.whatif import SweepPoint
from simulator.timeline import Timeline
from traces.profile import AccessProfile
from traces.synth import generate_criteo


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    d = tmp_path_factory.mktemp("api")
    generate_criteo(d / "clicks.tsv", 3000, seed=3)
    profile = picasso.analyze(d / "clicks.tsv", "criteo", output=d / "profile.json", batch_size=512)
    plan = picasso.plan("dlrm-criteo-kaggle", "dgx-h100", d / "profile.json", overrides=["nodes=1"],
                        baseline="torchrec-like", output=d / "plan.json")
    return d, profile, plan


def test_functions_return_the_layers_objects(loop):
    d, profile, plan = loop
    assert isinstance(profile, AccessProfile) and (d / "profile.json").exists()
    assert set(profile.features) >= {"C1", "C26"}
    assert isinstance(plan, Plan) and Plan.load(d / "plan.json").world_size == plan.world_size == 8
    tl = picasso.simulate(d / "plan.json")
    assert isinstance(tl, Timeline)
    # the same prediction path as `picasso plan` (simpy on the plan's own spec)
    assert tl.makespan_us() == pytest.approx(plan.prediction.iteration_us, rel=1e-6)
    slow = picasso.simulate(plan, overrides=["gpu.hbm_bw=0.2TB/s"])
    assert slow.makespan_us() > tl.makespan_us()
    points = picasso.sweep(plan, "nic_bw", ["10GB/s", "50GB/s"], engine="fast")
    assert [type(p) for p in points] == [SweepPoint, SweepPoint] and points[0].value == "10GB/s"


def test_bad_input_raises_the_commands_error(loop, capsys):
    d, _, _ = loop
    with pytest.raises(ValueError, match="--baseline 'nope'"):
        picasso.plan("dlrm-criteo-kaggle", "dgx-h100", baseline="nope", output=d / "x.json")
    with pytest.raises(ValueError, match="unrecognized arguments: --no-such-flag"):
        picasso.analyze(d / "clicks.tsv", "criteo", no_such_flag=1)
    with pytest.raises(ValueError, match="expected key=value"):
        picasso.simulate(d / "plan.json", overrides=["gpu.hbm_bw"])


def _result(plan_path, it_ms: float, ops: dict | None) -> dict:
    return {"plan": str(plan_path), "model": "m", "world_size": 8, "backend": "nccl", "device": "cuda",
            "global_batch": 8, "micro_batches": 1, "dense_dtype": "fp32", "steps": 10, "timed_steps": 8,
            "start_step": 0, "samples_per_s": 1.0, "iteration_ms": {"p50": it_ms}, "mean_loss": None,
            "last_loss_rank0_share": None, "op_timing": ops is not None, "op_durations_us": ops,
            "data": {"path": "x", "kind": "criteo"},
            "peak_memory": {"measure": "rss", "measured_bytes_per_rank": [0.0], "host_rss_bytes_per_rank": [0.0]}}


def test_compare_reads_a_runs_result_against_the_prediction(loop, tmp_path, capsys):
    import json

    from executor.run.result import RunResult
    from picasso.cli import main
    from simulator.measured import mean_op_durations

    d, _, plan = loop
    tl = picasso.simulate(d / "plan.json")
    doubled = {k: 2 * v for k, v in mean_op_durations(tl).items()}  # a run twice as slow in every op
    res = RunResult.from_dict(_result(d / "plan.json", 2 * plan.prediction.iteration_us / 1e3, doubled))
    c = picasso.compare(d / "plan.json", res)
    assert c.error == pytest.approx(-0.5, abs=1e-3) and c.ops
    assert all(o.error == pytest.approx(-0.5, abs=1e-3) for o in c.ops)
    f = tmp_path / "result.json"
    f.write_text(json.dumps(_result(d / "plan.json", 1.0, None)))
    assert main(["compare", str(d / "plan.json"), str(f)]) == 0
    assert "run with --op-timing" in capsys.readouterr().out
    f.write_text("{")
    assert main(["compare", str(d / "plan.json"), str(f)]) == 2
    assert capsys.readouterr().err.count("\n") == 1  # one line, no traceback


def test_plan_writes_only_when_asked(loop, tmp_path, monkeypatch):
    d, _, _ = loop
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.json").write_text("the CLI's plan")
    plan = picasso.plan("dlrm-criteo-kaggle", "dgx-h100", d / "profile.json", overrides=["nodes=1"],
                        baseline="torchrec-like")
    assert isinstance(plan, Plan) and plan.prediction is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
    assert (tmp_path / "plan.json").read_text() == "the CLI's plan"


def test_a_plan_made_in_memory_saves_its_hot_ids_later(tmp_path):
    import numpy as np

    from planner.plan import PackPlan
    from planner.presets import get_model

    m = get_model("dlrm-criteo-kaggle").with_row_cap(100)
    plan = Plan(m, 2, 8, [PackPlan("p", m.table_names, "row_wise")], hot_rows={"C1": 3}, hot_ids_file="hot.npz",
                hot_ids={"C1": np.array([5, 1, 9])})
    plan.save(tmp_path / "later.json")
    assert Plan.load(tmp_path / "later.json").load_hot_ids()["C1"].tolist() == [5, 1, 9]
