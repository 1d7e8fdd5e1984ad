"""The one Gantt chart of a Timeline (rows rank x lane, one bar per event), predicted or measured."""

from __future__ import annotations

import html
import os
from typing import Any

from foundation.numbers import cell, duration_us
from simulator.timeline import Timeline

# one colour per lane the simulator or the executor writes (simulator.measured's lane names), no two
# alike: a colour says which queue an op waited in
LANE_COLOURS = {
    "compute": "#4C78A8", "comm": "#F58518", "copy": "#54A24B", "nic": "#E45756",
    "memory": "#B279A2", "host": "#9D755D", "input_dist": "#72B7B2", "input_copy": "#EECA3B",
    "grad_buckets": "#FF9DA6", "grad_sync": "#1B9E77", "node_group": "#7570B3", "peers_group": "#666666",
}
# lanes no name above covers, in order of appearance: colours none of the above uses
SPARE_COLOURS = ("#A6761D", "#E7298A", "#66A61E", "#17BECF", "#BCBD22", "#8C564B", "#393B79", "#AD494A")
HOVER_ARGS = 6  # event args shown on hover


def _args_text(args: dict[str, Any]) -> str:
    return html.escape(", ".join(f"{k}={cell(v)}" for k, v in list(args.items())[:HOVER_ARGS]))


def lane_colours(lanes: list[str]) -> dict[str, str]:
    """A distinct colour for each lane: its own (LANE_COLOURS, by the name before a ':'), else the
    next spare; two lanes share a colour only past the spares."""
    out, spare = {}, iter(SPARE_COLOURS)
    for lane in lanes:
        base = lane.split(":")[0]
        out[lane] = LANE_COLOURS.get(base) or next(spare, "#999999")
    return out


def timeline_end_ms(timeline: Timeline) -> float:
    """The timeline's length in ms from its first event's start (what its time axis spans)."""
    if not timeline.events:
        return 0.0
    t0 = min(e.start_us for e in timeline.events)
    return max(e.end_us - t0 for e in timeline.events) / 1e3


def shared_timelines(timelines: dict[str, Timeline]) -> list[Any]:
    """Gantt charts of several timelines (simulated beside measured) on one time axis: the range of
    the longest, so that equal lengths look equal."""
    end = max((timeline_end_ms(t) for t in timelines.values()), default=1.0)
    return [timeline_figure(t, title, x_max_ms=end) for title, t in timelines.items()]


def timeline_figure(timeline: Timeline, title: str | None = None, max_events: int = 50_000,
                    x_max_ms: float | None = None) -> Any:
    """Bars from the first event's start, in ms, coloured by lane; hover: name, duration, args.
    `x_max_ms`: the time axis's end (shared_timelines gives several charts one axis)."""
    import plotly.graph_objects as go

    events = sorted(timeline.events, key=lambda e: (e.rank, e.lane, e.start_us))[:max_events]
    t0 = min((e.start_us for e in events), default=0.0)
    rows = sorted({(e.rank, e.lane) for e in events})
    label = {k: f"rank {k[0]} / {k[1]}" for k in rows}
    by_lane: dict[str, list[Any]] = {}
    for e in events:
        by_lane.setdefault(e.lane, []).append(e)
    colours = lane_colours(sorted(by_lane))
    fig = go.Figure()
    for lane, evs in sorted(by_lane.items()):
        colour = colours[lane]
        fig.add_trace(go.Bar(
            orientation="h",
            y=[label[(e.rank, e.lane)] for e in evs],
            x=[max(e.dur_us, 1e-3) / 1e3 for e in evs],
            base=[(e.start_us - t0) / 1e3 for e in evs],
            name=lane,
            marker={"color": colour, "line": {"width": 0.5, "color": "white"}},
            text=[e.name for e in evs],
            textposition="none",
            customdata=[[e.name, duration_us(e.dur_us), _args_text(e.args)] for e in evs],
            hovertemplate="%{customdata[0]}<br>%{customdata[1]}<br>%{customdata[2]}<extra></extra>",
        ))
    end_ms = x_max_ms if x_max_ms else max(((e.end_us - t0) / 1e3 for e in events), default=1.0)
    fig.update_layout(
        title=title or f"timeline ({timeline.meta.get('source', '')}, makespan {duration_us(timeline.makespan_us())})",
        barmode="overlay", xaxis_title="time (ms)", xaxis_range=[0, end_ms * 1.02],
        height=max(280, 40 * len(rows) + 150), margin={"l": 140, "r": 20, "t": 50, "b": 90},
        # the lanes' legend on the figure's bottom edge, below the time axis's title
        legend={"orientation": "h", "yref": "container", "y": 0.01, "yanchor": "bottom"},
    )
    fig.update_yaxes(categoryorder="array", categoryarray=[label[k] for k in reversed(rows)])
    return fig


def timeline_html(timeline: Timeline, path: str | os.PathLike, title: str | None = None) -> None:
    """A report page holding the Gantt (simulator.report writes it)."""
    from simulator.report import Section, write_page

    write_page(path, title or "timeline", [Section("Timeline", figures=[timeline_figure(timeline, title)])])
