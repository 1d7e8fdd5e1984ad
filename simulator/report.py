"""The one HTML report writer: plotly figures (plotly.js embedded once) and tables.

Every page picasso writes (analyze, plan, simulate and its sweeps, validate, the demo)
is assembled here from sections; each section is a title, optional HTML text or table,
and optional figures. Nothing is fetched when the page opens: plotly.js is inlined in
the first figure, the rest reuse it. The page's head hook marks console errors for
`tests/browser.py` (the headless-browser check).
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foundation.files import atomic_write_text

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

@dataclass
class Section:
    title: str
    html: str = ""
    figures: list[Any] = field(default_factory=list)  # plotly.graph_objects.Figure


def table_html(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, fmt: str = "{:.4g}") -> str:
    """A plain HTML table of records (numbers formatted, text escaped)."""
    if not rows:
        return "<p><em>(none)</em></p>"
    cols = list(columns or rows[0].keys())
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return fmt.format(v)
        if isinstance(v, (list, tuple)):
            return html.escape(", ".join(str(x) for x in v))
        return html.escape(str(v))

    body = "".join("<tr>" + "".join(f"<td>{cell(r.get(c, ''))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def coverage_figure(curves: dict[str, tuple[Sequence[float], Sequence[float]]], title: str) -> Any:
    """Coverage curves: fraction of accesses covered by the top x of IDs, one line per feature."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, (x, y) in curves.items():
        fig.add_trace(go.Scatter(x=list(x), y=list(y), mode="lines", name=name))
    fig.update_layout(
        title=title, xaxis_title="top fraction of distinct IDs", yaxis_title="fraction of accesses covered",
        xaxis_type="log", height=420, margin={"t": 50},
    )
    return fig


def line_figure(series: dict[str, tuple[Sequence[float], Sequence[float]]], title: str, xaxis: str,
                yaxis: str, y2: dict[str, tuple[Sequence[float], Sequence[float]]] | None = None,
                y2axis: str = "") -> Any:
    """Lines with markers, one per series; `y2` series on a second y axis at the right."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, (x, y) in series.items():
        fig.add_trace(go.Scatter(x=list(x), y=list(y), mode="lines+markers", name=name))
    for name, (x, y) in (y2 or {}).items():
        fig.add_trace(go.Scatter(x=list(x), y=list(y), mode="lines+markers", name=name, yaxis="y2",
                                 line={"dash": "dot"}))
    layout = {"title": title, "xaxis_title": xaxis, "yaxis_title": yaxis, "height": 420, "margin": {"t": 50}}
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
                      height=480, margin={"t": 50})
    return fig


def bar_figure(labels: Sequence[str], series: dict[str, Sequence[float]], title: str, yaxis: str) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, vals in series.items():
        fig.add_trace(go.Bar(x=list(labels), y=list(vals), name=name))
    fig.update_layout(title=title, yaxis_title=yaxis, barmode="group", height=380, margin={"t": 50})
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


def render(title: str, sections: Sequence[Section], subtitle: str = "", side_by_side: Sequence[int] = ()) -> str:
    """The whole page. Figures of sections whose index is in `side_by_side` share a row."""
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             ERROR_HOOK_JS,
             f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    if subtitle:
        parts.append(f"<p>{subtitle}</p>")
    first = True
    for i, sec in enumerate(sections):
        parts.append(f"<h2>{html.escape(sec.title)}</h2>")
        if sec.html:
            parts.append(sec.html)
        figs = []
        pair = i in side_by_side and len(sec.figures) > 1
        for fig in sec.figures:
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


def json_block(obj: Any) -> str:
    return f"<pre>{html.escape(json.dumps(obj, indent=2, default=str))}</pre>"
