"""One plan measured for real: run through the executor, its timeline read back and analysed."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from executor.process.launch import LaunchError, launch
from executor.run.config import RunConfig
from executor.run.result import RunResult
from simulator.measured import drop_warmup, load_timeline, mean_op_durations, merge_runs, step_times_us
from simulator.timeline import Timeline


class ValidateError(ValueError):
    """A stage of validation could not run; one line saying which and why."""


@dataclass
class Measured:
    iteration_us: float
    samples_per_s: float
    op_us: dict[str, float]  # mean duration per op name over ranks and timed steps
    timeline: Timeline  # timed steps only
    result: RunResult | None = None  # the executor's (first pass's when passes merge)
    wall_s: float = 0.0
    passes_iteration_us: list[float] = field(default_factory=list)
    timed_steps: int = 0


def run_measured(
    plan_path: Path, data: str, fmt: str, world: int, steps: int, warmup: int, out_dir: Path,
    timeout_s: float = 300.0, preload: bool = True, tag: str = "",
) -> Measured:
    """Run one saved plan through the executor (`executor.process.launch`) and read its measurements.

    The ranks run in their own processes; rank 0 writes the RunResult that launch returns.
    With `preload` every batch is read and prepared before the timed steps: the simulator
    predicts the training step, and a loader thread parsing the next batch meanwhile
    would add time it does not model (and more so at 4 ranks on 2 cores)."""
    trace = out_dir / f"{plan_path.stem}.measured{tag}.json"
    t0 = time.perf_counter()
    try:
        config = RunConfig(plan=str(plan_path), data=data, format=fmt, nproc=world, steps=steps + warmup,
                           warmup=warmup, timeline=str(trace), preload=preload)
        res = launch(config, timeout_s=timeout_s, progress=None)  # the sweep draws its own bar
    except (LaunchError, ValueError, OSError) as exc:
        raise ValidateError(f"run of {plan_path.name} failed: {exc}") from None
    wall = time.perf_counter() - t0
    try:
        timeline = load_timeline(trace)
    except (OSError, ValueError) as exc:
        raise ValidateError(f"run of {plan_path.name}: {exc}") from None
    return measured_from(res, drop_warmup(timeline, warmup), f"run of {plan_path.name}", wall)


def measured_from(res: RunResult, timed: Timeline, what: str, wall: float = 0.0) -> Measured:
    """A run's measurement from its result and its timed steps' trace: the executor's median
    step when it timed steps, else the median span of the timed steps in the trace."""
    it = res.iteration_us() if res.timed_steps else 0.0
    if it <= 0:
        spans = step_times_us(timed)
        if not spans:
            raise ValidateError(f"{what}: no timed step")
        it = float(np.median(spans))
    return Measured(it, res.samples_per_s, mean_op_durations(timed), timed, res, wall, [it], res.timed_steps)


def merge_passes(ms: list[Measured]) -> Measured:
    """One measurement from runs of the same plan at different moments: the iteration is
    the mean of the runs' medians; op durations and host gaps come from all their timed
    steps together (steps and times of run r shifted apart, so no two runs' steps mix)."""
    if len(ms) == 1:
        return ms[0]
    tl = merge_runs([m.timeline for m in ms])
    return Measured(float(np.mean([m.iteration_us for m in ms])), float(np.mean([m.samples_per_s for m in ms])),
                    mean_op_durations(tl), tl, ms[0].result, float(sum(m.wall_s for m in ms)),
                    [m.iteration_us for m in ms], sum(m.timed_steps for m in ms))


def timed_steps_for(predicted_us: float, min_steps: int, timed_s: float, max_steps: int) -> int:
    """Timed steps for a plan: at least `min_steps`, more until the (predicted) timed
    window reaches `timed_s` seconds, at most `max_steps`. A shared machine slows down in
    spells of a fraction of a second (steps of one run measured here: ten at 24 ms, then
    thirty at 18 ms), so a median over a few fast steps lands on whichever spell it met
    (run medians 17-21 ms over 5 steps, 19.0-20.0 ms over 40)."""
    if predicted_us <= 0 or timed_s <= 0:
        return min_steps
    want = int(np.ceil(timed_s * 1e6 / predicted_us))
    return int(max(min_steps, min(max_steps, want)))
