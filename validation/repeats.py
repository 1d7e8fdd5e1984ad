"""Plans measured several times, interleaved, so a comparison between them knows its noise.

A shared machine slows down in spells: one run of a plan can land in a slow spell and another
plan's in a fast one (the same plan measured 91 ms and 33 ms in two passes). Each plan is run
`repeats` times, the plans taking turns, and is reported by the median of its runs with their
spread, (max - min) / median. The typical spread is the median over the plans; a plan whose
own runs disagree by more than NOISY_FACTOR times that is flagged, and a speedup smaller than
the two plans' spreads together is called unresolved. Samples/s is derived from the same
median iteration, so "faster by ms" and "faster by samples/s" can never disagree.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from foundation.numbers import percent

NOISY_FACTOR = 2.0  # a plan's runs disagreeing by more than this times the typical spread
SPREAD_FLOOR = 0.02  # below 2% the spread is the timer's, not the machine's: never flag under it


@dataclass
class Repeated:
    """One plan's iteration times over its repeated runs (microseconds, one per run)."""

    name: str
    global_batch: int
    runs_us: list[float] = field(default_factory=list)

    @property
    def median_us(self) -> float:
        return float(np.median(self.runs_us))

    @property
    def spread(self) -> float:
        """(max - min) / median of the runs: 0 for one run."""
        m = self.median_us
        return (max(self.runs_us) - min(self.runs_us)) / m if m > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        """Throughput at the median iteration: the same ranking as the iteration time."""
        m = self.median_us
        return self.global_batch * 1e6 / m if m > 0 else 0.0


def measure_interleaved(names: Sequence[str], repeats: int, measure: Callable[[str, int], float],
                        global_batch: Callable[[str], int]) -> dict[str, Repeated]:
    """`measure(name, r)` (an iteration in us) for every plan, `repeats` rounds, the plans taking
    turns in each round, so a slow spell of the machine falls on several plans, not all of one."""
    out = {n: Repeated(n, global_batch(n)) for n in names}
    for r in range(repeats):
        for n in names:
            out[n].runs_us.append(float(measure(n, r)))
    return out


def typical_spread(reps: dict[str, Repeated]) -> float:
    """The machine's noise over these measurements: the median spread of the plans."""
    spreads = [r.spread for r in reps.values() if len(r.runs_us) > 1]
    return float(np.median(spreads)) if spreads else 0.0


def noisy(rep: Repeated, typical: float) -> bool:
    """A plan whose runs disagree by more than NOISY_FACTOR times the typical spread: its median
    is not to be trusted alone."""
    return len(rep.runs_us) > 1 and rep.spread > NOISY_FACTOR * max(typical, SPREAD_FLOOR)


@dataclass
class Speedup:
    """A plan's speedup over a baseline from repeated runs, and whether the runs resolve it."""

    ratio: float  # baseline median / plan median
    resolved: bool  # the difference exceeds both plans' spreads together

    def text(self) -> str:
        return f"{self.ratio:.2f}x" + ("" if self.resolved else " (within noise)")


def speedup(mine: Repeated, base: Repeated) -> Speedup:
    ratio = base.median_us / mine.median_us if mine.median_us > 0 else float("nan")
    noise = mine.spread + base.spread
    return Speedup(ratio, abs(ratio - 1.0) > noise)


def measure_until_decided(names: Sequence[str], min_rounds: int, max_rounds: int,
                          measure: Callable[[str, int], float], global_batch: Callable[[str], int],
                          on_round: Callable[[int, list[str]], None] | None = None) -> dict[str, Repeated]:
    """As `measure_interleaved`, the first name against each other, but only as long as it takes:
    `min_rounds` rounds of every plan, then rounds of the first plan and the baselines whose
    comparison with it is still inside the runs' spread, up to `max_rounds`. `on_round(r, names)`
    is told each round's plans before it runs."""
    mine, *others = names
    out = {n: Repeated(n, global_batch(n)) for n in names}
    for r in range(max_rounds):
        undecided = [n for n in others if r < min_rounds or not speedup(out[mine], out[n]).resolved]
        if not undecided:
            break
        todo = [mine, *undecided]
        if on_round is not None:
            on_round(r, todo)
        for n in todo:
            out[n].runs_us.append(float(measure(n, r)))
    return out


class Verdict(str, Enum):
    FASTER = "faster"
    SLOWER = "slower"
    UNDECIDED = "undecided"


@dataclass
class Comparison:
    """The plan against one baseline, from repeated runs: the verdict and its numbers."""

    baseline: str
    ratio: float  # baseline median / plan median: > 1 means the plan is faster
    difference: float  # |ratio - 1|
    spread_mine: float
    spread_base: float
    runs_mine: int
    runs_base: int
    verdict: Verdict

    def text(self, load: MachineLoad | None = None) -> str:
        """One sentence a user can act on; undecided says why, with the numbers, and what to do."""
        spreads = f"the runs' spreads ({percent(self.spread_mine)} + {percent(self.spread_base)})"
        if self.verdict != Verdict.UNDECIDED:
            word = "faster" if self.verdict == Verdict.FASTER else "slower"
            return (f"picasso's plan is {word} than {self.baseline}, {self.ratio:.2f}x: the difference, "
                    f"{percent(self.difference)}, is larger than {spreads} over {self.runs_mine} and "
                    f"{self.runs_base} runs")
        busy = f"; {load.text()}" if load is not None else ""
        todo = ("rerun with more --max-run-repeats or --steps" if load is None or not load.busy else
                "rerun when the machine is quiet, or with more --max-run-repeats")
        return (f"against {self.baseline}: undecided, because the difference, {percent(self.difference)} "
                f"({self.ratio:.2f}x), is inside {spreads} after {self.runs_mine} and {self.runs_base} runs{busy}; "
                f"to decide, {todo}")


def compare_to(mine: Repeated, base: Repeated) -> Comparison:
    s = speedup(mine, base)
    verdict = Verdict.UNDECIDED if not s.resolved else (Verdict.FASTER if s.ratio > 1 else Verdict.SLOWER)
    return Comparison(base.name, s.ratio, abs(s.ratio - 1.0), mine.spread, base.spread, len(mine.runs_us),
                      len(base.runs_us), verdict)


@dataclass
class MachineLoad:
    """The load average over the measurements against the cores: others' work on the cores is
    the usual cause of a wide spread."""

    load_start: float
    load_end: float
    cores: int

    @classmethod
    def now(cls) -> MachineLoad:
        one = _load()
        return cls(one, one, os.cpu_count() or 1)

    def ended(self) -> MachineLoad:
        return MachineLoad(self.load_start, _load(), self.cores)

    @property
    def busy(self) -> bool:
        """More runnable work than cores beyond the measurement's own ranks' share."""
        return max(self.load_start, self.load_end) > self.cores

    def text(self) -> str:
        return (f"load average {self.load_start:.1f} at the start and {self.load_end:.1f} at the end on "
                f"{self.cores} cores" + (" (other work shares the cores)" if self.busy else ""))


def _load() -> float:
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):  # not available on this platform
        return 0.0
