"""Shared by the distributed equivalence tests: run (plan, hot IDs, seed, steps) cases on
`world` ranks and hold every rank's training against the single-process reference."""
from __future__ import annotations

from collections.abc import Callable

from executor.process.spawn import run_ranks
from executor.verify import equivalence_worker


def assert_cases_match(world: int, cases: list[tuple], tol: float, describe: Callable[[dict], object]) -> None:
    """Each case trains to the reference within `tol` (relative), and the weights moved;
    `describe(plan_dict)` names the failing plan."""
    results = run_ranks(equivalence_worker, world, cases)[0]
    assert len(results) == len(cases)
    for (plan_d, *_), res in zip(cases, results):
        assert res is not None
        assert res["max_rel_diff"] < tol, (describe(plan_d), res)
        assert res["reference_moved"] > 1e-3, res
