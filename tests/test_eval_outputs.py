"""Evaluation results everywhere: stdout, --json, the trace (counter track), the checkpoint
manifest (validated at load, reported on resume) and the demo report's AUC curve."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from executor.run.checkpoint import CheckpointError, eval_record, validate_manifest
from picasso.cli import main
from planner.plan import PackPlan, Plan
from planner.presets import get_model
from simulator.timeline import Timeline


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from traces.synth import generate_criteo

    d = tmp_path_factory.mktemp("evalout")
    generate_criteo(d / "train.tsv", 1024, seed=0)
    generate_criteo(d / "test.tsv", 200, seed=1)
    m = replace(get_model("dlrm-criteo-kaggle").with_row_cap(500), bottom_mlp=(16, 16), top_mlp=(16, 1))
    Plan(m, 2, 32, [PackPlan("pack0", m.table_names, "row_wise")], hot_rows={"C1": 20}, micro_batches=2
         ).save(d / "plan2.json", hot_ids={"C1": np.arange(20)})
    return d


@pytest.mark.dist
def test_eval_reaches_trace_checkpoint_and_resume(setup, capsys, tmp_path):
    d = setup
    trace, ck = tmp_path / "t.json", tmp_path / "ck"
    rc = main(["run", str(d / "plan2.json"), "--data", str(d / "train.tsv"), "--steps", "6", "--eval-data",
               str(d / "test.tsv"), "--eval-every", "3", "--trace", str(trace), "--checkpoint", str(ck), "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    res = json.loads(cap.out)
    assert [e["step"] for e in res["eval"]] == [3, 6]
    events = json.loads(trace.read_text())["traceEvents"]
    counters = [e for e in events if e["ph"] == "C" and e["name"] == "eval"]
    marks = [e for e in events if e["ph"] == "i" and e["name"] == "eval"]
    assert [c["args"]["auc"] for c in counters] == [e["auc"] for e in res["eval"]]
    assert [c["args"]["logloss"] for c in counters] == [e["logloss"] for e in res["eval"]]
    assert [m["args"]["step"] for m in marks] == [3, 6] and counters[0]["ts"] < counters[1]["ts"]
    last = json.loads((ck / "manifest.json").read_text())["last_eval"]
    assert last["step"] == 6 and last["rows"] == 200 and last["data"] == str(d / "test.tsv")
    assert math.isclose(last["auc"], res["eval"][-1]["auc"]) and math.isclose(last["logloss"], res["eval"][-1]["logloss"])
    # resume without evaluation: the report names the checkpoint's last evaluation, the new checkpoint keeps it
    rc = main(["run", str(d / "plan2.json"), "--data", str(d / "train.tsv"), "--steps", "2", "--resume", str(ck),
               "--checkpoint", str(tmp_path / "ck2")])
    out = capsys.readouterr().out
    assert rc == 0
    line = next(x for x in out.splitlines() if x.startswith("resumed"))
    assert f"at step 6 (last evaluation: step 6, AUC {last['auc']:.4f}, logloss {last['logloss']:.4f})" in line
    assert json.loads((tmp_path / "ck2" / "manifest.json").read_text())["last_eval"] == last


def _manifest(**last) -> dict:
    sha = "0" * 64
    return {"format": "picasso-checkpoint-2", "world_size": 1, "steps": 3, "data_position": 3, "model": "m",
            "model_fingerprint": "f", "packs": [], "files": {"rank0.pt": {"bytes": 1, "sha256": sha},
                                                              "dense.pt": {"bytes": 1, "sha256": sha}},
            "last_eval": {"step": 3, "rows": 10, "auc": 0.7, "logloss": 0.5, **last}}


@pytest.mark.parametrize("bad,field", [({"auc": 1.5}, "last_eval.auc"), ({"logloss": float("nan")}, "last_eval.logloss"),
                                       ({"rows": 0}, "last_eval.rows"), ({"step": "3"}, "last_eval.step")])
def test_manifest_last_eval_is_validated(bad, field):
    m = _manifest(**bad)  # a format-2 manifest (one file per rank): still loads
    with pytest.raises(CheckpointError, match=f"field {field}"):
        validate_manifest(m, Path("manifest.json"))
    ok = _manifest(auc=None)  # an undefined AUC (one class only) is recorded as null
    validate_manifest(ok, Path("manifest.json"))


def test_eval_record_keeps_an_undefined_auc_as_null():
    r = eval_record({"step": 4, "rows": 9, "auc": float("nan"), "logloss": 0.3, "trace_us": 1.0}, "x.tsv")
    assert r == {"step": 4, "rows": 9, "auc": None, "logloss": 0.3, "data": "x.tsv"}


def test_timeline_counters_export_and_round_trip(tmp_path):
    tl = Timeline()
    tl.add(0, "compute", "fwd/x", 0.0, 5.0)
    tl.count(0, "eval", 10.0, {"auc": 0.75, "logloss": float("nan")}, step=7)
    ev = tl.to_chrome_trace()["traceEvents"]
    c = next(e for e in ev if e["ph"] == "C")
    assert c["args"] == {"auc": 0.75} and c["ts"] == 10.0  # NaN left out: viewers reject it
    assert next(e for e in ev if e["ph"] == "i")["args"]["step"] == 7
    tl.save(tmp_path / "tl.json")
    assert Timeline.load(tmp_path / "tl.json").counters == tl.counters


def test_demo_auc_section_draws_the_curve():
    from validation.demo import auc_section

    evals = [{"step": 8, "auc": 0.51, "logloss": 0.6, "rows": 100}, {"step": 16, "auc": 0.55, "logloss": 0.58, "rows": 100}]
    sec = auc_section(evals)
    assert "AUC curve" in sec.title and "0.55" in sec.html
    fig = sec.figures[0]
    assert list(fig.data[0].y) == [0.51, 0.55] and list(fig.data[0].x) == [8, 16]
    assert list(fig.data[1].y) == [0.6, 0.58]
