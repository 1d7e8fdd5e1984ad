"""The one Gantt chart of a Timeline (rows rank x lane, one bar per event), predicted or measured."""

from __future__ import annotations

import html
import os
from typing import Any

from simulator.timeline import Timeline

LANE_COLOURS = {
    "compute": "#4C78A8", "comm": "#F58518", "copy": "#54A24B", "nic": "#F58518",
    "memory": "#B279A2", "host": "#9D755D",
}
HOVER_ARGS = 6  # event args shown on hover


def _fmt(v: Any) -> str:
    if isinstance(v, float) and (v >= 1e4 or 0 < v < 1e-2):
        return f"{v:.3g}"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _args_text(args: dict[str, Any]) -> str:
    return html.escape(", ".join(f"{k}={_fmt(v)}" for k, v in list(args.items())[:HOVER_ARGS]))


def timeline_figure(timeline: Timeline, title: str | None = None, max_events: int = 50_000) -> Any:
    """Bars from the first event's start, in ms, coloured by lane; hover: name, duration, args."""
    import plotly.graph_objects as go

    events = sorted(timeline.events, key=lambda e: (e.rank, e.lane, e.start_us))[:max_events]
    t0 = min((e.start_us for e in events), default=0.0)
    rows = sorted({(e.rank, e.lane) for e in events})
    label = {k: f"rank {k[0]} / {k[1]}" for k in rows}
    by_lane: dict[str, list[Any]] = {}
    for e in events:
        by_lane.setdefault(e.lane, []).append(e)
    palette = list(LANE_COLOURS.values())
    fig = go.Figure()
    for i, (lane, evs) in enumerate(sorted(by_lane.items())):
        colour = LANE_COLOURS.get(lane.split(":")[0], palette[i % len(palette)])
        fig.add_trace(go.Bar(
            orientation="h",
            y=[label[(e.rank, e.lane)] for e in evs],
            x=[max(e.dur_us, 1e-3) / 1e3 for e in evs],
            base=[(e.start_us - t0) / 1e3 for e in evs],
            name=lane,
            marker={"color": colour, "line": {"width": 0.5, "color": "white"}},
            text=[e.name for e in evs],
            textposition="none",
            customdata=[[e.name, f"{e.dur_us:.1f}", _args_text(e.args)] for e in evs],
            hovertemplate="%{customdata[0]}<br>%{customdata[1]} us<br>%{customdata[2]}<extra></extra>",
        ))
    end_ms = max(((e.end_us - t0) / 1e3 for e in events), default=1.0)
    fig.update_layout(
        title=title or f"timeline ({timeline.meta.get('source', '')}, makespan {timeline.makespan_us():.1f} us)",
        barmode="overlay", xaxis_title="time (ms)", xaxis_range=[0, end_ms * 1.02],
        height=max(260, 40 * len(rows) + 120), margin={"l": 140, "r": 20, "t": 50, "b": 40},
        legend={"orientation": "h"},
    )
    fig.update_yaxes(categoryorder="array", categoryarray=[label[k] for k in reversed(rows)])
    return fig


def timeline_html(timeline: Timeline, path: str | os.PathLike, title: str | None = None) -> None:
    """A report page holding the Gantt (simulator.report writes it)."""
    from simulator.report import Section, write_page

    write_page(path, title or "timeline", [Section("Timeline", figures=[timeline_figure(timeline, title)])])
