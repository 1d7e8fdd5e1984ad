"""Plotly HTML Gantt of a Timeline (rows rank x lane), self-contained."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

from simulator.timeline import Timeline, _atomic_write_text

_HOVER_KEYS = ("kind", "flops", "hbm_bytes", "host_bytes", "pcie_bytes", "nic_bytes", "collective",
               "bytes_per_rank", "group_size")


def _fmt(v: Any) -> str:
    if isinstance(v, float) and (v >= 1e4 or 0 < v < 1e-2):
        return f"{v:.3g}"
    return str(v)


def timeline_figure(timeline: Timeline, title: str | None = None, max_events: int = 50_000) -> Any:
    import plotly.graph_objects as go

    events = sorted(timeline.events, key=lambda e: (e.rank, e.lane, e.start_us))[:max_events]
    rows = sorted({(e.rank, e.lane) for e in events})
    label = {key: f"rank {key[0]} / {key[1]}" for key in rows}
    by_kind: dict[str, list] = defaultdict(list)
    for e in events:
        by_kind[str(e.args.get("kind", e.lane))].append(e)
    fig = go.Figure()
    for kind, evs in sorted(by_kind.items()):
        hover = []
        for e in evs:
            parts = [f"<b>{e.name}</b>", f"rank {e.rank}, lane {e.lane}",
                     f"start {e.start_us:.1f} us, dur {e.dur_us:.1f} us"]
            parts += [f"{k}: {_fmt(e.args[k])}" for k in _HOVER_KEYS if k in e.args and k != "kind"]
            hover.append("<br>".join(parts))
        fig.add_trace(go.Bar(
            name=kind, orientation="h", base=[e.start_us for e in evs], x=[e.dur_us for e in evs],
            y=[label[(e.rank, e.lane)] for e in evs], hovertext=hover, hoverinfo="text",
        ))
    fig.update_layout(
        title=title or f"timeline ({timeline.meta.get('source', '')}, makespan {timeline.makespan_us():.1f} us)",
        barmode="overlay", xaxis_title="time (us)", height=max(300, 28 * len(rows) + 150),
        yaxis={"categoryorder": "array", "categoryarray": [label[k] for k in reversed(rows)]},
    )
    return fig


def timeline_html(timeline: Timeline, path: str | os.PathLike, title: str | None = None) -> None:
    """Write a self-contained HTML Gantt (plotly.js inlined) atomically."""
    fig = timeline_figure(timeline, title)
    _atomic_write_text(path, fig.to_html(include_plotlyjs=True, full_html=True))
