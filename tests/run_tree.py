"""What the tests that start a real `picasso run` and watch its process tree share: a small
two-rank plan, a process's command line, and waiting until the tree is in a given state."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

from executor.process.process_tree import descendants, running
from planner.plan import PackPlan, Plan
from planner.presets import get_model

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def small_plan(path: Path, micro_batches: int = 1, bottom: int = 8) -> Path:
    """A two-rank row-wise plan of the capped Criteo model, with hot rows, saved at `path`."""
    m = replace(get_model("dlrm-criteo-kaggle").with_row_cap(200), bottom_mlp=(bottom, 16), top_mlp=(8, 1))
    plan = Plan(m, 2, 16, [PackPlan("pack0", m.table_names, "row_wise")], hot_rows={"C1": 10},
                micro_batches=micro_batches)
    plan.save(path, hot_ids={"C1": np.arange(10)})
    return path


def cmdline(pid: int) -> str:
    """A process's command line, its arguments joined by spaces ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def rank_pids(tree: dict[int, str] | list[int]) -> list[int]:
    """The executor worker processes among `tree`'s."""
    return [p for p in tree if "-m executor " in cmdline(p)]


def wait_for(proc: subprocess.Popen, ready: Callable[[dict[int, str]], T | None], limit_s: float = 120.0,
             what: str = "the workers did not start") -> T:
    """Poll `proc`'s process tree until `ready(tree)` returns something (not None, not empty) and
    return it; the test fails with `what` past `limit_s`, or at once with proc's output if it ended."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        got = ready(descendants(proc.pid))
        if got:
            return got
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.kill()
    pytest.fail(what)


def end_of_run(proc: subprocess.Popen, tree: dict[int, str], limit_s: float) -> tuple[str, float, dict[int, str]]:
    """Wait up to `limit_s` for `proc` to end: (its stderr, or "still running"; when it ended or the
    wait ran out, on the monotonic clock; what of `tree` it left running, read at once and then killed,
    as is `proc` if still there)."""
    try:
        _, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        err = "still running"
    ended = time.monotonic()
    left = running(tree)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()
        proc.communicate()
    return err, ended, left
