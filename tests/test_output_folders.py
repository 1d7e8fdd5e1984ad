"""One rule for an output whose folders are missing, in every command (foundation.files.check_creatable):
they are created when it is written; a path through a file is refused in one line before any work.
(plan, simulate and run created them while synth, analyze and convert refused.)"""

from __future__ import annotations

import pytest

from picasso.cli import main


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("outs")
    assert main(["synth", "--preset", "criteo-kaggle", "--rows", "300", "-o", str(d / "d.tsv")]) == 0
    assert main(["analyze", str(d / "d.tsv"), "--format", "criteo", "-o", str(d / "p.json")]) == 0
    assert main(["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "local-cpu", "--row-cap", "300",
                 "--profile", str(d / "p.json"), "--time-budget", "1", "-o", str(d / "plan.json")]) == 0
    return d


def _commands(d, out):
    return {
        "synth": ["synth", "--preset", "criteo-kaggle", "--rows", "50", "-o", str(out / "s.tsv")],
        "analyze -o": ["analyze", str(d / "d.tsv"), "--format", "criteo", "-o", str(out / "p.json")],
        "analyze --html": ["analyze", str(d / "d.tsv"), "--format", "criteo", "--html", str(out / "p.html")],
        "convert": ["convert", str(d / "d.tsv"), "--format", "criteo", "-o", str(out / "ds")],
        "plan": ["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "local-cpu", "--row-cap", "300",
                 "--profile", str(d / "p.json"), "--time-budget", "1", "-o", str(out / "plan.json")],
        "simulate": ["simulate", str(d / "plan.json"), "--trace", str(out / "t.json")],
    }


@pytest.mark.parametrize("cmd", ["synth", "analyze -o", "analyze --html", "convert", "plan", "simulate"])
def test_missing_output_folders_are_created(inputs, tmp_path, capsys, cmd):
    out = tmp_path / "new" / "deeper"
    argv = _commands(inputs, out)[cmd]
    assert main(argv) == 0, capsys.readouterr().err
    assert any(out.iterdir())


@pytest.mark.parametrize("cmd", ["synth", "analyze -o", "analyze --html", "convert", "plan", "simulate"])
def test_an_output_below_a_file_is_one_line_and_creates_nothing(inputs, tmp_path, capsys, cmd):
    (tmp_path / "file").write_text("x")
    argv = _commands(inputs, tmp_path / "file" / "sub")[cmd]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "file is not a folder" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
