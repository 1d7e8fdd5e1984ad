"""One report writer and one Gantt for every page: analyze, plan, simulate (and its --sweep), validate, demo."""

from __future__ import annotations

import json

from picasso.cli import main
from planner.builders import naive_plan
from planner.model_spec import ModelSpec, TableSpec
from simulator.report import ERROR_MARK


def small_plan(path) -> None:
    m = ModelSpec("u", "dlrm", 13, tuple(TableSpec(f"C{i + 1}", n, 8) for i, n in enumerate([500, 40, 3000])),
                  bottom_mlp=(16, 8), top_mlp=(16, 1))
    naive_plan(m, 2, 64, "local-cpu").save(path)


def test_simulate_sweep_writes_the_html_the_readme_shows(tmp_path, capsys):
    small_plan(tmp_path / "plan.json")
    html = tmp_path / "sweep.html"
    rc = main(["simulate", str(tmp_path / "plan.json"), "--set", "gpus_per_node=2", "--engine", "fast",
               "--sweep", "gpu.hbm_bw=10GB/s,20GB/s,40GB/s", "--html", str(html), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["html"] == str(html) and len(out["results"]) == 3
    page = html.read_text()
    assert ERROR_MARK in page and page.count("plotly.js v") == 1  # the one writer: plotly once, error hook
    assert "gpu.hbm_bw" in page and "20GB/s" in page


def test_every_page_comes_from_the_one_writer(tmp_path, capsys):
    from traces.synth import generate_criteo

    generate_criteo(tmp_path / "d.tsv", 2000, seed=0)
    assert main(["analyze", str(tmp_path / "d.tsv"), "--format", "criteo", "--html", str(tmp_path / "a.html")]) == 0
    small_plan(tmp_path / "plan.json")
    assert main(["simulate", str(tmp_path / "plan.json"), "--set", "gpus_per_node=2", "--engine", "fast",
                 "--html", str(tmp_path / "s.html")]) == 0
    for page in ("a.html", "s.html"):
        text = (tmp_path / page).read_text()
        assert ERROR_MARK in text and text.count("plotly.js v") == 1, page
    assert "rank 1 / " in (tmp_path / "s.html").read_text().replace("\\u002f", "/")  # the Gantt rows
