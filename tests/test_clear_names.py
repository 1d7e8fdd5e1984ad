"""Errors say what a thing is: a pipe or a device is not "empty", a file with no rows says so, a
name with a line break is shown escaped on the one line, a deleted working folder is named."""

from __future__ import annotations

import os

import pytest

from picasso.cli import main


def _cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    return rc, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("command", ["analyze", "convert"])
def test_a_pipe_is_named_a_pipe(tmp_path, capsys, command):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    rc, err = _cli([command, str(fifo), "--format", "csv", "-o", str(tmp_path / "out")], capsys)
    assert rc == 2 and len(err) == 1, err
    assert f"{fifo}: is a pipe" in err[0] and "empty" not in err[0]


def test_dev_zero_is_named_a_device(tmp_path, capsys):
    rc, err = _cli(["analyze", "/dev/zero", "--format", "criteo", "-o", str(tmp_path / "p.json")], capsys)
    assert rc == 2 and len(err) == 1, err
    assert "/dev/zero: is a device" in err[0] and "empty" not in err[0]


def test_a_spec_on_a_device_says_device(capsys):
    rc, err = _cli(["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "/dev/zero"], capsys)
    assert rc == 2 and len(err) == 1, err
    assert "/dev/zero: hardware spec is a device" in err[0]


def test_a_file_without_rows_says_so(tmp_path, capsys):
    data = tmp_path / "header_only.csv"
    data.write_text("label,c1\n\n\n")
    rc, err = _cli(["analyze", str(data), "--format", "csv"], capsys)
    assert rc == 2 and len(err) == 1, err
    assert f"{data}: no data rows" in err[0] and "first)" not in err[0]


def test_a_name_with_a_line_break_stays_on_one_line(tmp_path, capsys):
    name = str(tmp_path / "a\nb.csv")
    rc, err = _cli(["analyze", name, "--format", "csv"], capsys)
    assert rc == 2 and len(err) == 1, err
    assert "a\\nb.csv: no such file" in err[0]


def test_a_deleted_working_folder_is_said(tmp_path, capsys, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    rc, err = _cli(["synth", "--rows", "10", "-o", "x.tsv"], capsys)
    monkeypatch.chdir(tmp_path)
    assert rc == 2 and len(err) == 1, err
    assert "working folder no longer exists" in err[0]
