import json

import pytest

from picasso.cli import main
from planner.plan import Plan

CPU = ["--hardware", "local-cpu", "--set", "nodes=1", "--set", "gpus_per_node=2"]


def run_json(capsys, argv):
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_without_profile_writes_runnable_plan_and_speedups(tmp_path, capsys):
    out = tmp_path / "plan.json"
    d = run_json(capsys, ["plan", "--model", "dlrm-criteo-kaggle", *CPU, "--row-cap", "1000",
                          "--batch-size", "64", "-o", str(out), "--time-budget", "5",
                          "--html", str(tmp_path / "r.html")])
    plan = Plan.load(out)
    assert plan.world_size == 2 and plan.model.table("C3").num_rows == 1000
    assert set(d["speedups"]) == {"naive", "torchrec-like", "dp-hot-only"}
    assert all(isinstance(v, float) for v in d["speedups"].values())
    assert d["predicted_iteration_us"] > 0 and d["memory"]["hbm_peak"] <= d["memory"]["hbm_capacity"]
    assert (tmp_path / "r.html").read_text().count("plotly") > 0
    if plan.hot_rows:
        assert plan.load_hot_ids()


def test_plan_explain_text_and_baseline(tmp_path, capsys):
    assert main(["plan", "--model", "deepfm", *CPU, "--row-cap", "2000", "--batch-size", "32",
                 "-o", str(tmp_path / "p.json"), "--explain", "--time-budget", "3"]) == 0
    text = capsys.readouterr().out
    for needle in ("pack", "hot cover", "time by phase", "memory per rank", "speedup over baselines", "naive"):
        assert needle in text
    assert main(["plan", "--model", "dlrm-criteo-kaggle", *CPU, "--row-cap", "100", "--batch-size", "16",
                 "--baseline", "naive", "-o", str(tmp_path / "n.json")]) == 0
    capsys.readouterr()
    assert Plan.load(tmp_path / "n.json").provenance.baseline == "naive"


def test_simulate_what_if_sweep_and_trace(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "p2res-v100", "-o", str(out),
                 "--time-budget", "5"]) == 0
    capsys.readouterr()
    d = run_json(capsys, ["simulate", str(out), "--trace", str(tmp_path / "t.json")])
    assert d["predicted_iteration_us"] > 0 and d["fits_in_memory"]
    trace = json.loads((tmp_path / "t.json").read_text())
    assert any(e.get("name", "").startswith("fwd/pack0/") for e in trace["traceEvents"])
    s = run_json(capsys, ["simulate", str(out), "--engine", "fast", "--sweep", "nic_bw=6GB/s,12.5GB/s,50GB/s"])
    times = [r["iteration_us"] for r in s["results"]]
    assert times[0] > times[1] > times[2]  # a faster NIC never hurts
    slow = run_json(capsys, ["simulate", str(out), "--set", "nic_bw=1GB/s"])
    assert slow["predicted_iteration_us"] > d["predicted_iteration_us"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plan", "--model", "nope", "--hardware", "dgx-h100"], "unknown model preset 'nope'"),
        (["plan", "--model", "deepfm", "--hardware", "dgx-h100", "--baseline", "magic"], "--baseline 'magic'"),
        (["plan", "--model", "deepfm", "--hardware", "dgx-h100", "--row-cap", "0"], "--row-cap"),
        (["simulate", "missing.json"], "no such plan file"),
        (["plan", "--model", "deepfm", "--hardware", "dgx-h100", "--set", "bogus=1"], "unknown key"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_plan_that_cannot_fit_says_which_rank(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--model", "dlrm-mlperf", "--hardware", "local-cpu", "--set", "gpus_per_node=1",
                 "--set", "gpu.hbm_bytes=1GB", "--set", "host.dram_bytes=2GB", "--baseline", "naive"]) == 2
    err = capsys.readouterr().err
    assert "does not fit" in err and "rank 0" in err
