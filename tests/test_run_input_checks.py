"""`picasso run` checks its inputs before any rank starts: a model takes exactly the data's dense
columns (never a silent subset), and --data/--eval-data are regular files or converted folders."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

from executor.data.batches import DataError, RawBatch, feature_map, to_batch
from picasso.cli import main
from planner.plan import PackPlan, Plan
from planner.presets import get_model


def _model(num_dense: int):
    m = get_model("dlrm-criteo-kaggle").with_row_cap(200)
    return replace(m, name=f"d{num_dense}", num_dense=num_dense, bottom_mlp=(8, 16), top_mlp=(8, 1))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from traces.synth import generate_criteo

    d = tmp_path_factory.mktemp("inputs")
    generate_criteo(d / "data.tsv", 200, seed=0)  # Criteo's 13 dense columns
    for n in (2, 13):
        m = _model(n)
        Plan(m, 1, 16, [PackPlan("pack0", m.table_names, "row_wise")]).save(d / f"plan{n}.json")
    return d


@pytest.fixture
def no_workers(monkeypatch):
    """Any worker started fails the test: the refusals must come first."""
    import executor.process.launch as launch

    def started(*a, **k):
        raise AssertionError("workers were started")

    monkeypatch.setattr(launch, "run_tree", started)


@pytest.mark.parametrize("have", [2, 20])
def test_a_batch_with_other_dense_columns_is_refused(have):
    m = _model(13)
    n = 4
    sparse = {t: (np.arange(n, dtype=np.int64), np.arange(n + 1, dtype=np.int64)) for t in m.table_names}
    raw = RawBatch(np.zeros(n, np.float32), np.ones((n, have), np.float32), sparse)
    with pytest.raises(DataError, match=f"takes 13 dense features, the data has {have}"):
        to_batch(raw, m, feature_map(m, raw.sparse))


def test_a_two_dense_model_on_criteo_data_is_refused_before_any_worker(data, capsys, no_workers):
    rc = main(["run", str(data / "plan2.json"), "--data", str(data / "data.tsv"), "--steps", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "takes 2 dense features" in err[0] and "has 13" in err[0], err


def test_wrong_dense_count_in_eval_data_is_refused_before_any_worker(data, capsys, no_workers):
    rc = main(["run", str(data / "plan2.json"), "--data", "synthetic", "--steps", "2", "--eval-data", str(data / "data.tsv")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--eval-data file has 13" in err[0], err


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_eval_data_must_be_a_file_or_a_converted_folder(data, tmp_path, capsys, no_workers, kind):
    bad = tmp_path / "eval"
    if kind == "fifo":
        os.mkfifo(bad)
    else:
        bad.mkdir()
    rc = main(["run", str(data / "plan13.json"), "--data", str(data / "data.tsv"), "--steps", "2",
               "--eval-data", str(bad)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and str(bad) in err[0], err
    assert ("not a regular file" if kind == "fifo" else "not one from `picasso convert`") in err[0], err


def test_a_port_no_socket_can_have_is_refused_before_any_worker(data, capsys, no_workers):
    rc = main(["run", str(data / "plan13.json"), "--data", "synthetic", "--steps", "2", "--master-port", "70000"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--master-port" in err[0] and "70000" in err[0], err


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_a_killed_rank_launcher_is_named(data, capsys, monkeypatch, sig):
    """The agent itself killed: its ranks die with it and print nothing; the line says what happened."""
    import sys

    import executor.process.launch as launch

    suicide = f"import os, signal; os.kill(os.getpid(), signal.{sig})"
    monkeypatch.setattr(launch, "agent_command", lambda *a, **k: [sys.executable, "-c", suicide])
    rc = main(["run", str(data / "plan13.json"), "--data", "synthetic", "--steps", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "rank launcher" in err[0] and f"killed by {sig}" in err[0], err
