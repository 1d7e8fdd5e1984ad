"""Predicted against measured: the prediction of a plan, and the comparison arithmetic."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from executor.run.result import RunResult
from planner.access import TableAccess, table_access
from planner.builders import Case
from planner.op_names import base_name, op_class, split_name
from planner.plan import Plan
from planner.search import evaluate
from simulator.calibration import class_key
from simulator.hardware import HardwareSpec
from simulator.measured import mean_op_durations
from simulator.timeline import Timeline
from validation.measure import Measured, ValidateError

if TYPE_CHECKING:  # types only: the seams' own classes, not loaded at import
    from traces.profile import AccessProfile


DOMINANT_SHARE = 0.8  # per-op errors for the ops making up this share of measured op time
MAX_DOMINANT = 6


@dataclass
class Predicted:
    iteration_us: float
    op_us: dict[str, float]
    timeline: Timeline
    graph: Any = None


def predict(plan: Plan, hw: HardwareSpec, profile: AccessProfile | None = None, access: dict[str, TableAccess] | None = None,
            engine: str = "fast") -> Predicted:
    """The prediction of one iteration, through the one path `picasso plan` and `simulate`
    take (planner.search.evaluate: the spec of the plan's world size, its calibration applied
    by the cost model); the memory check is left to the run."""
    ev = evaluate(plan, hw, access if access is not None else table_access(plan.model, profile), engine,
                  symmetric=None, check_memory=False)
    if ev.iteration_us is None:
        raise ValidateError(f"plan {plan.provenance.label or ''}: {ev.problem}")
    tl = ev.result.timeline
    return Predicted(float(ev.iteration_us), mean_op_durations(tl), tl, ev.graph)


def unfitted_classes(graph: Any, world: int, fitted: dict[str, Any],
                     measured: dict[str, float] | None = None) -> list[str]:
    """The op classes of a lowered graph that the fit plans never ran at its world size
    (`fitted`: refit_on_runs' report of op classes, with the worlds each was fitted at):
    their coefficients there are extrapolated from other worlds or from the
    microbenchmarks, so a plan made of them is predicted with less behind it. With `measured`
    (the plan's own per-op times) only ops its run measured count: an op this device does not
    run (the next batch's host-to-device copy on a CPU rank) is in every plan and says nothing."""
    out = set()
    for _, a in graph.ops():
        if measured is not None and not measured.get(a["name"]):
            continue
        cls = class_key(op_class(a["name"]), a.get("collective") is not None)
        if str(int(world)) not in (fitted.get(cls) or {}).get("worlds", {}):
            out.add(cls)
    return sorted(out)


def dominant_ops(measured: dict[str, float], share: float = DOMINANT_SHARE, most: int = MAX_DOMINANT) -> list[str]:
    """The ops that make up `share` of the measured op time, largest first."""
    total = sum(measured.values()) or 1.0
    out, acc = [], 0.0
    for name, v in sorted(measured.items(), key=lambda kv: -kv[1]):
        if acc >= share * total or len(out) >= most:
            break
        out.append(name)
        acc += v
    return out


def by_base_name(op_us: dict[str, float]) -> dict[str, float]:
    """Per-step op time summed over micro-batches (`@mbK` dropped): the executor and lowering
    may split an op over micro-batches differently (the input copy), the sum compares."""
    out: dict[str, float] = defaultdict(float)
    for k, v in op_us.items():
        out[base_name(k)] += v
    return dict(out)


def compare(case: Case, m: Measured, p: Predicted) -> dict[str, Any]:
    err = (p.iteration_us - m.iteration_us) / m.iteration_us
    ops = [asdict(o) for o in op_comparisons(by_base_name(m.op_us), by_base_name(p.op_us))]
    return {
        "name": case.name, "role": case.role, "knobs": case.knobs,
        "measured_us": round(m.iteration_us, 1), "predicted_us": round(p.iteration_us, 1),
        "error": round(err, 4), "abs_error": round(abs(err), 4),
        "samples_per_s": round(m.samples_per_s, 1), "dominant_ops": ops,
        "run_wall_s": round(m.wall_s, 2),
    }


def summary(records: list[dict[str, Any]], key_pred: str = "predicted_us") -> dict[str, Any]:
    """MAPE, Spearman and Pearson over records (predicted vs measured iteration)."""
    from scipy.stats import pearsonr, spearmanr  # scipy loads on demand

    meas = np.array([r["measured_us"] for r in records], dtype=float)
    pred = np.array([r[key_pred] for r in records], dtype=float)
    if len(meas) == 0:
        return {"plans": 0, "mape": None, "spearman": None}
    ape = np.abs(pred - meas) / meas
    out: dict[str, Any] = {
        "plans": int(len(meas)),
        "mape": float(ape.mean()),
        "median_ape": float(np.median(ape)),
        "max_ape": float(ape.max()),
        "within_10pct": int((ape <= 0.10).sum()),
    }
    why = spearman_gap(meas, pred)
    if why is None:
        rho = float(spearmanr(pred, meas).statistic)
        out["spearman"] = rho if math.isfinite(rho) else None
        out["pearson"] = float(pearsonr(pred, meas).statistic)
        why = None if math.isfinite(rho) else "the ranks are undefined (ties throughout)"
    else:
        out["spearman"] = None
    if why is not None:
        out["spearman_reason"] = why
    return out


def spearman_gap(meas: np.ndarray, pred: np.ndarray) -> str | None:
    """Why no rank correlation can be computed over these plans (None: it can)."""
    if len(meas) < 3:
        return f"{len(meas)} plan(s): a rank correlation needs at least 3"
    if np.ptp(meas) == 0:
        return "every plan measured the same step time: no order to compare with"
    if np.ptp(pred) == 0:
        return "every plan predicted the same step time: no order to compare"
    return None


def spearman_text(s: dict[str, Any]) -> str:
    """Spearman as a number, or the reason there is none."""
    return f"{s['spearman']:.3f}" if s.get("spearman") is not None else f"n/a ({s.get('spearman_reason', 'no plans')})"


def op_error_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per base op (micro-batch suffix dropped, pack names generalised): mean signed and
    absolute error over the plans where it dominated."""
    acc: dict[str, list[float]] = defaultdict(list)
    for r in records:
        for o in r["dominant_ops"]:
            if o["error"] is None:
                continue
            phase, scope, op, _ = split_name(base_name(o["op"]))
            scope = scope if scope in ("dense", "input") else "pack"
            acc[f"{phase}/{scope}/{op}"].append(o["error"])
    return {k: {"n": len(v), "mean_error": round(float(np.mean(v)), 4),
                "mean_abs_error": round(float(np.mean(np.abs(v))), 4)} for k, v in sorted(acc.items())}


@dataclass
class OpComparison:
    op: str  # base name: summed over micro-batches
    measured_us: float
    predicted_us: float | None  # None: lowering has no op of that name
    error: float | None  # (predicted - measured) / measured


@dataclass
class RunComparison:
    """One finished run against the plan's prediction on the same spec: the step, and its
    largest ops (measured per-op times need `picasso run --op-timing`)."""

    measured_us: float
    predicted_us: float
    error: float
    ops: list[OpComparison]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        lines = [f"step         measured {self.measured_us / 1e3:.2f} ms, predicted {self.predicted_us / 1e3:.2f} ms "
                 f"(error {self.error:+.1%})"]
        if not self.ops:
            lines.append("ops          none measured (run with --op-timing for per-op times)")
        for o in self.ops:
            pred = "not predicted" if o.predicted_us is None else f"predicted {o.predicted_us:9.1f} us ({o.error:+.0%})"
            lines.append(f"  {o.op:<34} measured {o.measured_us:9.1f} us, {pred}")
        return "\n".join(lines)


def op_comparisons(measured: dict[str, float], predicted: dict[str, float]) -> list[OpComparison]:
    """The dominant measured ops beside their predictions (per-step us by base name)."""
    out = []
    for name in dominant_ops(measured):
        pred = predicted.get(name)
        out.append(OpComparison(name, round(measured[name], 1), None if pred is None else round(pred, 1),
                                None if pred is None else round((pred - measured[name]) / measured[name], 4)))
    return out


def compare_run(result: RunResult, predicted: Timeline, predicted_us: float) -> RunComparison:
    """A run's step and largest ops (`result.op_durations_us`: per-step means of the timed
    steps) against a predicted timeline of the same plan."""
    measured = result.iteration_us()
    if measured <= 0:
        raise ValidateError(f"{result.plan}: the run timed no step")
    ops = op_comparisons(by_base_name(result.op_durations_us or {}), by_base_name(mean_op_durations(predicted)))
    return RunComparison(round(measured, 1), round(predicted_us, 1), round((predicted_us - measured) / measured, 4), ops)
