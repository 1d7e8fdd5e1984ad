"""Names that reach a report (a model's, a hardware's, a plan's or a data file's) are text, never
markup: a hostile name shows as written and runs no script when the page opens."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from picasso.cli import main
from planner.presets import get_model
from simulator.hardware import load_hardware
from tests.browser import find_chromium, open_in_chromium
from traces.synth import generate_criteo

RAN = "picasso-injected-script-ran"
HOSTILE = f"<img src=x onerror=console.log('{RAN}')>"


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, str]:
    """Every page a command writes about one hostile model, hardware, plan file and data file."""
    d = tmp_path_factory.mktemp("hostile")
    model = replace(get_model("wide-deep").with_row_cap(500), name=f"m{HOSTILE}")
    (d / "model.json").write_text(json.dumps(model.to_dict()))
    (d / "hw.json").write_text(json.dumps({**load_hardware("local-cpu").to_dict(), "name": f"hw{HOSTILE}"}))
    plan = d / f"{HOSTILE}.json"
    data = d / f"{HOSTILE}.tsv"
    generate_criteo(data, 300, seed=0)
    argvs = {
        "plan": ["plan", "--model", str(d / "model.json"), "--hardware", str(d / "hw.json"), "-o", str(plan),
                 "--time-budget", "2", "--html", str(d / "plan.html")],
        "sweep": ["simulate", str(plan), "--hardware", str(d / "hw.json"), "--sweep", "pcie_bw=1e10,2e10",
                  "--html", str(d / "sweep.html")],
        "simulate": ["simulate", str(plan), "--hardware", str(d / "hw.json"), "--html", str(d / "simulate.html")],
        "analyze": ["analyze", str(data), "--format", "criteo", "-o", str(d / "p.json"), "--html", str(d / "analyze.html")],
    }
    out = {}
    for name, argv in argvs.items():
        assert main(argv) == 0, name
        out[name] = str(d / f"{name}.html")
    return out


@pytest.mark.parametrize("page", ["plan", "sweep", "simulate", "analyze"])
def test_a_hostile_name_is_escaped_on_every_page(pages, page):
    text = open(pages[page], encoding="utf-8").read()
    assert "<img src=x" not in text  # no tag made of a name
    if page != "analyze":  # the profile page names its data only inside the figure (plotly's JSON)
        assert "&lt;img src=x onerror=" in text


def test_the_writer_escapes_every_text_it_is_given():
    from simulator.report import Section, bold, markup, paragraph, render, table_html, tag

    page = render(f"t{HOSTILE}", [Section(f"s{HOSTILE}", f"body{HOSTILE}"),
                                  Section("t", markup(paragraph("a", bold(HOSTILE)), tag("pre", HOSTILE),
                                                      table_html([{HOSTILE: HOSTILE}])))],
                  subtitle=f"sub{HOSTILE}")
    assert "<img" not in page and page.count("&lt;img") == 9, page.count("&lt;img")
    assert "<p>a<b>&lt;img" in page  # markup the writer built stays markup


@pytest.mark.slow
def test_no_injected_script_runs_in_a_browser(pages, tmp_path):
    from tests.test_workflows_report import need_chromium

    need_chromium()
    assert find_chromium() is not None
    for name, path in pages.items():
        res = open_in_chromium(path)
        assert not any(RAN in line for line in res.console), (name, res.console)
        assert res.errors == [], (name, res.errors)
