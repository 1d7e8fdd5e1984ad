"""`picasso run`: agent-started workers on synthetic Criteo data, --verify, trace, dead rank, bad input."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from executor.process.launch import first_error
from picasso.cli import main
from planner.op_names import split_name
from planner.plan import PackPlan, Plan
from planner.presets import get_model


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from traces.synth import generate_criteo

    d = tmp_path_factory.mktemp("run")
    generate_criteo(d / "data.tsv", 1000, seed=0)
    m = replace(get_model("dlrm-criteo-kaggle").with_row_cap(500), bottom_mlp=(16, 16), top_mlp=(16, 1))
    plan = Plan(m, 2, 32, [PackPlan("pack0", m.table_names[:20], "row_wise"),
                            PackPlan("pack1", m.table_names[20:], "column_wise")],
                hot_rows={"C1": 50}, micro_batches=2, kernel_interleaving=True)
    plan.save(d / "plan.json", hot_ids={"C1": np.arange(50)})
    return d


@pytest.mark.dist
def test_run_verify_json_and_trace(setup, capsys):
    d = setup
    rc = main(["run", str(d / "plan.json"), "--data", str(d / "data.tsv"), "--steps", "3", "--verify",
               "--trace", str(d / "trace.json"), "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    res = json.loads(out)
    assert res["samples_per_s"] > 0 and res["world_size"] == 2 and res["backend"] == "gloo"
    assert res["max_rel_diff"] < 1e-5 and res["verify"]["reference_moved"] > 0
    trace = json.loads((d / "trace.json").read_text())["traceEvents"]
    names = {e["name"] for e in trace if e["ph"] == "X"}
    assert {"fwd/pack0/a2a_ids@mb0", "bwd/pack1/a2a_grad@mb1", "bwd/dense/allreduce", "opt/pack0/hot_update"} <= names
    assert {e["pid"] for e in trace if e["ph"] == "X"} == {0, 1}
    for n in names:
        split_name(n)  # every name follows planner.op_names


@pytest.mark.dist
def test_dead_rank_stops_the_run_with_one_clear_error(setup, capsys, monkeypatch):
    d = setup
    monkeypatch.setenv("PICASSO_FAULT", "1:1")
    rc = main(["run", str(d / "plan.json"), "--data", str(d / "data.tsv"), "--steps", "3", "--timeout", "20"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and "rank 1 died" in err[0], err


@pytest.mark.dist
def test_a_hung_rank_is_blamed_not_the_healthy_one(setup, capsys, monkeypatch):
    d = setup
    monkeypatch.setenv("PICASSO_FAULT", "1:1:hang")
    rc = main(["run", str(d / "plan.json"), "--data", str(d / "data.tsv"), "--steps", "3", "--timeout", "5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and "worker rank 1 hung" in err[0], err


def test_world_size_mismatch_is_one_line(setup, capsys):
    d = setup
    rc = main(["run", str(d / "plan.json"), "--data", str(d / "data.tsv"), "--nproc", "3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "2 ranks" in err[0]


def test_first_error_prefers_the_failing_rank():
    log = ("executor rank 0: error: a collective failed, another rank probably died or hung (reset)\n"
           "picasso agent: rank 0 exited with code 1\npicasso agent: rank 1 exited with code 3\n")
    assert first_error(log) == "worker rank 1 died (exit code 3); the other ranks stopped"
    hung = ("executor rank 0: error: a collective failed, another rank probably died or hung (timed out)\n"
            "picasso agent: rank 0 exited with code 1\n"
            "picasso agent: rank 1 was still running after rank 0 failed; stopped\n")
    assert first_error(hung).startswith("worker rank 1 hung")
    assert first_error("picasso agent: error: cannot listen on 10.0.0.9:5 (x)") == "cannot listen on 10.0.0.9:5 (x)"
    assert "failed" not in first_error("")  # workers that exited 0 without a result did not fail
    assert first_error("executor rank 1: error: bad data\nexecutor rank 0: error: x") == "rank 1: bad data"


def test_real_criteo_sample_trains_like_the_reference(criteo_sample_dir):
    """The real Criteo head through traces.readers, hot rows from its counts, one rank in-process."""
    from executor.comm import Comm
    from executor.data.batches import feature_map, global_batches, reader_chunks, to_batch
    from executor.run.verify import train_and_compare
    from planner.plan import OptimizerPlan

    m = replace(get_model("dlrm-criteo-kaggle").with_row_cap(1000), bottom_mlp=(16, 16), top_mlp=(16, 1))
    path = str(criteo_sample_dir / "train_split.tsv")
    it = global_batches(lambda: reader_chunks(path, "criteo"), 64, epochs=1)
    raws = [next(it) for _ in range(3)]
    fmap = feature_map(m, raws[0].sparse)
    batches = [to_batch(r, m, fmap) for r in raws]
    c1 = np.bincount(batches[0].sparse["C1"][0].numpy(), minlength=1000)
    plan = Plan(m, 1, 64, [PackPlan("pack0", m.table_names, "row_wise")], hot_rows={"C1": 20},
                hot_ids_file="hot.npz", micro_batches=4, optimizer=OptimizerPlan("rowwise_adagrad", 0.1, "sgd", 0.1))
    res = train_and_compare(plan, {"C1": np.argsort(-c1, kind="stable")[:20]}, batches, Comm())
    assert res["max_rel_diff"] < 1e-5 and res["reference_moved"] > 1e-3


def test_missing_data_file_is_one_line_before_any_worker(setup, capsys):
    d = setup
    rc = main(["run", str(d / "plan.json"), "--data", str(d / "nope.tsv")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "nope.tsv: no such data file" in err[0]


@pytest.mark.dist
def test_preloaded_batches_train_like_streamed_ones(setup, capsys):
    """--preload prepares every batch before the timed steps (what `picasso validate` times):
    the same batches in the same order as the streaming loader, across an epoch boundary."""
    d = setup
    res = {}
    for mode in ([], ["--preload"]):
        rc = main(["run", str(d / "plan.json"), "--data", str(d / "data.tsv"), "--steps", "18", "--warmup", "2",
                   "--json", *mode])
        out = capsys.readouterr().out
        assert rc == 0, out
        res[bool(mode)] = json.loads(out)
    assert res[True]["timed_steps"] == res[False]["timed_steps"] == 16  # 18 x 64 rows: past the 1000 in the file
    assert res[True]["mean_loss"] == pytest.approx(res[False]["mean_loss"], rel=1e-6)
