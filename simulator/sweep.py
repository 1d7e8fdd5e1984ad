"""What-if series: one parameter over several values, a metric per value, and its plot."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: the seams' own classes, not loaded at import
    from simulator.hardware import HardwareSpec
    from simulator.opgraph import OpGraph



@dataclass
class SweepResult:
    param: str
    metric: str
    values: list[Any]
    metrics: list[float]
    results: list[Any] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"param": self.param, "metric": self.metric,
                "points": [{"value": v, self.metric: m} for v, m in zip(self.values, self.metrics)]}

    def figure(self) -> Any:
        import plotly.graph_objects as go

        fig = go.Figure(go.Scatter(x=[str(v) if isinstance(v, str) else v for v in self.values],
                                   y=self.metrics, mode="lines+markers", name=self.metric))
        fig.update_layout(title=f"{self.metric} vs {self.param}", xaxis_title=self.param, yaxis_title=self.metric)
        return fig

    def save_html(self, path: str | os.PathLike) -> None:
        from simulator.report import Section, table_html, write_page

        rows = [{self.param: v, self.metric: m} for v, m in zip(self.values, self.metrics)]
        write_page(path, f"{self.metric} vs {self.param}", [Section("Sweep", table_html(rows), [self.figure()])])


def _metric_of(out: Any, metric: str) -> float:
    if isinstance(out, (int, float)):
        return float(out)
    if isinstance(out, Mapping):
        return float(out[metric])
    if hasattr(out, metric):
        return float(getattr(out, metric))
    return float(out.summary()[metric])


def sweep(fn: Callable[[Any], Any], values: Sequence[Any], *, param: str = "value",
          metric: str = "iteration_us", progress: Callable[[int, int], None] | None = None) -> SweepResult:
    """Call `fn(v)` for each value; `fn` returns a SimResult, a number, or a dict holding `metric`."""
    results, metrics = [], []
    for i, v in enumerate(values):
        out = fn(v)
        results.append(out)
        metrics.append(_metric_of(out, metric))
        if progress is not None:
            progress(i + 1, len(values))
    return SweepResult(param, metric, list(values), metrics, results)


def hardware_sweep(graph_fn: Callable[[HardwareSpec], OpGraph], hw: HardwareSpec, key: str, values: Sequence[Any], *,
                   engine: str = "fast", metric: str = "iteration_us",
                   progress: Callable[[int, int], None] | None = None) -> SweepResult:
    """Sweep a hardware override `key` (e.g. "gpu.hbm_bw") over `values` ("2TB/s", ...).
    `graph_fn(hw_variant)` returns the OpGraph to simulate (a fixed graph: `lambda _: g`)."""
    from simulator.engine import simulate
    from simulator.hardware import apply_overrides

    def one(v: Any) -> Any:
        h = apply_overrides(hw, {key: v})
        return simulate(graph_fn(h), h, engine)

    return sweep(one, values, param=key, metric=metric, progress=progress)
