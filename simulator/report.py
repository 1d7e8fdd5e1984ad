"""The one HTML report writer: plotly figures (plotly.js embedded once) and tables.

Every page picasso writes (analyze, plan, simulate and its sweeps, validate, the demo)
is assembled here from sections; each section is a title, optional text or table, and
optional figures. Every text that reaches a page is escaped here, and only here: a plain
string is text, and markup is an `Html` value that this module's helpers built from escaped
pieces, so a model, file or hardware name can never become a tag or a script. Nothing is fetched when the page opens: plotly.js is inlined in
the first figure, the rest reuse it. The page's head hook marks console errors for
`tests/browser.py` (the headless-browser check).
"""

from __future__ import annotations

import html
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foundation.files import atomic_write_text
from foundation.numbers import cell, header

ERROR_MARK = "[picasso-js-error]"

# Put first in <head>: makes errors distinguishable in Chromium's console log.
ERROR_HOOK_JS = """<script>
(function () {
  var mark = 'MARK';
  var orig = console.error.bind(console);
  console.error = function () { orig.apply(null, [mark].concat([].slice.call(arguments))); };
  window.addEventListener('error', function (e) {
    console.log(mark + ' uncaught: ' + (e.message || e) + ' at ' + (e.filename || '') + ':' + (e.lineno || 0));
  });
  window.addEventListener('unhandledrejection', function (e) {
    console.log(mark + ' unhandled rejection: ' + (e.reason && e.reason.message || e.reason));
  });
})();
</script>""".replace("MARK", ERROR_MARK)

class Html(str):
    """Markup built by this module's helpers (every text inside it escaped on the way in)."""


def markup(*parts: str) -> Html:
    """The pieces joined as markup: `Html` pieces kept, plain text escaped."""
    return Html("".join(p if isinstance(p, Html) else html.escape(str(p)) for p in parts))


def tag(name: str, *parts: str, cls: str | None = None) -> Html:
    """`<name class=cls>parts</name>`, the parts joined as by `markup`."""
    attr = f" class='{html.escape(cls, quote=True)}'" if cls else ""
    return Html(f"<{name}{attr}>{markup(*parts)}</{name}>")


def paragraph(*parts: str) -> Html:
    return tag("p", *parts)


def bold(*parts: str) -> Html:
    return tag("b", *parts)


@dataclass
class Section:
    title: str
    html: str = ""  # `Html` from this module's helpers; a plain string is text (escaped)
    figures: list[Any] = field(default_factory=list)  # plotly.graph_objects.Figure


def table_html(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, fmt: str | None = None) -> Html:
    """A plain HTML table of records: keys as headers in words (foundation.numbers.header), numbers
    as people read them (foundation.numbers.cell, or `fmt`), text escaped."""
    if not rows:
        return Html("<p><em>(none)</em></p>")
    cols = list(columns or rows[0].keys())
    head = "".join(f"<th>{html.escape(header(str(c)))}</th>" for c in cols)

    def text(v: Any) -> str:
        if fmt is not None and isinstance(v, float):
            return html.escape(fmt.format(v))
        return html.escape(cell(v))

    body = "".join("<tr>" + "".join(f"<td>{text(r.get(c))}</td>" for c in cols) + "</tr>" for r in rows)
    return Html(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


SMALL_MULTIPLES_ABOVE = 8  # more curves than this: one small chart per curve, not one crowded chart
GRID_COLUMNS = 4


def fraction_ticks(lo: float) -> tuple[list[float], list[str]]:
    """Decade ticks for a log axis of fractions from `lo` to 1, labelled as percentages (0.01%,
    ..., 100%), not plotly's SI prefixes (1µ, 10µ, ...) that read as units."""
    vals, v = [], 1.0
    while v >= lo * 0.999 and len(vals) < 12:
        vals.append(v)
        v /= 10
    vals.reverse()
    return vals, [f"{x * 100:.{max(0, -int(math.floor(math.log10(x * 100))))}f}%" for x in vals]


def coverage_figure(curves: dict[str, tuple[Sequence[float], Sequence[float]]], title: str,
                    second: dict[str, tuple[Sequence[float], Sequence[float]]] | None = None,
                    second_name: str = "") -> Any:
    """Coverage curves: the share of lookups the hottest x of IDs serve. Up to SMALL_MULTIPLES_ABOVE
    curves share one chart; more get one small chart each on shared axes. `second`: per curve a
    second one (dotted, hidden until clicked in one chart; beside it in small multiples)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    xs = [v for x, _ in curves.values() for v in x if v > 0]
    ticks, labels = fraction_ticks(min(xs) if xs else 1e-3)
    xaxis = {"type": "log", "tickvals": ticks, "ticktext": labels}
    yaxis = {"tickformat": ".0%", "range": [0, 1.02]}
    if len(curves) <= SMALL_MULTIPLES_ABOVE:
        fig = go.Figure()
        for name, (x, y) in curves.items():
            fig.add_trace(go.Scatter(x=list(x), y=list(y), mode="lines", name=name, legendgroup=name))
            if second and name in second:
                fig.add_trace(go.Scatter(x=list(second[name][0]), y=list(second[name][1]), mode="lines",
                                         name=f"{name} ({second_name})", legendgroup=name, line={"dash": "dot"},
                                         visible="legendonly"))
        fig.update_layout(title=title, xaxis_title="hottest share of distinct IDs",
                          yaxis_title="share of lookups served", height=420)
        fig.update_xaxes(**xaxis)
        fig.update_yaxes(**yaxis)
        return fig
    rows = math.ceil(len(curves) / GRID_COLUMNS)
    fig = make_subplots(rows=rows, cols=GRID_COLUMNS, subplot_titles=list(curves), shared_xaxes=True,
                        shared_yaxes=True, horizontal_spacing=0.03, vertical_spacing=min(0.08, 0.5 / rows))
    for i, (name, (x, y)) in enumerate(curves.items()):
        at = {"row": i // GRID_COLUMNS + 1, "col": i % GRID_COLUMNS + 1}
        fig.add_trace(go.Scatter(x=list(x), y=list(y), mode="lines", name=name, showlegend=False,
                                 line={"color": "#4C78A8"}), **at)
        if second and name in second:
            fig.add_trace(go.Scatter(x=list(second[name][0]), y=list(second[name][1]), mode="lines",
                                     name=f"{name} ({second_name})", showlegend=i == 0,
                                     line={"color": "#F58518", "dash": "dot"}), **at)
    fig.update_xaxes(**xaxis)
    fig.update_yaxes(**yaxis)
    fig.update_layout(title=f"{title} (x: hottest share of distinct IDs, y: share of lookups served)",
                      height=140 + 170 * rows)
    fig.update_annotations(font_size=11)
    return fig


def padded_range(values: Sequence[float], min_span: float, include: Sequence[float] = ()) -> list[float]:
    """An axis range over `values` (and `include`, e.g. a chance level) at least `min_span` wide, so
    that differences smaller than what matters do not fill the chart (an AUC moving 0.4935-0.4950)."""
    vals = [float(v) for v in (*values, *include) if v is not None and math.isfinite(float(v))]
    if not vals:
        return [0.0, 1.0]
    lo, hi = min(vals), max(vals)
    pad = max(min_span - (hi - lo), 0.0) / 2 + 0.05 * (hi - lo)
    return [lo - pad, hi + pad]


def line_figure(series: dict[str, tuple[Sequence[float], Sequence[float]]], title: str, xaxis: str,
                yaxis: str, y2: dict[str, tuple[Sequence[float], Sequence[float]]] | None = None,
                y2axis: str = "", yrange: Sequence[float] | None = None) -> Any:
    """Lines with markers, one per series; `y2` series on a second y axis at the right; `yrange`
    fixes the first axis (see padded_range)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, (x, y) in series.items():
        fig.add_trace(go.Scatter(x=list(x), y=list(y), mode="lines+markers", name=name))
    for name, (x, y) in (y2 or {}).items():
        fig.add_trace(go.Scatter(x=list(x), y=list(y), mode="lines+markers", name=name, yaxis="y2",
                                 line={"dash": "dot"}))
    layout: dict[str, Any] = {"title": title, "xaxis_title": xaxis, "yaxis_title": yaxis, "height": 420}
    if yrange is not None:
        layout["yaxis_range"] = list(yrange)
    if y2:
        layout["yaxis2"] = {"title": y2axis, "overlaying": "y", "side": "right"}
    fig.update_layout(**layout)
    return fig


def scatter_figure(points: Sequence[dict[str, Any]], title: str) -> Any:
    """Predicted against measured iteration time, the y = x line and +-10% band."""
    import plotly.graph_objects as go

    xs = [p["measured_us"] / 1e3 for p in points]
    ys = [p["predicted_us"] / 1e3 for p in points]
    hi = max(xs + ys + [1e-3]) * 1.1
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[0, hi], y=[0, hi], mode="lines", name="y = x", line={"color": "grey"}))
    fig.add_trace(go.Scatter(x=[0, hi], y=[0, 1.1 * hi], mode="lines", name="+10%",
                             line={"color": "lightgrey", "dash": "dot"}))
    fig.add_trace(go.Scatter(x=[0, hi], y=[0, 0.9 * hi], mode="lines", name="-10%",
                             line={"color": "lightgrey", "dash": "dot"}))
    fig.add_trace(go.Scatter(
        x=xs, y=ys, mode="markers", name="plans", marker={"size": 9},
        text=[p.get("name", "") for p in points],
        hovertemplate="%{text}<br>measured %{x:.2f} ms<br>predicted %{y:.2f} ms<extra></extra>",
    ))
    fig.update_layout(title=title, xaxis_title="measured iteration (ms)", yaxis_title="predicted iteration (ms)",
                      height=480)
    return fig


def bar_figure(labels: Sequence[str], series: dict[str, Sequence[float]], title: str, yaxis: str,
               percent: bool = False) -> Any:
    """Grouped bars; `percent`: the values are fractions of one, shown as percentages."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, vals in series.items():
        fig.add_trace(go.Bar(x=list(labels), y=list(vals), name=name))
    fig.update_layout(title=title, yaxis_title=yaxis, barmode="group", height=380)
    if percent:
        fig.update_yaxes(tickformat=".0%")
    return fig


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1280px;
color:#222;padding:0 16px}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:2em}
table{border-collapse:collapse;margin:8px 0;font-size:.9em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}
.side{display:flex;gap:12px;flex-wrap:wrap}.side>div{flex:1 1 600px;min-width:0}
pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:.85em}
.fail{color:#b00020;font-weight:bold}.ok{color:#2e7d32;font-weight:bold}
"""

# Runs after the page loads: a figure that did not render is reported as a console
# error, which the headless-browser test treats as a failure.
CHECK_JS = """
<script>
window.addEventListener('load', function () {
  var divs = document.querySelectorAll('.plotly-graph-div');
  var bad = 0;
  divs.forEach(function (d) { if (!d.querySelector('.main-svg')) { bad += 1; } });
  if (typeof Plotly === 'undefined') { console.error('picasso-report: plotly.js is missing'); }
  else if (bad) { console.error('picasso-report: ' + bad + ' figure(s) did not render'); }
  else { console.log('picasso-report: ' + divs.length + ' figures rendered'); }
  document.body.setAttribute('data-figures', String(divs.length - bad));
});
</script>
"""


TOOLBAR_PX = 34  # plotly's toolbar: a row this high at the top right of the figure
TITLE_ROOM_PX = 84  # above the plot: the toolbar's row, then the title's line


def readable(fig: Any) -> None:
    """The page's one layout rule for figures: the toolbar keeps its row at the top, the title sits
    on the line beneath it (left-aligned), the plot below both, so none covers another whatever
    the title's length or the figure's width."""
    height = fig.layout.height or 450
    fig.update_layout(margin={"t": max(TITLE_ROOM_PX, int(fig.layout.margin.t or 0))},
                      title={"x": 0.01, "xanchor": "left", "xref": "container", "yref": "container",
                             "y": 1 - TOOLBAR_PX / height, "yanchor": "top"})


def render(title: str, sections: Sequence[Section], subtitle: str = "", side_by_side: Sequence[int] = ()) -> str:
    """The whole page. Figures of sections whose index is in `side_by_side` share a row."""
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             ERROR_HOOK_JS,
             f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    if subtitle:
        parts.append(paragraph(subtitle))
    first = True
    for i, sec in enumerate(sections):
        parts.append(f"<h2>{html.escape(sec.title)}</h2>")
        if sec.html:
            parts.append(sec.html if isinstance(sec.html, Html) else paragraph(sec.html))
        figs = []
        pair = i in side_by_side and len(sec.figures) > 1
        for fig in sec.figures:
            readable(fig)
            if pair:  # a fixed width: plotly sizes a figure before the flex row shares the page
                fig.update_layout(width=620, autosize=False)
            figs.append(fig.to_html(full_html=False, include_plotlyjs=bool(first),
                                    config={"responsive": not pair}))
            first = False
        if figs:
            if i in side_by_side:
                parts.append("<div class='side'>" + "".join(f"<div>{f}</div>" for f in figs) + "</div>")
            else:
                parts.extend(figs)
    parts.append(CHECK_JS)
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(path: str | os.PathLike, page: str) -> Path:
    """Write the page atomically (temp + rename)."""
    atomic_write_text(path, page)
    return Path(path)


def write_page(path: str | os.PathLike, title: str, sections: Sequence[Section], subtitle: str = "",
               side_by_side: Sequence[int] = ()) -> Path:
    """render + write_report."""
    return write_report(path, render(title, sections, subtitle, side_by_side))


def json_block(obj: Any) -> Html:
    return tag("pre", json.dumps(obj, indent=2, default=str))
