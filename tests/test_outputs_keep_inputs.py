"""No command writes over one of its own inputs, nor two of its outputs to one file: the same
name, a relative or symlinked name, or a hard link, refused in one line before any work."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from picasso.cli import main
from traces.synth import generate_criteo


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    d = tmp_path_factory.mktemp("io")
    generate_criteo(d / "data.tsv", 300, seed=0)
    assert main(["plan", "--model", "wide-deep", "--hardware", "local-cpu", "--row-cap", "300", "--time-budget", "1",
                 "-o", str(d / "plan.json")]) == 0
    os.link(d / "data.tsv", d / "hardlink.tsv")
    os.symlink(d / "data.tsv", d / "symlink.tsv")
    return d


def _refused(capsys, argv, *protected) -> list[str]:
    before = {p: p.read_bytes() for p in protected}
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and ("would write over" in err[0] or "would write into" in err[0]), err
    for p, content in before.items():
        assert p.read_bytes() == content, f"{p} was changed"
    return err


@pytest.mark.parametrize("target", ["data.tsv", "hardlink.tsv", "symlink.tsv", "./data.tsv"])
def test_analyze_never_writes_over_its_data(d, capsys, target, monkeypatch):
    monkeypatch.chdir(d)
    _refused(capsys, ["analyze", "data.tsv", "--format", "criteo", "-o", target], d / "data.tsv")
    _refused(capsys, ["analyze", "data.tsv", "--format", "criteo", "--html", target], d / "data.tsv")


def test_two_outputs_of_one_command_never_share_a_file(d, capsys, tmp_path):
    err = _refused(capsys, ["analyze", d / "data.tsv", "--format", "criteo", "-o", tmp_path / "p.json",
                            "--html", tmp_path / "p.json"])
    assert "--html" in err[0] and "-o" in err[0]
    assert not (tmp_path / "p.json").exists()
    _refused(capsys, ["simulate", d / "plan.json", "--trace", tmp_path / "t.json", "--html", tmp_path / "t.json"])
    _refused(capsys, ["plan", "--model", "wide-deep", "--hardware", "local-cpu", "-o", tmp_path / "x.json",
                      "--html", tmp_path / "x.json"])


def test_run_plan_simulate_export_convert_keep_their_inputs(d, capsys):
    plan = d / "plan.json"
    _refused(capsys, ["run", plan, "--data", d / "data.tsv", "--trace", d / "data.tsv"], d / "data.tsv")
    _refused(capsys, ["run", plan, "--data", d / "data.tsv", "--timeline", plan], plan)
    _refused(capsys, ["simulate", plan, "--html", plan], plan)
    _refused(capsys, ["export", plan, "--torchrec", "-o", plan], plan)
    assert main(["analyze", str(d / "data.tsv"), "--format", "criteo", "-o", str(d / "p.json")]) == 0
    _refused(capsys, ["plan", "--model", "wide-deep", "--hardware", "local-cpu", "--profile", d / "p.json",
                      "-o", d / "p.json"], d / "p.json", d / "p.npz")
    _refused(capsys, ["plan", "--model", "wide-deep", "--hardware", "local-cpu", "--profile", d / "p.json",
                      "-o", d / "p.npz"], d / "p.json", d / "p.npz")
    _refused(capsys, ["convert", d / "data.tsv", "--format", "criteo", "-o", d, "--force"], d / "data.tsv")


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", "./a", "sub/../b", "link_a"]), min_size=2, max_size=4))
def test_outputs_refuse_exactly_the_names_of_one_file(tmp_path_factory, names):
    tmp = tmp_path_factory.mktemp("names")
    (tmp / "a").write_text("in")
    (tmp / "sub").mkdir()
    os.symlink(tmp / "a", tmp / "link_a")
    paths = [tmp / n for n in names]
    files = {os.path.normpath(n).replace("link_a", "a") for n in names}
    clash = len(files) < len(names) or "a" in files  # a repeated file, or the input a
    outs = {f"-o{i}": p for i, p in enumerate(paths)}
    if clash:
        with pytest.raises(ValueError, match="would write over"):
            _declared(tmp / "a", outs).check()
    else:
        _declared(tmp / "a", outs).check()


def _declared(src, outs):
    from foundation.outputs import Outputs

    declared = Outputs().read("IN", src)
    for flag, p in outs.items():
        declared.file(flag, p)
    return declared
