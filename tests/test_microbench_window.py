"""Calibration's compute samples time a window of calls, not one call after a barrier.

With 4 ranks on 2 cores, one short op timed after a barrier mostly ran alone (the ranks
are not scheduled together), so the 512-row GEMMs measured a whole core per rank and
`picasso plan` predicted the DCNv2 bench's dense part 2x too fast. A window of calls
longer than the scheduler's slices puts the ranks' sharing of the cores in the numbers.
"""

from __future__ import annotations

from executor.measure import microbench


class FakeClock:
    """A clock that each call of the timed function advances by `per_call_us`."""

    def __init__(self, per_call_us: float) -> None:
        self.t = 0.0
        self.per_call_us = per_call_us
        self.calls = 0

    def now(self) -> float:
        return self.t

    def op(self) -> None:
        self.calls += 1
        self.t += self.per_call_us / 1e6


def test_a_sample_is_the_time_per_call_over_a_window():
    clock = FakeClock(per_call_us=50.0)
    barriers = []
    us = microbench._time_us(clock.op, reps=3, barrier=lambda: barriers.append(clock.calls),
                             window_us=1_010.0, clock=clock.now)
    assert abs(us - 50.0) < 1e-9
    # one warm-up call, then each of the 3 windows takes calls of 50 us until it passes 1.01 ms
    assert clock.calls == 1 + 3 * 21
    # the ranks line up once per window, not once per call
    assert barriers == [1, 22, 43]


def test_a_call_longer_than_the_window_is_timed_once():
    clock = FakeClock(per_call_us=5_000.0)
    assert microbench._time_us(clock.op, reps=2, window_us=1_000.0, clock=clock.now) == 5_000.0
    assert clock.calls == 1 + 2


def test_compute_benchmarks_time_windows_and_report_per_call(monkeypatch):
    calls: list[tuple[float, int]] = []

    def spy(fn, reps, barrier=None, window_us=0.0, clock=None):
        calls.append((window_us, reps))
        return 1.0

    monkeypatch.setattr(microbench, "_time_us", spy)
    samples = (microbench.bench_gather(quick=True) + microbench.bench_pool(quick=True)
               + microbench.bench_gemm(shapes=((8, 4),), quick=True))
    assert samples and calls
    assert all(w == microbench.WINDOW_US > 0 for w, _ in calls)
    assert all(1 <= r <= 3 for _, r in calls)
    assert microbench.WINDOW_US >= 10_000  # longer than a Linux scheduler slice (a few ms)
