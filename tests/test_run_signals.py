"""SIGINT/SIGTERM to `picasso run`: the whole process tree stops, temp folders go, exit 130/143."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from executor.process.process_tree import descendants, running, stop_tree
from tests.run_tree import ROOT, cmdline, rank_pids, small_plan, wait_for


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory) -> Path:
    return small_plan(tmp_path_factory.mktemp("sig") / "plan.json")


def _default_sigint() -> None:
    # a test run started in the background by a shell inherits SIGINT ignored, and Python then
    # keeps ignoring it: `picasso run` must start as a terminal would start it
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(plan_path: Path, tmp: Path) -> subprocess.Popen:
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "picasso", "run", str(plan_path), "--data", "synthetic", "--steps", "1000000",
           "--timeout", "60"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)


def _wait_for(proc: subprocess.Popen, workers: int) -> dict[int, str]:
    """The process tree once `workers` executor processes run (0: once the agent runs)."""
    return wait_for(proc, lambda tree: tree if any("-m executor.process.agent " in cmdline(p) for p in tree)
                    and len(rank_pids(tree)) >= workers else None, 90.0)


@pytest.mark.dist
@pytest.mark.parametrize("sig,workers,code", [(signal.SIGTERM, 2, 143), (signal.SIGINT, 2, 130), (signal.SIGTERM, 0, 143),
                                              (signal.SIGHUP, 2, 129)],
                         ids=["sigterm-training", "sigint-training", "sigterm-rendezvous", "sighup-training"])
def test_a_signal_stops_every_process_and_cleans_up(plan_path, tmp_path, sig, workers, code):
    proc = _start(plan_path, tmp_path / "tmp")
    tree = _wait_for(proc, workers)
    if workers:
        time.sleep(1.0)  # let them train
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        stop_tree(proc, seen={**tree, **descendants(proc.pid)})  # a failing test leaves nothing training
        raise
    tree.update(descendants(proc.pid))
    assert proc.returncode == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"interrupted by {signal.Signals(sig).name}" in lines[0], err
    time.sleep(0.2)
    assert running(tree) == {}, [cmdline(p) for p in running(tree)]
    assert not list((tmp_path / "tmp").glob("picasso-run-*"))  # temp folders removed


@pytest.mark.dist
def test_a_killed_run_takes_its_agent_and_ranks_with_it(plan_path, tmp_path):
    """SIGKILL (or the OOM killer) gives `picasso run` no chance to stop its tree: the agent and
    the ranks stop themselves when their parent ends (executor.process.process_tree.die_with_parent)."""
    proc = _start(plan_path, tmp_path / "tmp")
    tree = _wait_for(proc, 2)
    time.sleep(1.0)
    tree.update(descendants(proc.pid))
    proc.kill()
    proc.communicate()
    deadline = time.monotonic() + 30.0
    while running(tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = running(tree)
    if left:  # clean up before failing
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert left == {}, [cmdline(p) for p in left]


def _children_running(proc: subprocess.Popen, marker: str, count: int) -> dict[int, str]:
    return wait_for(proc, lambda tree: tree if sum(marker in cmdline(p) for p in tree) >= count else None,
                    what=f"no {count} processes with {marker!r} started")


@pytest.mark.dist
@pytest.mark.parametrize("command,marker,count", [
    (["calibrate", "--quick", "-o", "{tmp}/hw.json"], "executor.process.rank_call", 2),
    (["validate", "--data", "{tmp}/data.tsv", "--hardware", "local-cpu", "--plans", "3", "--fit-plans", "2",
      "--nproc-max", "2", "--row-cap", "200", "-o", "{tmp}/validate"], "-m executor ", 1),
], ids=["calibrate", "validate"])
def test_a_signal_stops_calibrate_and_validate_children(tmp_path, command, marker, count):
    from traces.synth import generate_criteo

    generate_criteo(tmp_path / "data.tsv", 2000, seed=0)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "picasso", *(a.format(tmp=tmp_path) for a in command)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tree = _children_running(proc, marker, count)
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 143, err
    assert "interrupted by SIGTERM" in err.strip().splitlines()[-1], err
    time.sleep(0.2)
    assert running(tree) == {}, [cmdline(p) for p in running(tree)]
    assert not [p.name for p in tmp.iterdir() if p.name.startswith(("picasso-", "tmp"))]  # temp folders removed


def test_a_stop_signal_while_the_child_starts_still_stops_it(monkeypatch):
    """SIGTERM that lands while subprocess.Popen is starting the child (the child exists, Popen
    has not returned): the child is stopped, not left running (seen once in CI: an agent
    outlived `picasso run` stopped during its rendezvous)."""
    import subprocess as sp

    from executor.process import process_tree
    from picasso.cli import Interrupted, _stop_signals_raise

    started: list[int] = []
    real_popen = sp.Popen

    def popen_then_signal(*args, **kwargs):
        p = real_popen(*args, **kwargs)
        started.append(p.pid)
        os.kill(os.getpid(), signal.SIGTERM)  # arrives before Popen returns
        for _ in range(100):  # give the handler every chance to run in here
            time.sleep(0.001)
        return p

    monkeypatch.setattr(process_tree.subprocess, "Popen", popen_then_signal)
    with pytest.raises(Interrupted), _stop_signals_raise():
        process_tree.run_tree([sys.executable, "-c", "import time; time.sleep(60)"], grace_s=2.0)
    assert started
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and process_tree._stat(started[0]) not in (None,) \
            and process_tree._stat(started[0])[0] not in ("Z", "X"):
        time.sleep(0.05)
    st = process_tree._stat(started[0])
    assert st is None or st[0] in ("Z", "X"), "the child outlived the interrupted launch"
