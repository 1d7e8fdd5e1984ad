"""Progress of long work on stderr, drawn by tqdm: the one owner of every bar picasso shows.

A bar is drawn only when stderr is a terminal and the command was not asked for `--json`
(`silence()`); otherwise every call is a no-op, so pipes, logs and tests see nothing. Without
tqdm installed the bars are silent too (progress is never a reason for a command to fail).

Ranks write to a log, not a terminal: rank 0 reports its steps (and a long phase such as the
first build of the native kernels) to the file named by $PICASSO_PROGRESS_FILE, and the process
that launched the ranks draws them (`RankProgressFile` writes it, `RankProgressWatcher` reads it).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

PROGRESS_FILE_ENV = "PICASSO_PROGRESS_FILE"
REDRAW_S = 0.2  # at most five redraws (or progress-file writes) a second

_silenced = False


def silence(quiet: bool = True) -> None:
    """No bar in this process from now on (a command's --json); `silence(False)` undoes it."""
    global _silenced
    _silenced = quiet


def drawing(enabled: bool | None = None) -> bool:
    """Whether a bar asked for with `enabled` (None: when stderr is a terminal) is drawn."""
    if _silenced or enabled is False:
        return False
    if enabled is None:
        try:
            enabled = sys.stderr.isatty()
        except (AttributeError, ValueError):
            return False
    return bool(enabled) and _tqdm() is not None


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


class Progress:
    """One bar. Callable as `progress(done, total)` (absolute position, what readers and writers
    report), or advanced with `update(n)`; `note(text)` sets the text after the counts (e.g. a
    plan's name, an error). `unit="B"` scales counts to k/M/G."""

    def __init__(self, label: str, total: float | None = None, unit: str = "", enabled: bool | None = None,
                 rate: str | None = None) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.rate_unit = rate  # e.g. "samples/s": a rate of this many per second shown beside the counts
        self._bar = None
        self._start = time.perf_counter()
        if drawing(enabled):
            self._bar = _tqdm()(total=total, desc=label, unit=unit or "it", unit_scale=unit == "B",
                                file=sys.stderr, leave=False, dynamic_ncols=True, mininterval=REDRAW_S,
                                # no end known: the count so far (none for a phase without counts) and the time
                                bar_format=None if total else "{desc}: " + ("{n_fmt} {unit} " if unit else "")
                                + "[{elapsed}{postfix}]")

    @property
    def drawn(self) -> bool:
        return self._bar is not None

    def __call__(self, done: float, total: float | None = None) -> None:
        if self._bar is None:
            return
        if total is not None and total != self._bar.total:
            self._bar.total = total
            self._bar.bar_format = None  # a bar with a known end: the default layout, with n/total
        self._bar.update(done - self._bar.n)

    def extend(self, n: float) -> None:
        """More work than first announced (another round of runs)."""
        if self._bar is not None and self._bar.total is not None:
            self._bar.total += n
            self._bar.refresh()

    def update(self, n: float = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def note(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def rate(self, per_s: float) -> None:
        """Show a throughput beside the counts (e.g. samples/s of a run's steps)."""
        if self._bar is not None and self.rate_unit:
            from foundation.numbers import count

            self._bar.set_postfix_str(f"{count(per_s)} {self.rate_unit}", refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def activity(label: str, enabled: bool | None = None) -> Iterator[None]:
    """A phase with no counts (a compiler run): its label and the seconds so far, redrawn by a
    timer thread; in a rank, written to the launcher's progress file instead."""
    reporter = RankProgressFile.from_env()
    if reporter is not None:
        reporter.phase(label)
        try:
            yield
        finally:
            reporter.phase("")
        return
    bar = Progress(label, enabled=enabled)
    if not bar.drawn:
        yield
        return
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(0.5):
            bar._bar.refresh()  # type: ignore[union-attr]

    ticker = threading.Thread(target=tick, name="picasso-progress", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()
        bar.close()


def say(line: str) -> None:
    """A line on stderr that does not tear a bar being drawn (tqdm clears it and redraws)."""
    tqdm = _tqdm() if drawing() else None
    if tqdm is not None:
        tqdm.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr, flush=True)


class RankProgressFile:
    """Rank 0's side: its steps done (and a phase in words) written to $PICASSO_PROGRESS_FILE,
    whole (temp + rename), at most every REDRAW_S."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._last = 0.0
        self._state: dict[str, Any] = {"done": 0, "total": 0, "samples": 0, "phase": ""}

    @classmethod
    def from_env(cls) -> RankProgressFile | None:
        path = os.environ.get(PROGRESS_FILE_ENV)
        return cls(path) if path else None

    def step(self, done: int, total: int, samples_per_step: int) -> None:
        self._state.update(done=done, total=total, samples=samples_per_step)
        now = time.perf_counter()
        if now - self._last >= REDRAW_S or done >= total:
            self._last = now
            self._write()

    def phase(self, label: str) -> None:
        self._state["phase"] = label
        self._write()

    def _write(self) -> None:
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(self._state, f)
            os.replace(tmp, self.path)
        except OSError:  # the launcher's folder went away: progress is not worth failing a run for
            pass


_rank_file: RankProgressFile | None = None


def rank_step(done: int, total: int, samples_per_step: int) -> None:
    """A rank's step `done` of `total` is over (the worker's one hook): reported to the launcher
    when it asked for progress ($PICASSO_PROGRESS_FILE), nothing otherwise."""
    global _rank_file
    if _rank_file is None or _rank_file.path != os.environ.get(PROGRESS_FILE_ENV):
        _rank_file = RankProgressFile.from_env()
    if _rank_file is not None:
        _rank_file.step(done, total, samples_per_step)


class RankProgressWatcher:
    """The launcher's side: reads the rank's progress file on each `poll()` and draws it as a bar of
    steps with samples/s (measured here, from the steps' arrival) and the rank's phase."""

    def __init__(self, path: str, label: str, enabled: bool | None = None) -> None:
        self.path = path
        self.bar = Progress(label, unit="step", enabled=enabled, rate="samples/s")
        self._first: tuple[float, int] | None = None

    @property
    def drawn(self) -> bool:
        return self.bar.drawn

    def poll(self) -> None:
        if not self.bar.drawn:
            return
        try:
            with open(self.path) as f:
                state = json.load(f)
        except (OSError, ValueError):
            return
        done, total = int(state.get("done", 0)), int(state.get("total", 0)) or None
        now = time.perf_counter()
        if state.get("phase"):
            self.bar.note(str(state["phase"]))
        elif done > 0:
            if self._first is None:
                self._first = (now, done)  # the first step includes start-up: the rate counts from here
            elif done > self._first[1]:
                self.bar.rate((done - self._first[1]) * int(state.get("samples", 0)) / (now - self._first[0]))
        self.bar(done, total)  # draws the counts with the text set above

    def close(self) -> None:
        self.bar.close()
