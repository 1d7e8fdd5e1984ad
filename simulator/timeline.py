"""Timeline: the events of one or more iterations, predicted or measured.

Both the simulator and the executor write it; Chrome trace-event JSON (Perfetto) out.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from foundation.documents import read_json
from foundation.files import atomic_write_text


@dataclass
class Event:
    rank: int
    lane: str
    name: str
    start_us: float
    dur_us: float
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


@dataclass
class Counter:
    """Named numbers at one moment (e.g. a model's quality at a step): a counter track in the trace."""

    rank: int
    name: str
    ts_us: float
    values: dict[str, float]
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class Timeline:
    events: list[Event] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)  # source (simulated/measured), hardware, plan ...
    counters: list[Counter] = field(default_factory=list)

    def count(self, rank: int, name: str, ts_us: float, values: dict[str, float], **args: Any) -> None:
        """Record finite `values` at ts_us (a NaN is left out: trace viewers reject it)."""
        finite = {k: float(v) for k, v in values.items() if v is not None and float(v) == float(v)}
        self.counters.append(Counter(rank, name, float(ts_us), finite, args))

    def add(self, rank: int, lane: str, name: str, start_us: float, dur_us: float, **args: Any) -> None:
        self.events.append(Event(rank, lane, name, float(start_us), float(dur_us), args))

    def makespan_us(self) -> float:
        if not self.events:
            return 0.0
        return max(e.end_us for e in self.events) - min(e.start_us for e in self.events)

    def to_dict(self) -> dict[str, Any]:
        out = {"meta": self.meta, "events": [asdict(e) for e in self.events]}
        if self.counters:
            out["counters"] = [asdict(c) for c in self.counters]
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Timeline:
        return cls([Event(**e) for e in d.get("events", [])], dict(d.get("meta", {})),
                   [Counter(**c) for c in d.get("counters", [])])

    def save(self, path: str | os.PathLike) -> None:
        atomic_write_text(path, json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Timeline:
        try:
            d = read_json(path, "timeline")  # bounded in size, nesting and numbers; any BOM
        except json.JSONDecodeError as exc:
            raise ValueError(f"{Path(path)}: a timeline is not JSON (line {exc.lineno}: {exc.msg})") from None
        try:
            return cls.from_dict(d)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{Path(path)}: not a timeline ({type(exc).__name__}: {exc})") from None

    def to_chrome_trace(self) -> dict[str, Any]:
        """Trace-event JSON: one process per rank, one thread per lane."""
        lanes = sorted({(e.rank, e.lane) for e in self.events})
        tid = {key: i for i, key in enumerate(lanes)}
        out: list[dict[str, Any]] = []
        for rank in sorted({r for r, _ in lanes}):
            out.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        for (rank, lane), t in tid.items():
            out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": t, "args": {"name": lane}})
        for e in self.events:
            out.append({
                "ph": "X", "name": e.name, "pid": e.rank, "tid": tid[(e.rank, e.lane)],
                "ts": e.start_us, "dur": e.dur_us, "args": e.args,
            })
        for c in self.counters:  # a counter track per name, and an instant marker with the details
            out.append({"ph": "C", "name": c.name, "pid": c.rank, "ts": c.ts_us, "args": c.values})
            out.append({"ph": "i", "s": "p", "name": c.name, "pid": c.rank, "tid": 0, "ts": c.ts_us,
                        "args": {**c.values, **c.args}})
        return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": self.meta}

    def save_chrome_trace(self, path: str | os.PathLike) -> None:
        atomic_write_text(path, json.dumps(self.to_chrome_trace()))
