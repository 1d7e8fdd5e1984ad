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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

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
