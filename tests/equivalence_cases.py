"""Shared by the distributed equivalence tests: run (plan, hot IDs, seed, steps) cases on
`world` ranks, in the session's shared group of that size (tests/shared_ranks.py), and hold
every rank's training against the single-process reference."""
from __future__ import annotations

from collections.abc import Callable

from executor.run.verify import equivalence_worker
from tests.shared_ranks import Call, SharedRanks, shared_call


def check_results(cases: list[tuple], results: list, tol: float, describe: Callable[[dict], object]) -> None:
    """Each case trained to the reference within `tol` (relative), and the weights moved;
    `describe(plan_dict)` names the failing plan."""
    assert len(results) == len(cases)
    for (plan_d, *_), res in zip(cases, results):
        assert res is not None
        assert res["max_rel_diff"] < tol, (describe(plan_d), res)
        assert res["reference_moved"] > 1e-3, res


def shared_cases(module: str, world: int, cases: list[tuple]) -> Call:
    """Register the cases for the tests of `module` in the session's shared `world`-rank group
    (tests/shared_ranks.py); assert_shared_cases_match reads them back."""
    return shared_call(module, world, equivalence_worker, cases)


def assert_shared_cases_match(shared_ranks: SharedRanks, call: Call, tol: float,
                              describe: Callable[[dict], object]) -> None:
    """A shared_cases registration, run in the shared group: see check_results."""
    check_results(call.args[0], shared_ranks(call)[0], tol, describe)
