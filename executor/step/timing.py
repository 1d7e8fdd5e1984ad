"""Per-op timing under the op names of lowering (planner.op_names).

CPU: wall clock (time.perf_counter, the same monotonic clock for every process of a
machine; ranks align their origin on a barrier). GPU: CUDA events, resolved at the end
of each step against an origin event. Asynchronous collectives are timed on lane "comm"
from launch to their completion: on CPU (gloo) the completion time is taken by a callback
on the work's future (`end_when_done`), so the event is the collective's own span, not the
time until the trainer got round to waiting for it (which holds whatever ran meanwhile);
where no future is available, to the return of the wait. Everything else on lane "compute".
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager

import numpy as np
import torch

from planner.op_names import op_name
from simulator.timeline import Timeline


class OpTimer:
    def __init__(self, rank: int, device: torch.device, enabled: bool = True, micro_batches: int = 1) -> None:
        self.rank = rank
        self.enabled = enabled
        self.cuda = device.type == "cuda"
        self.k = micro_batches
        self.timeline = Timeline(meta={"source": "measured", "rank": rank})
        self.step_times: list[float] = []
        self._open: list[tuple] = []
        self._steps: list[tuple[int, list]] = []  # CUDA: closed steps' events, resolved by `finish`
        self.reset_origin()

    def reset_origin(self) -> None:
        self.t0 = time.perf_counter()
        if self.cuda:
            self.origin = torch.cuda.Event(enable_timing=True)
            self.origin.record()

    def name(self, phase: str, scope: str, op: str, mb: int | None) -> str:
        return op_name(phase, scope, op, mb if self.k > 1 else None)

    def _now(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def start(self, phase: str, scope: str, op: str, mb: int | None = None, lane: str = "compute"):
        if not self.enabled:
            return None
        return (self.name(phase, scope, op, mb), lane, self._now())

    def end(self, token) -> None:
        if token is not None:
            self._open.append((*token, self._now()))

    def end_when_done(self, token, work) -> None:
        """End `token` when the collective `work` completes (CPU: a callback on its future
        records the time). Call it right after the launch; a work without a future (a
        synchronous one, or the single-process stand-in) ends now."""
        if token is None:
            return
        fut = None
        if not self.cuda and work is not None and hasattr(work, "get_future"):
            try:
                fut = work.get_future()
            except RuntimeError:  # a backend or op without futures
                fut = None
        if fut is None:
            self.end(token)
            return
        slot: list[float] = []
        fut.then(lambda _f, slot=slot: slot.append(time.perf_counter()))
        self._open.append((*token, slot))

    @contextmanager
    def op(self, phase: str, scope: str, op: str, mb: int | None = None, lane: str = "compute"):
        tok = self.start(phase, scope, op, mb, lane)
        try:
            yield
        finally:
            self.end(tok)

    def flush(self, step: int) -> None:
        """Close this step's events. CUDA events stay unresolved until `finish` (resolving them
        waits for the device); wall-clock ones go into the timeline now."""
        if self.cuda:
            self._steps.append((step, self._open))
            self._open = []
            return
        self._resolve(step, self._open)
        self._open = []

    def finish(self) -> None:
        """Resolve every step's CUDA events: one synchronisation for the whole run."""
        if self._steps:
            torch.cuda.synchronize()
        for step, events in self._steps:
            self._resolve(step, events)
        self._steps = []

    def _resolve(self, step: int, events: list) -> None:
        for name, lane, a, b in events:
            if isinstance(b, list):  # completion time from a future's callback
                b = self._completed(b)
            if self.cuda:
                s, e = self.origin.elapsed_time(a) * 1e3, self.origin.elapsed_time(b) * 1e3
            else:
                s, e = (a - self.t0) * 1e6, (b - self.t0) * 1e6
            self.timeline.add(self.rank, lane, name, s, max(e - s, 0.0), step=step)

    @staticmethod
    def _completed(slot: list[float]) -> float:
        """The callback's time; by the end of a step every collective has been waited on, so
        the callback has run or is about to (it runs on the backend's thread)."""
        for _ in range(1000):
            if slot:
                return slot[0]
            time.sleep(1e-4)
        return time.perf_counter()

    def discard(self) -> None:
        self._open = []


class StepClock:
    """Whole-step times. CPU: the wall clock (every op has finished when `step` returns). GPU:
    events recorded in the stream around each step, read once at the end, so timing a step
    never makes the host wait for it."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._spans: list[tuple] = []
        self._t0: object = None
        # this process's CPU time (all threads: gloo's, the loader's) from the first timed step's
        # start to the last one's end, and at the start of the step under way
        self._cpu_first: float | None = None
        self._cpu_last: float | None = None
        self._cpu_start = 0.0

    def start(self) -> None:
        self._cpu_start = time.process_time()
        if self.cuda:
            self._t0 = torch.cuda.Event(enable_timing=True)
            self._t0.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self, timed: bool = True) -> None:
        if not timed:
            return
        if self._cpu_first is None:
            self._cpu_first = self._cpu_start
        self._cpu_last = time.process_time()
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._spans.append((self._t0, end))
        else:
            self._spans.append((self._t0, time.perf_counter()))

    def cpu_seconds_per_step(self) -> float | None:
        """CPU seconds this process spent per timed step, between steps included (None: none timed)."""
        if self._cpu_first is None or self._cpu_last is None or not self._spans:
            return None
        return (self._cpu_last - self._cpu_first) / len(self._spans)

    def seconds(self) -> list[float]:
        """Every timed step's duration (GPU: waits for the device once)."""
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) * 1e-3 for a, b in self._spans]
        return [b - a for a, b in self._spans]


class NonFiniteLoss(RuntimeError):
    """Training produced a NaN or infinite loss."""


class LossLog:
    """Per-step losses kept on the device and read back every `every` steps (one transfer),
    which is also when a non-finite loss stops the run, naming its step."""

    def __init__(self, first_step: int, every: int) -> None:
        self.first = first_step
        self.every = every
        self._pending: list[torch.Tensor] = []
        self._values: list[float] = []

    def add(self, loss: torch.Tensor | float) -> None:
        self._pending.append(torch.as_tensor(loss, dtype=torch.float64).reshape(()))
        if len(self._pending) >= self.every:
            self._read()

    def _read(self) -> None:
        if not self._pending:
            return
        vals = torch.stack([t.to(self._pending[0].device) for t in self._pending]).tolist()
        self._pending = []
        for v in vals:
            if not math.isfinite(v):
                step = self.first + len(self._values)
                raise NonFiniteLoss(
                    f"the loss became {v} at step {step}: training diverged (check the plan's learning rates "
                    "and eps, and that the labels are 0 or 1)"
                )
            self._values.append(v)

    def values(self) -> list[float]:
        self._read()
        return list(self._values)


def percentiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0}
    a = np.asarray(xs)
    return {
        "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)), "mean": float(a.mean()),
    }
