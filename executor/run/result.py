"""What a run returns: `RunResult`, written by rank 0 and read back by whoever started it.

The workers write it as JSON (`RunResult.to_json`) to a file `executor.process.launch` names; launch
reads it back with `RunResult.from_json` and returns it, `picasso run --json` prints it and
`picasso validate` measures with it. One schema, checked on both sides: a key the schema
does not know is an error, not something a reader guesses at.
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from foundation.documents import read_json


class ResultError(ValueError):
    """A run's result does not follow the schema (one line naming the field)."""


@dataclass
class Verify:
    """--verify's outcome: the trained weights against a single-process reference."""

    max_rel_diff: float
    embedding_rel_diff: float
    dense_rel_diff: float
    reference_moved: float  # how far the reference moved from its start (the check is not vacuous)
    tolerance: float
    passed: bool
    from_step: int = 0


@dataclass
class PeakMemory:
    """Measured peak per rank; `picasso run` adds the planner's prediction beside it."""

    measure: str
    measured_bytes_per_rank: list[float]
    host_rss_bytes_per_rank: list[float]
    predicted_bytes_per_rank: list[float] | None = None
    by_component: dict[str, float] | None = None
    predicted_host_bytes_per_rank: list[float] | None = None
    verify_reference_bytes: float | None = None
    predicted_bytes_per_rank_with_verify: list[float] | None = None
    measured_over_predicted: list[float | None] | None = None


@dataclass
class DataRead:
    """The training data as the ranks read it."""

    path: str
    kind: str  # "dataset" (a converted folder) or the text format
    steps_per_epoch: int | None = None
    epochs: int | None = None
    malformed_rows_skipped: int = 0
    first_malformed: str | None = None
    reading: str | None = None  # "row ranges", "byte ranges" or "whole stream per rank"
    note: str | None = None  # e.g. a gzip log every rank had to read whole


@dataclass
class Evaluation:
    """One evaluation on the held-out data (exact AUC over every rank's share)."""

    step: int
    rows: int
    auc: float
    logloss: float
    positive_rate: float
    seconds: float
    malformed_rows: int | None = None


@dataclass
class RunResult:
    plan: str  # the plan file
    model: str
    world_size: int
    backend: str
    device: str
    global_batch: int
    micro_batches: int
    dense_dtype: str
    steps: int
    timed_steps: int
    start_step: int
    samples_per_s: float  # over the timed steps, by the slowest rank's clock
    iteration_ms: dict[str, float]  # p50, p90, p99, mean of the timed steps
    mean_loss: float | None
    last_loss_rank0_share: float | None
    op_timing: bool
    data: DataRead
    peak_memory: PeakMemory
    step_ms: list[float] = field(default_factory=list)  # rank 0's timed steps, in order
    dense_dtype_note: str | None = None
    eval: list[Evaluation] = field(default_factory=list)
    predicted_samples_per_s: float | None = None
    measured_over_predicted_samples: float | None = None
    op_durations_us: dict[str, float] | None = None  # per op name: mean per timed step, with --op-timing
    trace: str | None = None
    timeline: str | None = None
    checkpoint: str | None = None
    verify: Verify | None = None
    resumed: dict[str, Any] | None = None  # checkpoint, data_position, the checkpoint's last_eval
    # per rank: mean ms per timed step waiting for input, and that share of the step
    input_wait: dict[str, list[float]] | None = None
    # per pack: cold and hot rows per micro-batch and rank against the plan's prediction
    # (executor.sparse.exchange_check), and the note naming packs that exchanged far more than planned
    exchange: dict[str, dict[str, float]] | None = None
    exchange_note: str | None = None
    # --cuda-graph: how many steps the captured graph served, or why it served none
    cuda_graph_note: str | None = None
    # per rank: the process's CPU ms (all its threads) per timed step; on shared cores, what a
    # step costs, steadier than its wall time when ranks take turns on the cores
    cpu_ms_per_step_per_rank: list[float] | None = None

    def iteration_us(self) -> float:
        """The median timed step in microseconds (0 when no step was timed)."""
        return float(self.iteration_ms.get("p50", 0.0)) * 1e3

    # ---- JSON ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain data; fields left unset (None) are left out, and `max_rel_diff` repeats
        the verify figure at the top level (a reader's one-key check of --verify)."""
        d = _drop_none(asdict(self))
        if self.verify is not None:
            d["max_rel_diff"] = self.verify.max_rel_diff
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, d: Any) -> RunResult:
        if not isinstance(d, dict):
            raise ResultError(f"a run result is a JSON object, got {type(d).__name__}")
        d = {k: v for k, v in d.items() if k != "max_rel_diff"}  # derived (to_dict)
        nested = {"data": DataRead, "peak_memory": PeakMemory, "verify": Verify}
        kw = _checked(cls, d, "result")
        for k, sub in nested.items():
            if kw.get(k) is not None:
                kw[k] = sub(**_checked(sub, kw[k], k))
        kw["eval"] = [Evaluation(**_checked(Evaluation, e, f"eval[{i}]")) for i, e in enumerate(kw.get("eval") or [])]
        return cls(**kw)

    @classmethod
    def load(cls, path: str | os.PathLike) -> RunResult:
        """A result saved by `picasso run --json > FILE`: bounded in size, nesting and numbers, any BOM."""
        try:
            d = read_json(path, "run result")
        except json.JSONDecodeError as exc:
            raise ResultError(f"{path}: a run result is not JSON (line {exc.lineno}: {exc.msg})") from None
        except (OSError, ValueError) as exc:
            raise ResultError(str(exc)) from None
        try:
            return cls.from_dict(d)
        except ResultError as exc:
            raise ResultError(f"{path}: {exc}") from None
        except (TypeError, ValueError) as exc:
            raise ResultError(f"{path}: not a run result ({type(exc).__name__}: {str(exc)[:120]})") from None

    @classmethod
    def from_json(cls, text: str) -> RunResult:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ResultError(f"a run result is not JSON (line {exc.lineno}: {exc.msg})") from None
        return cls.from_dict(d)


def _checked(cls: type, d: Any, where: str) -> dict[str, Any]:
    """`d`'s keys against the dataclass `cls`: none unknown, every required one present."""
    if not isinstance(d, dict):
        raise ResultError(f"{where}: expected an object, got {type(d).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise ResultError(f"{where}.{unknown[0]}: not a field of a run result (known: {', '.join(known)})")
    missing = [n for n, f in known.items() if n not in d and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ResultError(f"{where}.{missing[0]}: missing")
    return dict(d)



def _drop_none(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _drop_none(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_drop_none(v) for v in x]
    return x
