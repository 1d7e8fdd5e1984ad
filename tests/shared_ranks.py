"""Rank calls of many test modules, run in one process group per world size.

Starting a rank (a Python that imports torch) costs more than most tests' calls on it: a
4-rank group takes seconds to start on a 2-core machine. So a module registers its calls at
import (`shared_call`), and the session fixture `shared_ranks` (tests/conftest.py) runs every
registered call of the collected modules for one world size in one run_ranks, in
registration order, the first time a test asks for one of them; the test then reads its
call's per-rank results, as run_ranks would have returned them.

When that batch fails (a call raised, or the group timed out), each test runs its own call
alone, in a process group of its own, as before: a test fails with its own call's error,
never with another module's, and a test whose call passes alone passes with a warning
naming the batch's error.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from executor.process.spawn import run_ranks


@dataclass(eq=False)  # compared by identity: the calls' arguments hold arrays
class Call:
    module: str  # the registering test module (its tests are the ones that read the call)
    world: int
    fn: Callable[..., Any]
    args: tuple
    timeout_s: float  # run_ranks' timeout for the call alone


_CALLS: list[Call] = []


def shared_call(module: str, world: int, fn: Callable[..., Any], *args: Any, timeout_s: float = 60.0) -> Call:
    """Register fn(rank, world, *args) on `world` ranks for the tests of `module` (its __name__),
    as run_ranks(fn, world, *args, timeout_s=timeout_s) would run it.

    `fn` must be importable (a module-level function), must leave no state behind that
    changes a later call (a patched attribute is restored), and must not fail on purpose."""
    call = Call(module, world, fn, args, timeout_s)
    _CALLS.append(call)
    return call


def run_calls(rank: int, world: int, calls: list[tuple[Callable[..., Any], tuple]]) -> list:
    """The ranks' side of a batch: each call in order; this rank's result of each."""
    return [fn(rank, world, *args) for fn, args in calls]


class SharedRanks:
    """Per world size, the batch of the registered calls of `modules`, run on first use."""

    def __init__(self, modules: Iterable[str]) -> None:
        self.modules = set(modules)
        self.done: dict[int, dict[Call, list] | BaseException] = {}

    def __call__(self, call: Call) -> list:
        """`call`'s results in rank order."""
        if call.world not in self.done:
            self.done[call.world] = self._batch(call.world)
        got = self.done[call.world]
        if isinstance(got, dict) and call in got:
            return got[call]
        results = run_ranks(call.fn, call.world, *call.args, timeout_s=call.timeout_s)
        if isinstance(got, BaseException):
            first = str(got).splitlines()[0] if str(got) else type(got).__name__
            warnings.warn(f"the shared {call.world}-rank batch failed ({first}); this call passed alone",
                          stacklevel=2)
        return results

    def _batch(self, world: int) -> dict[Call, list] | BaseException:
        batch = [c for c in _CALLS if c.world == world and c.module in self.modules]
        if not batch:  # a call of a module whose tests were not collected: it runs alone
            return {}
        try:
            # the calls' own collective timeout; run_ranks gives the whole group three times it
            # (the batches take well under one timeout; past the deadline the calls run alone)
            per_rank = run_ranks(run_calls, world, [(c.fn, c.args) for c in batch],
                                 timeout_s=max(c.timeout_s for c in batch))
        except RuntimeError as exc:
            return exc
        return {c: [r[i] for r in per_rank] for i, c in enumerate(batch)}
