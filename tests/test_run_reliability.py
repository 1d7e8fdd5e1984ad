"""`picasso run` reliability: --verify after --resume, its exit code, counts that used to hang,
a bounded data skip, outputs onto special files, write errors, private worker logs."""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from dataclasses import replace

import numpy as np
import pytest

from executor.data.batches import RawBatch, global_batches
from executor.run.sources import resumed_batches
from picasso.cli import main
from planner.plan import PackPlan, Plan
from planner.presets import get_model


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from traces.synth import generate_criteo

    d = tmp_path_factory.mktemp("rel")
    generate_criteo(d / "data.tsv", 600, seed=0)
    m = replace(get_model("dlrm-criteo-kaggle").with_row_cap(300), bottom_mlp=(16, 16), top_mlp=(8, 1))
    plan = Plan(m, 2, 16, [PackPlan("pack0", m.table_names[:13], "row_wise"),
                            PackPlan("pack1", m.table_names[13:], "column_wise")],
                hot_rows={"C1": 20}, micro_batches=2)
    plan.save(d / "plan.json", hot_ids={"C1": np.arange(20)})
    return d


@pytest.mark.dist
def test_verify_after_resume_starts_from_the_checkpoint(setup, capsys, monkeypatch, tmp_path):
    d = setup
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    base = ["run", str(d / "plan.json"), "--data", str(d / "data.tsv"), "--steps", "2"]
    assert main([*base, "--checkpoint", str(d / "ck")]) == 0
    capsys.readouterr()
    rc = main([*base, "--resume", str(d / "ck"), "--verify", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert res["verify"]["from_step"] == 2 and res["max_rel_diff"] < 1e-5, res["verify"]  # was 2.14 from scratch
    assert not list(tmp_path.glob("picasso-run-*"))  # the private log folder is removed on success


@pytest.mark.parametrize("flags,expect", [
    (["--nnodes", "1", "--node-rank", "5"], "--node-rank"),
    (["--nnodes", "0"], "--nnodes"),
    (["--nproc", "0"], "--nproc"),
    (["--steps", "0"], "--steps"),
    (["--keep", "0"], "--keep"),
    (["--timeout", "nan"], "--timeout"),
])
def test_counts_that_used_to_hang_or_crash_are_one_line(setup, capsys, flags, expect):
    d = setup
    rc = main(["run", str(d / "plan.json"), "--data", str(d / "data.tsv"), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and expect in err[0] and "internal error" not in err[0], err


def test_a_fifo_as_hot_id_file_or_data_is_refused_without_blocking(setup, tmp_path, capsys):
    d = setup
    plan = json.loads((d / "plan.json").read_text())
    plan["hot_ids_file"] = "fifo.npz"
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    os.mkfifo(tmp_path / "fifo.npz")
    rc = main(["run", str(tmp_path / "plan.json"), "--data", str(d / "data.tsv")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "fifo.npz" in err[0] and "not a regular file" in err[0], err
    rc = main(["run", str(d / "plan.json"), "--data", str(tmp_path / "fifo.npz")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "not a regular file" in err[0], err


def test_a_huge_data_position_reads_the_data_at_most_twice():
    rows = 10
    raw = RawBatch(np.arange(rows, dtype=np.float32), np.zeros((rows, 1), np.float32),
                   {"C1": (np.arange(rows), np.arange(rows + 1))})
    opened = []

    def open_chunks():
        opened.append(1)
        return iter([raw])

    skip = 10**15 + 3  # 5 batches of 2 per pass: lands on batch 3 of a pass
    got = [b.labels.tolist() for _, b in zip(range(4), resumed_batches(open_chunks, 2, skip))]
    assert got == [[6, 7], [8, 9], [0, 1], [2, 3]]
    assert len(opened) <= 3
    want = [b.labels.tolist() for _, b in zip(range(4), global_batches(lambda: iter([raw]), 2, skip=3))]
    assert got == want


@pytest.mark.parametrize("command", ["synth", "plan", "analyze", "analyze-html", "simulate-trace", "calibrate",
                                     "run-trace", "validate-html"])
def test_output_onto_a_device_or_fifo_is_refused(setup, tmp_path, capsys, command):
    d = setup
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    for target in ("/dev/full", str(fifo)):
        argv = {
            "synth": ["synth", "--rows", "10", "-o", target],
            "plan": ["plan", "--model", "wide-deep", "--hardware", "local-cpu", "-o", target],
            "analyze": ["analyze", str(d / "data.tsv"), "--format", "criteo", "-o", target],
            "analyze-html": ["analyze", str(d / "data.tsv"), "--format", "criteo", "--html", target],
            "simulate-trace": ["simulate", str(d / "plan.json"), "--hardware", "local-cpu", "--trace", target],
            "calibrate": ["calibrate", "--quick", "-o", target],
            "run-trace": ["run", str(d / "plan.json"), "--data", str(d / "data.tsv"), "--trace", target],
            "validate-html": ["validate", "--data", str(d / "data.tsv"), "--hardware", "local-cpu", "--html", target,
                              "-o", str(tmp_path / "v")],
        }[command]
        rc = main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and "not a regular file" in err[0], err
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode) and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_write_error_is_one_line_and_keeps_the_old_file(tmp_path, capsys, monkeypatch):
    import foundation.files as files

    out = tmp_path / "data.tsv"
    out.write_text("old\n")

    def full(path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "_fsync_file", full)
    rc = main(["synth", "--rows", "10", "-o", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and str(out) in err[0] and "No space left" in err[0], err
    assert out.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["data.tsv"]


@pytest.mark.dist
def test_a_failed_run_keeps_its_log_in_a_private_folder(setup, capsys, monkeypatch, tmp_path):
    d = setup
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("PICASSO_FAULT", "1:1")
    rc = main(["run", str(d / "plan.json"), "--data", str(d / "data.tsv"), "--steps", "3", "--timeout", "20"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "rank 1 died" in err
    [folder] = tmp_path.glob("picasso-run-*")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert [p.name for p in folder.iterdir()] == ["workers.log"] and str(folder / "workers.log") in err


def test_messages_name_the_problem_not_python(setup, tmp_path, capsys):
    from picasso.cli import one_line

    assert one_line(KeyError('Field "0" exists 5 times in schema')) == 'Field "0" exists 5 times in schema'
    assert one_line(KeyError("C7")) == "unknown key 'C7'"
    d = setup
    rc = main(["validate", "--data", str(d / "data.tsv"), "--hardware", "local-cpu", "--batch-sizes", "0,-5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--batch-sizes" in err[0], err
    plan = json.loads((d / "plan.json").read_text())
    for name, content in (("plain.npy", None), ("cut.npz", b"PK\x03\x04trunc")):
        if content is None:
            np.save(tmp_path / name, np.arange(20))
        else:
            (tmp_path / name).write_bytes(content)
        (tmp_path / "plan.json").write_text(json.dumps({**plan, "hot_ids_file": name}))
        rc = main(["run", str(tmp_path / "plan.json"), "--data", str(d / "data.tsv")])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and name in err[0] and "not a picasso hot-ID file" in err[0], err
    for field, value in (("world_size", float("inf")), ("world_size", "2"), ("batch_size_per_rank", 2.5)):
        (tmp_path / "plan.json").write_text(json.dumps({**plan, field: value}))
        rc = main(["run", str(tmp_path / "plan.json"), "--data", str(d / "data.tsv")])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and f"field {field}" in err[0] and "internal" not in err[0], err


def test_a_damaged_or_pickled_profile_npz_is_one_line(setup, tmp_path, capsys):
    d = setup
    assert main(["analyze", str(d / "data.tsv"), "--format", "criteo", "-o", str(tmp_path / "p.json")]) == 0
    capsys.readouterr()
    npz = tmp_path / "p.npz"
    good = npz.read_bytes()
    np.savez(npz, **{"f0_ids": np.array([object()], dtype=object)})  # a pickle inside
    for content in (None, good[: len(good) // 2]):
        if content is not None:
            npz.write_bytes(content)
        rc = main(["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "local-cpu", "--profile",
                   str(tmp_path / "p.json"), "-o", str(tmp_path / "plan.json")])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and "p.npz" in err[0] and "allow_pickle" not in err[0], err
