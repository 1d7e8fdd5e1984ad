"""A dependency-free progress bar on stderr, silent when stderr is not a terminal."""

from __future__ import annotations

import sys
import time


class Progress:
    """Callable `progress(done, total)`; draws at most ten times a second."""

    def __init__(self, label: str, enabled: bool | None = None, unit: str = "B") -> None:
        self.label = label
        self.unit = unit
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._last = 0.0
        self._start = time.perf_counter()

    def __call__(self, done: float, total: float | None = None) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last < 0.1 and (total is None or done < total):
            return
        self._last = now
        rate = done / max(now - self._start, 1e-9)
        if total:
            frac = min(done / total, 1.0)
            bar = "#" * int(frac * 30)
            text = f"\r{self.label} [{bar:<30}] {frac:6.1%} {human(rate)}{self.unit}/s"
        else:
            text = f"\r{self.label} {human(done)}{self.unit} {human(rate)}{self.unit}/s"
        sys.stderr.write(text)
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def human(x: float) -> str:
    for unit in ("", "k", "M", "G", "T"):
        if abs(x) < 1000:
            return f"{x:.1f}{unit}"
        x /= 1000
    return f"{x:.1f}P"
