"""One thread policy (executor.threads) and one spawner of function ranks (executor.spawn.run_ranks),
used by the runs, the tests and the calibration microbenchmarks alike."""

from __future__ import annotations

import os

import pytest

from executor.spawn import run_ranks
from executor.threads import rank_env, threads_per_rank


def _threads_seen(rank: int, world: int) -> tuple[int, str | None]:
    import torch

    return torch.get_num_threads(), os.environ.get("OMP_WAIT_POLICY")


def test_policy_shares_the_cores_and_waits_passively():
    cpus = os.cpu_count() or 1
    assert threads_per_rank(1) == cpus and threads_per_rank(cpus * 4) == 1
    assert rank_env(2) == {"OMP_NUM_THREADS": str(max(1, cpus // 2)), "OMP_WAIT_POLICY": "PASSIVE"}


@pytest.mark.dist
def test_function_ranks_follow_the_policy(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert run_ranks(_threads_seen, 1, threads=None) == [(threads_per_rank(1), "PASSIVE")]
    assert run_ranks(_threads_seen, 2) == [(1, "PASSIVE")] * 2  # tests' default: one thread per rank


def test_calibration_ranks_are_started_by_the_one_spawner(monkeypatch):
    from executor import microbench, spawn

    calls = []

    def fake(fn, world, opts, timeout_s, threads):
        calls.append((fn.__name__, world, threads))
        return [[{"kind": "gather", "us": 2.0 + r}] for r in range(world)]

    monkeypatch.setattr(spawn, "run_ranks", fake)
    out = microbench.run_microbenchmarks(2, quick=True)
    assert calls == [("_rank", 2, threads_per_rank(2))]
    assert out == [{"kind": "gather", "us": 3.0, "threads": threads_per_rank(2), "nproc": 2}]  # slowest rank
