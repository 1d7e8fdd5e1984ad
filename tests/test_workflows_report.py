"""The HTML report: self-contained, plotly.js embedded once, renders without JS errors.

Browser tests need Debian's `chromium` (apt-get install -y chromium); they are marked
slow and skip without it unless PICASSO_REQUIRE_CHROMIUM=1 (CI sets it), where a
missing browser is a failure.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from simulator.export import timeline_figure
from simulator.report import (
    Section,
    bar_figure,
    coverage_figure,
    render,
    scatter_figure,
    table_html,
    write_report,
)
from simulator.timeline import Timeline
from tests.browser import ERROR_MARK, find_chromium, open_in_chromium


def need_chromium() -> None:
    if find_chromium() is None:
        if os.environ.get("PICASSO_REQUIRE_CHROMIUM"):
            pytest.fail("chromium is required (PICASSO_REQUIRE_CHROMIUM=1) but not installed")
        pytest.skip("chromium not installed (Debian: apt-get install -y chromium)")


def small_page() -> str:
    tl = Timeline()
    tl.add(0, "compute", "fwd/dense/bottom_mlp", 0, 100, flops=1e6)
    tl.add(1, "comm", "fwd/pack0/a2a_ids", 50, 80, bytes_per_rank=4096)
    secs = [
        Section("coverage", figures=[coverage_figure({"C1": ([0.001, 0.1, 1.0], [0.3, 0.8, 1.0])}, "c")]),
        Section("timelines", figures=[timeline_figure(tl, "simulated"), timeline_figure(tl, "measured")]),
        Section("scatter <&>", html=table_html([{"plan": "a<b", "ms": 1.5}]),
                figures=[scatter_figure([{"name": "p", "measured_us": 1000, "predicted_us": 1100}], "s"),
                         bar_figure(["naive"], {"predicted": [2.0], "measured": [1.8]}, "b", "x")]),
    ]
    return render("test report", secs, side_by_side=[1])


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


def test_report_is_self_contained_with_plotly_once(tmp_path):
    page = small_page()
    # plotly.js inlined exactly once (its bundle defines the global once), no remote script
    assert page.count("plotly.js v") == 1
    assert "<script src=" not in page and 'src="http' not in page
    assert page.count("Plotly.newPlot") == 5
    assert "a&lt;b" in page and "scatter &lt;&amp;&gt;" in page
    assert ERROR_MARK in page  # the error hook the browser test relies on
    path = write_report(tmp_path / "r.html", page)
    assert path.read_text() == page


def test_table_html_formats_and_escapes():
    html = table_html([{"a": 1.23456, "b": "<x>", "c": [1, 2]}])
    assert "1.23" in html and "&lt;x&gt;" in html and "1, 2" in html
    assert "(none)" in table_html([])


@pytest.mark.slow
def test_browser_detects_a_javascript_error(tmp_path):
    """Negative control: a page that throws must be reported, so a clean run means something."""
    need_chromium()
    page = small_page().replace("</body>", "<script>window.addEventListener('load', function () "
                                           "{ notDefinedAnywhere(); });</script></body>")
    path = write_report(tmp_path / "bad.html", page)
    res = open_in_chromium(path, tmp_path / "bad.png")
    assert any("notDefinedAnywhere" in e for e in res.errors), res.console


@pytest.mark.slow
def test_browser_renders_a_small_report(tmp_path):
    need_chromium()
    path = write_report(tmp_path / "ok.html", small_page())
    res = open_in_chromium(path)
    assert res.errors == [], res.errors
    assert "picasso-report: 5 figures rendered" in res.console, res.console
    assert res.screenshot is not None and png_size(res.screenshot)[0] > 100


# Appended to the demo's page by the browser test: after plotly drew the figures, each timeline's
# time axis and its lanes' colours, as the browser holds them, on the console.
FIGURES_PROBE = """<script>
window.addEventListener('load', function () {
  var out = [];
  document.querySelectorAll('.plotly-graph-div').forEach(function (d) {
    var title = String((d.layout && d.layout.title && (d.layout.title.text || d.layout.title)) || '');
    if (title.indexOf('simulated') !== 0 && title.indexOf('measured (median timed step)') !== 0) { return; }
    var lanes = {};
    (d.data || []).forEach(function (t) { lanes[t.name] = t.marker && t.marker.color; });
    out.push({title: title, range: d._fullLayout.xaxis.range, lanes: lanes});
  });
  console.log('picasso-timelines: ' + JSON.stringify(out));
});
</script>"""


@pytest.mark.slow
def test_demo_report_opens_without_javascript_errors(tmp_path, monkeypatch):
    """The whole demo (synth -> ... -> validate) writes a report that renders cleanly; its timelines
    share one time axis and give every lane its own colour in the browser; the report says what the
    terminal says."""
    need_chromium()
    import html as html_lib
    import json as json_lib

    import validation.demo as demo
    from validation.demo import DemoConfig, run_demo, summary_lines

    # the quality stage's run, shortened: two evaluations on a few held-out rows draw the AUC curve
    monkeypatch.setattr(demo, "QUALITY_STEPS", 16)
    monkeypatch.setattr(demo, "QUALITY_EVERY", 8)
    monkeypatch.setattr(demo, "QUALITY_ROWS", 2_000)
    out = tmp_path / "demo"
    summary = run_demo(DemoConfig(out=str(out), rows=60_000, seed=0, row_cap=20_000, batch=256, steps=4, plans=4,
                                  repeats=1, run_repeats=2, max_run_repeats=2, cluster_rows=30_000, quiet=True))
    assert summary["report"] == str(out / "report.html")
    report = out / "report.html"
    assert report.is_file()
    page = report.read_text()
    for title in ("coverage curves", "The plan and why", "Simulated and measured timelines",
                  "Speedups over the baselines", "Predicted against measured", "AUC curve on held-out data",
                  "What-if: a skewed log on simulated GPU clusters"):
        assert title in page, title
    # what the terminal prints, the report shows (numbers included)
    for line in summary_lines(summary)[1:]:
        text = line.strip().removeprefix("validation: ")
        if text.endswith(":"):
            continue
        assert html_lib.escape(text.split(": ", 1)[-1]) in page, text
    assert any(c["hot_rows"] > 0 and c["packs"] >= 3 for c in summary["clusters"]), summary["clusters"]
    assert all(v in ("faster", "slower", "undecided") for v in summary["verdicts"].values())
    probed = report.with_name("probed.html")
    probed.write_text(page.replace("</body>", FIGURES_PROBE + "</body>"))
    shot = out / "report.png"
    res = open_in_chromium(probed, shot)
    assert res.errors == [], res.errors
    rendered = [c for c in res.console if c.startswith("picasso-report:")]
    assert rendered and "figures rendered" in rendered[0], res.console
    assert shot.is_file() and png_size(shot)[0] > 100
    timelines = json_lib.loads(next(c for c in res.console if c.startswith("picasso-timelines: "))
                               .removeprefix("picasso-timelines: "))
    # in page order: the plan's simulated and measured step, then the validation's typical plan's
    assert len(timelines) == 4 and timelines[0]["title"].startswith("simulated"), timelines
    for sim, meas in (timelines[:2], timelines[2:]):
        assert meas["title"].startswith("measured") and sim["range"] == meas["range"], timelines  # one time axis
    for t in timelines:
        colours = [c for c in t["lanes"].values()]
        assert len(set(colours)) == len(colours), t["lanes"]  # one colour per lane
    assert [e["step"] for e in summary["eval"]] == [8, 16]
