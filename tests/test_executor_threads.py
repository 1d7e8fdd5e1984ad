"""One thread policy (executor.process.threads) and one spawner of function ranks (executor.process.spawn.run_ranks),
used by the runs, the tests and the calibration microbenchmarks alike."""

from __future__ import annotations

import os

import pytest

from executor.process.spawn import run_ranks
from executor.process.threads import rank_env, threads_per_rank


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
    from executor.measure import microbench
    from executor.process import spawn

    calls = []

    def fake(fn, world, opts, timeout_s, threads):
        calls.append((fn.__name__, world, threads))
        return [[{"kind": "gather", "us": 2.0 + r}] for r in range(world)]

    monkeypatch.setattr(spawn, "run_ranks", fake)
    out = microbench.run_microbenchmarks(2, quick=True)
    assert calls == [("_rank", 2, threads_per_rank(2))]
    assert out == [{"kind": "gather", "us": 3.0, "threads": threads_per_rank(2), "nproc": 2}]  # slowest rank


def _who(rank: int, world: int) -> tuple[str | None, str | None, str]:
    import sys

    return os.environ.get("RANK"), os.environ.get("PICASSO_RENDEZVOUS"), sys.modules["__main__"].__spec__.name


def _fails_on_rank1(rank: int, world: int, how: str) -> int:
    import torch.distributed as dist

    if rank == 1:
        if how == "die":
            os._exit(7)
        raise ValueError("boom on rank 1")
    dist.barrier()  # rank 0 waits in a collective the failing rank never joins
    return 0


def test_function_ranks_are_started_by_the_one_launcher():
    # executor.process.agent.start_ranks: ranks are `python -m executor.process.rank_call` told their rank and
    # the store's address, as picasso run's workers are
    assert run_ranks(_who, 2) == [("0", "1", "executor.process.rank_call"), ("1", "1", "executor.process.rank_call")]


@pytest.mark.parametrize("how,expected", [("raise", "rank 1: ValueError: boom on rank 1"),
                                          ("die", "rank 1 died (exit code 7)")])
def test_the_failing_rank_is_blamed_not_its_peer(how, expected):
    with pytest.raises(RuntimeError) as err:
        run_ranks(_fails_on_rank1, 2, how, timeout_s=20)
    assert str(err.value).splitlines()[0] == expected


def test_a_local_function_is_refused_in_one_line():
    def local(rank, world):
        return rank

    with pytest.raises(ValueError, match="module-level function"):
        run_ranks(local, 2)
