"""A checkpoint folder has one writer at a time: a second `picasso run --checkpoint` on it is
refused in one line before any rank starts, and prune never removes the version the manifest names."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from executor.process.process_tree import running
from picasso.cli import main
from tests.run_tree import ROOT, rank_pids, small_plan, wait_for


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory) -> Path:
    return small_plan(tmp_path_factory.mktemp("writers") / "plan.json")


@pytest.mark.dist
def test_a_second_writer_of_a_checkpoint_folder_is_refused(plan_path, tmp_path, capsys):
    ck = tmp_path / "ck"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen([sys.executable, "-m", "picasso", "run", str(plan_path), "--data", "synthetic",
                              "--steps", "100000000", "--checkpoint", str(ck), "--keep", "1"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        tree = wait_for(first, lambda t: t if len(rank_pids(t)) >= 2 else None,
                        what="the first run's workers did not start")
        t0 = time.monotonic()
        rc = main(["run", str(plan_path), "--data", "synthetic", "--steps", "2", "--checkpoint", str(ck)])
        took = time.monotonic() - t0
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and str(ck) in err[0] and "another picasso process" in err[0], err
        assert took < 10, took  # refused before any rank starts
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert running(tree) == {}
    # the lock went with the run that held it, however it ended
    assert main(["run", str(plan_path), "--data", "synthetic", "--steps", "1", "--checkpoint", str(ck)]) == 0
    assert (ck / "manifest.json").is_file()


def test_prune_never_removes_the_version_the_manifest_names(tmp_path, monkeypatch):
    import executor.run.checkpoint as ck

    def version(name: str) -> Path:
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text("{}")
        return tmp_path / name

    version("step-00000001-aaaaaa")
    version("step-00000002-bbbbbb")
    (tmp_path / "manifest.json").write_text(json.dumps({"dir": "step-00000002-bbbbbb"}))
    real = ck.versions
    calls = []

    def versions(folder):
        calls.append(folder)
        if len(calls) == 2:  # a save by another writer switches the folder while this prune runs
            new = version("step-00000003-cccccc")
            (tmp_path / "manifest.json").write_text(json.dumps({"dir": new.name}))
        return real(folder)

    monkeypatch.setattr(ck, "versions", versions)
    ck.prune(tmp_path, keep=1)
    assert (tmp_path / "step-00000003-cccccc").is_dir()
    assert not (tmp_path / "step-00000001-aaaaaa").exists()
