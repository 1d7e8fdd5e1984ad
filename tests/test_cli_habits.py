"""Command-line habits: --version, a top-level help that says what the tool does, defaults in
every --help, the what-if of `simulate --set` against the plan's own prediction, every written
file named, a closed pipe ending quietly, and CPU ranks called CPU ranks."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from picasso.cli import DefaultsShown, build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_version_and_top_level_help(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"picasso {version('picasso')}"
    import picasso

    assert picasso.__version__ == version("picasso")
    text = build_parser().format_help()
    assert "recommendation models" in text and "dispatcher" not in text and "picasso demo" in text


def test_every_help_shows_the_defaults():
    for name, parser in _subparsers(build_parser()).items():
        assert parser.formatter_class is DefaultsShown, name
        shown = parser.format_help()
        for a in parser._actions:
            if a.option_strings and a.default not in (None, False, [], argparse.SUPPRESS):
                assert "default" in DefaultsShown(name)._get_help_string(a), (name, a.option_strings)
        if name == "score":
            assert "(default: 4096)" in " ".join(shown.split())  # --batch-size


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    d = tmp_path_factory.mktemp("habits")
    assert main(["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "dgx-h100", "--set", "nodes=1",
                 "--baseline", "torchrec-like", "-o", str(d / "gpu.json")]) == 0
    return d


def test_simulate_set_shows_the_what_if(plans, capsys):
    d = plans
    capsys.readouterr()
    assert main(["simulate", str(d / "gpu.json"), "--set", "nvlink_bw=1GB/s", "--html", str(d / "s.html"),
                 "--trace", str(d / "s.json")]) == 0
    out = capsys.readouterr().out
    assert "\n\n\n" not in out
    own = json.loads((d / "gpu.json").read_text())["prediction"]["iteration_us"]
    [line] = [ln for ln in out.splitlines() if ln.startswith("what-if nvlink_bw=1GB/s: iteration ")]
    assert f"iteration {own:,.0f} us -> " in line and "%)" in line and "busiest resource " in line, line
    assert "busiest resource: " in out  # the prediction names it too
    assert out.rstrip().splitlines()[-1] == f"wrote {d / 's.html'} (report), {d / 's.json'} (trace)"
    assert main(["simulate", str(d / "gpu.json"), "--set", "nvlink_bw=1GB/s", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["what_if"]["base_iteration_us"] == pytest.approx(own) and doc["what_if"]["change_ratio"] > 1


def test_plan_names_the_files_it_wrote(plans, capsys):
    d = plans
    capsys.readouterr()
    assert main(["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "local-cpu", "--row-cap", "1000",
                 "--baseline", "naive", "--explain", "-o", str(d / "cpu.json"), "--html", str(d / "p.html")]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1] == f"wrote {d / 'cpu.json'}, {d / 'p.html'} (report)"
    # CPU ranks: their memory and placement are named as what they are
    assert "CPU rank memory " in out and not re.search(r"device [\d.]+ GiB", out)
    assert " rank RAM " in out and " hbm " not in out


def test_a_closed_pipe_ends_quietly(plans):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "picasso", "simulate", str(plans / "gpu.json"), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    p.stdout.close()  # the reader is gone before anything is written
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 141 and err == "", err
