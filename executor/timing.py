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
        """Resolve this step's events into the timeline."""
        if self.cuda and self._open:
            torch.cuda.synchronize()
        for name, lane, a, b in self._open:
            if isinstance(b, list):  # completion time from a future's callback
                b = self._completed(b)
            if self.cuda:
                s, e = self.origin.elapsed_time(a) * 1e3, self.origin.elapsed_time(b) * 1e3
            else:
                s, e = (a - self.t0) * 1e6, (b - self.t0) * 1e6
            self.timeline.add(self.rank, lane, name, s, max(e - s, 0.0), step=step)
        self._open = []

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


def percentiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0}
    a = np.asarray(xs)
    return {
        "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)), "mean": float(a.mean()),
    }
