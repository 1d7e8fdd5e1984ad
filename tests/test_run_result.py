"""The run's result: one typed schema (executor.run.result.RunResult) from the workers to every reader."""

from __future__ import annotations

import json

import pytest

from executor.run.result import ResultError, RunResult
from picasso.commands.run import verify_failure


def a_result(verify: dict | None = None) -> RunResult:
    d = {
        "plan": "plan.json", "model": "m", "world_size": 2, "backend": "gloo", "device": "cpu", "global_batch": 64,
        "micro_batches": 1, "dense_dtype": "fp32", "steps": 5, "timed_steps": 3, "start_step": 0,
        "samples_per_s": 1000.0, "iteration_ms": {"p50": 2.0, "p90": 3.0, "p99": 3.0, "mean": 2.2},
        "step_ms": [2.0, 1.5, 3.0], "mean_loss": 0.7, "last_loss_rank0_share": 0.3, "op_timing": False,
        "data": {"path": "d.tsv", "kind": "criteo", "malformed_rows_skipped": 0},
        "peak_memory": {"measure": "rss", "measured_bytes_per_rank": [1.0, 2.0], "host_rss_bytes_per_rank": [1.0, 2.0]},
        "eval": [{"step": 5, "rows": 10, "auc": 0.6, "logloss": 0.5, "positive_rate": 0.2, "seconds": 0.1}],
    }
    if verify is not None:
        d["verify"] = {"embedding_rel_diff": 0.0, "dense_rel_diff": 0.0, "reference_moved": 1.0, "from_step": 0,
                       **verify}
    return RunResult.from_dict(d)


def test_round_trip_keeps_every_field_and_the_verify_figure_on_top():
    r = a_result({"max_rel_diff": 1e-7, "tolerance": 1e-4, "passed": True})
    back = RunResult.from_json(r.to_json())
    assert back == r
    d = json.loads(r.to_json())
    assert d["max_rel_diff"] == 1e-7 and d["verify"]["passed"] is True
    assert "trace" not in d and d["eval"][0]["auc"] == 0.6  # unset optional fields are left out
    assert back.iteration_us() == 2000.0 and back.eval[0].logloss == 0.5


def test_unknown_or_missing_keys_are_one_clear_error():
    d = a_result().to_dict()
    with pytest.raises(ResultError, match="result.iteration_us_p50: not a field"):
        RunResult.from_dict({**d, "iteration_us_p50": 3.0})
    with pytest.raises(ResultError, match="result.samples_per_s: missing"):
        RunResult.from_dict({k: v for k, v in d.items() if k != "samples_per_s"})
    with pytest.raises(ResultError, match="peak_memory.rss: not a field"):
        RunResult.from_dict({**d, "peak_memory": {**d["peak_memory"], "rss": 1}})
    with pytest.raises(ResultError, match="not JSON"):
        RunResult.from_json("{")


def test_verify_above_its_tolerance_fails_the_exit_code():
    line = verify_failure(a_result({"max_rel_diff": 2.14, "tolerance": 1e-4, "passed": False}))
    assert line and "2.14" in line and "tolerance" in line
    assert verify_failure(a_result({"max_rel_diff": 1e-7, "tolerance": 1e-4, "passed": True})) is None
    assert verify_failure(a_result()) is None
