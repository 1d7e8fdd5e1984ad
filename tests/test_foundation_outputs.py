"""foundation.outputs: every output of a command declared and checked against every input and
every other output (path, inode, containment) and against the kind of folder it writes into,
before any work; and the commands that write declare theirs."""

from __future__ import annotations

import json
import os

import pytest

from foundation.outputs import MARKER, OutputClash, Outputs, folder_kind, mark
from picasso.cli import main
from tests.cli_lines import refused
from traces.synth import generate_criteo


def test_an_output_folder_never_holds_or_sits_in_an_input(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.tsv").write_text("x")
    with pytest.raises(OutputClash, match="folder holding the input"):
        Outputs().read("--data", tmp_path / "in" / "a.tsv").folder("--checkpoint", tmp_path / "in", "checkpoint").check()
    with pytest.raises(OutputClash, match="lies inside the input"):
        Outputs().read("--data", tmp_path / "in").folder("--checkpoint", tmp_path / "in" / "ck", "checkpoint").check()
    os.symlink(tmp_path / "in", tmp_path / "alias")  # the same folder by another name
    with pytest.raises(OutputClash, match="folder holding the input"):
        Outputs().read("--data", tmp_path / "in" / "a.tsv").folder("--checkpoint", tmp_path / "alias", "checkpoint").check()
    Outputs().read("--data", tmp_path / "in" / "a.tsv").folder("--checkpoint", tmp_path / "ck", "checkpoint").check()
    assert not (tmp_path / "ck").exists()  # check() creates nothing


def test_a_run_may_resume_from_the_checkpoint_folder_it_saves_to(tmp_path):
    ck = tmp_path / "ck"
    mark(ck, "checkpoint")
    Outputs().read("--resume", ck).folder("--checkpoint", ck, "checkpoint", inputs_inside=("--resume",)).check()
    Outputs().read("--resume", ck / "step-1").folder("--checkpoint", ck, "checkpoint", inputs_inside=("--resume",)).check()
    with pytest.raises(OutputClash, match="would write over the input --resume"):
        Outputs().read("--resume", ck).folder("--checkpoint", ck, "checkpoint").check()


def test_nothing_else_is_written_among_a_folders_own_files(tmp_path):
    ck = tmp_path / "ck"
    with pytest.raises(OutputClash, match="among the files --checkpoint writes"):
        Outputs().folder("--checkpoint", ck, "checkpoint").file("--trace", ck / "manifest.json").check()
    with pytest.raises(OutputClash, match="lies inside the folder"):
        Outputs().folder("-o", tmp_path / "v", "validate").folder("--checkpoint", tmp_path / "v" / "ck", "checkpoint").check()
    # a folder that names what it writes leaves room beside it
    Outputs().folder("-o", tmp_path / "v", "validate", names=("plans", "validate.json")).file(
        "--html", tmp_path / "v" / "report.html").check()
    with pytest.raises(OutputClash, match="among the files -o writes"):
        Outputs().folder("-o", tmp_path / "v", "validate", names=("plans", "validate.json")).file(
            "--html", tmp_path / "v" / "validate.json").check()


def test_an_existing_folder_is_empty_or_of_the_kind_written(tmp_path):
    f = tmp_path / "f"
    f.mkdir()
    Outputs().folder("--checkpoint", f, "checkpoint").check()  # empty
    (f / "manifest.json").write_text(json.dumps({"format": "picasso-dataset-1"}))
    with pytest.raises(OutputClash, match="not a picasso checkpoint folder"):
        Outputs().folder("--checkpoint", f, "checkpoint").check()
    Outputs().folder("--checkpoint", f, "checkpoint", legacy=lambda p: True).check()  # the kind's own test
    (f / "manifest.json").unlink()
    mark(f, "checkpoint")
    assert folder_kind(f) == "checkpoint" and (f / MARKER).is_file()
    (f / "other").write_text("x")
    Outputs().folder("--checkpoint", f, "checkpoint").check()
    with pytest.raises(OutputClash, match="is a picasso checkpoint folder"):
        Outputs().folder("-o", f, "validate").check()


def test_an_input_folders_files_are_never_replaced(tmp_path):
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "validate.json").write_text("{}")
    with pytest.raises(OutputClash, match="inside the input --replay"):
        Outputs().read("--replay", tmp_path / "sweep").file("--results", tmp_path / "sweep" / "validate.json").check()
    Outputs().read("--replay", tmp_path / "sweep").file("--results", tmp_path / "sweep" / "new.json").check()


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    d = tmp_path_factory.mktemp("owner")
    generate_criteo(d / "data.tsv", 300, seed=0)
    assert main(["plan", "--model", "wide-deep", "--hardware", "local-cpu", "--row-cap", "300", "--time-budget", "1",
                 "-o", str(d / "plan.json")]) == 0
    assert main(["convert", str(d / "data.tsv"), "--format", "criteo", "-o", str(d / "ds")]) == 0
    return d


def _snapshot(folder):
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_run_never_checkpoints_into_its_dataset(d, capsys):
    before = _snapshot(d / "ds")
    refused(capsys, ["run", d / "plan.json", "--data", d / "ds", "--steps", "2", "--checkpoint", d / "ds"],
             "--checkpoint")
    assert _snapshot(d / "ds") == before


def test_run_never_checkpoints_into_a_foreign_folder(d, capsys, tmp_path):
    (tmp_path / "manifest.json").write_text('{"mine": true}\n')
    refused(capsys, ["run", d / "plan.json", "--data", d / "data.tsv", "--steps", "2", "--checkpoint", tmp_path],
             "not a picasso checkpoint folder")
    assert (tmp_path / "manifest.json").read_text() == '{"mine": true}\n'


def test_run_writes_no_other_output_inside_its_checkpoint(d, capsys, tmp_path):
    ck = tmp_path / "ck"
    refused(capsys, ["run", d / "plan.json", "--data", d / "data.tsv", "--steps", "2", "--checkpoint", ck,
                      "--trace", ck / "manifest.json"], "among the files --checkpoint writes")
    assert not ck.exists()


def test_convert_force_replaces_only_a_dataset_it_wrote(d, capsys, tmp_path):
    (tmp_path / "manifest.json").write_text('{"mine": true}\n')
    refused(capsys, ["convert", d / "data.tsv", "--format", "criteo", "-o", tmp_path, "--force"],
             "not a picasso dataset folder")
    assert (tmp_path / "manifest.json").read_text() == '{"mine": true}\n'


def test_a_failed_run_leaves_no_checkpoint_folder_it_created(d, capsys, tmp_path, monkeypatch):
    import executor.process.launch as launch

    def fails(*a, **k):
        raise launch.LaunchError("rank 1: error: the data ran out")

    monkeypatch.setattr(launch, "launch", fails)
    ck = tmp_path / "new" / "ck"
    refused(capsys, ["run", d / "plan.json", "--data", d / "data.tsv", "--steps", "2", "--checkpoint", ck],
             "the data ran out")
    assert not ck.exists()
    ck.mkdir(parents=True)  # a folder the user made stays, empty as it was
    refused(capsys, ["run", d / "plan.json", "--data", d / "data.tsv", "--steps", "2", "--checkpoint", ck],
             "the data ran out")
    assert ck.is_dir()
