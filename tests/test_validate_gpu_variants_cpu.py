"""`picasso validate --variants gpu` end to end on a CPU rank: a tiny sweep (one rank, four
plans, two timed steps) runs every plan, writes its results, and states which variants a CPU
spec leaves out and why."""

from __future__ import annotations

import json

import pytest

from picasso.cli import main


@pytest.mark.dist
def test_validate_gpu_variants_runs_on_a_cpu_rank(tmp_path):
    from traces.synth import generate_criteo

    data = tmp_path / "data.tsv"
    generate_criteo(data, 800, seed=0)
    out, results = tmp_path / "v", tmp_path / "results.json"
    rc = main(["validate", "--data", str(data), "--hardware", "local-cpu", "--variants", "gpu",
               "--plans", "4", "--fit-plans", "0", "--no-planner", "--nproc-max", "1", "--batch-sizes", "64",
               "--steps", "2", "--max-steps", "2", "--timed-seconds", "0", "--warmup", "1", "--repeats", "1",
               "--row-cap", "1000", "--run-timeout", "120", "-o", str(out), "--results", str(results)])
    assert rc == 0
    res = json.loads((out / "validate.json").read_text())
    assert json.loads(results.read_text())["per_plan"] == res["per_plan"]
    assert res["failed"] == [] and res["plans"] == 4
    for r in res["per_plan"]:
        assert r["measured_us"] > 0 and r["predicted_us"] > 0, r["name"]
    # local-cpu has no tf32 or bf16 rate: those are left out, with the reason, and nothing says tf32/bf16
    skipped = res["variants"]["skipped"]
    assert res["variants"]["mode"] == "gpu" and set(skipped) == {"tf32", "bf16"}
    assert all("FLOP rate" in why for why in skipped.values())
    knobs = [r["knobs"] for r in res["per_plan"]]
    assert {k["dense_dtype"] for k in knobs} == {"fp32"}
    # the 16-bit tables and host-placed rows ran on the CPU rank
    assert any(k["table_dtype"] == "fp16" and k["host"] for k in knobs)
