"""A rank that stops answering (SIGSTOP: its process frozen, its sockets open) stops the run soon
after --timeout, the hung rank named, nothing left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from executor.process.process_tree import descendants, running
from executor.process.rendezvous import free_port
from tests.run_tree import ROOT, cmdline, end_of_run, rank_pids, small_plan, wait_for


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


def _ranks(proc: subprocess.Popen) -> dict[int, int]:
    """rank -> pid of the run's two workers, once both run."""
    def both(tree: dict[int, str]) -> dict[int, int] | None:
        found = {int(_environ(p).get("RANK", -1)): p for p in rank_pids(tree)}
        return found if {0, 1} <= set(found) else None

    return wait_for(proc, both)


@pytest.mark.dist
def test_a_frozen_rank_stops_the_run_naming_it(tmp_path):
    timeout_s = 6.0
    small_plan(tmp_path / "plan.json", micro_batches=2)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "picasso", "run", str(tmp_path / "plan.json"), "--data", "synthetic",
           "--steps", "100000000", "--timeout", str(timeout_s)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ranks = _ranks(proc)
    time.sleep(2.0)  # past the rendezvous, training
    tree = descendants(proc.pid)
    os.kill(ranks[1], signal.SIGSTOP)
    rank0_gone = None
    deadline = time.monotonic() + timeout_s + 60.0
    while proc.poll() is None and time.monotonic() < deadline:
        if rank0_gone is None and not running({ranks[0]: tree[ranks[0]]}):
            rank0_gone = time.monotonic()
        time.sleep(0.05)
    if proc.poll() is None:
        for pid in running({**tree, **descendants(proc.pid)}):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
    _, err = proc.communicate()
    ended = time.monotonic()
    left = running(tree)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    lines = err.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "rank 1 hung" in lines[0], err
    # rank 0 fails on its collective's timeout; the frozen rank goes at once, not after a grace period
    assert rank0_gone is not None and ended - rank0_gone < 3.0, ended - rank0_gone
    assert left == {}, [cmdline(p) for p in left]


FAILING_RANK = """
import os, signal, sys, time
import torch, torch.distributed as dist
import executor.run.worker as worker

def run_worker(args):
    comm, _ = worker.setup(args.timeout)
    x = torch.ones(64)
    dist.all_reduce(x)
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(0.3)
    pending = [dist.all_to_all_single(torch.empty(64), x, async_op=True) for _ in range(3)]
    print("failing", time.time(), flush=True)
    raise RuntimeError("bad rows")

worker.run_worker = run_worker
raise SystemExit(worker.main(sys.argv[1:]))
"""


@pytest.mark.dist
def test_a_failed_rank_does_not_wait_on_a_frozen_peer(tmp_path):
    """Leaving the group waits for its pending work, a collective timeout per op, when the
    peer is frozen: a rank that failed exits at once instead, its error line written."""
    timeout_s = 20.0
    (tmp_path / "rank.py").write_text(FAILING_RANK)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port("127.0.0.1")), "WORLD_SIZE": "2"}
    from executor.run.config import RunConfig

    RunConfig(plan="p.json", data="synthetic", timeout=timeout_s).save(tmp_path / "config.json")
    argv = [sys.executable, str(tmp_path / "rank.py"), str(tmp_path / "config.json")]
    peer = subprocess.Popen(argv, env={**env, "RANK": "1"})
    try:
        r0 = subprocess.run(argv, env={**env, "RANK": "0"}, capture_output=True, text=True, timeout=120)
        ended = time.time()
    finally:
        peer.kill()
        peer.wait()
    assert r0.returncode == 1 and "executor rank 0: error: bad rows" in r0.stderr, r0.stderr
    failing = float(r0.stdout.split()[1])
    assert ended - failing < timeout_s / 2, ended - failing


def _agent(proc: subprocess.Popen) -> int:
    """The run's launcher (python -m executor.process.agent), once both its ranks run."""
    _ranks(proc)
    return next(p for p in descendants(proc.pid) if "executor.process.agent" in cmdline(p))


@pytest.mark.dist
@pytest.mark.parametrize("then", ["wait", "sigterm", "dead"])
def test_a_frozen_launcher_stops_the_run_and_nothing_is_left(tmp_path, then):
    """The launcher stopped (SIGSTOP) is under the ranks' watch: the run ends within --timeout and
    a few seconds, saying so; SIGTERM meanwhile says it stopped only once every process is gone;
    a launcher killed outright takes its ranks with it at once."""
    timeout_s = 6.0
    small_plan(tmp_path / "plan.json", micro_batches=2)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "picasso", "run", str(tmp_path / "plan.json"), "--data", "synthetic",
           "--steps", "100000000", "--timeout", str(timeout_s)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    agent = _agent(proc)
    time.sleep(1.0)
    tree = descendants(proc.pid)
    os.kill(agent, signal.SIGSTOP)
    frozen = time.monotonic()
    if then == "sigterm":
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
    elif then == "dead":
        os.kill(agent, signal.SIGKILL)
    err, ended, left = end_of_run(proc, tree, timeout_s + 30.0)
    assert left == {}, [cmdline(p) for p in left]
    lines = err.strip().splitlines()
    if then == "wait":
        assert proc.returncode == 2 and len(lines) == 1 and "rank launcher" in lines[0] and "stopped" in lines[0], err
        assert ended - frozen < timeout_s + 10.0, ended - frozen
    elif then == "dead":
        assert proc.returncode == 2 and "killed by SIGKILL" in lines[-1], err
        assert ended - frozen < 10.0, ended - frozen
    else:
        assert proc.returncode == 128 + signal.SIGTERM and "stopped its processes" in lines[-1], err
