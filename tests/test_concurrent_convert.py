"""Two conversions into one dataset folder: the second is refused in one line while the first
writes (they raced: one renamed away the folder the other was renaming, 'No such file or directory'),
and the first still ends with a whole dataset."""

from __future__ import annotations

import threading

import pytest

from picasso.cli import main
from traces import convert as conv
from traces.dataset import Dataset


@pytest.mark.parametrize("force", [False, True])
def test_a_second_conversion_into_the_same_folder_is_refused(tmp_path, capsys, monkeypatch, force):
    from traces.synth import generate_criteo

    generate_criteo(tmp_path / "a.tsv", 120, seed=0)
    out = tmp_path / "ds"
    if force:  # replacing an existing dataset, both with --force
        assert main(["convert", str(tmp_path / "a.tsv"), "--format", "criteo", "-o", str(out)]) == 0
    flag = ["--force"] if force else []
    writing, release = threading.Event(), threading.Event()
    first = threading.current_thread()
    real = conv._write

    def slow_write(*a, **k):  # the first conversion pauses while it writes
        if threading.current_thread() is not first:
            writing.set()
            assert release.wait(60)
        return real(*a, **k)

    monkeypatch.setattr(conv, "_write", slow_write)
    rc_first: list[int] = []
    t = threading.Thread(target=lambda: rc_first.append(
        main(["convert", str(tmp_path / "a.tsv"), "--format", "criteo", "-o", str(out), *flag])))
    t.start()
    try:
        assert writing.wait(60)
        capsys.readouterr()
        rc = main(["convert", str(tmp_path / "a.tsv"), "--format", "criteo", "-o", str(out), *flag])
        err = capsys.readouterr().err.strip().splitlines()
    finally:
        release.set()
        t.join(60)
    assert rc == 2 and len(err) == 1, err
    assert "another picasso process" in err[0] and "is writing this dataset folder" in err[0], err
    assert rc_first == [0] and Dataset(out).rows == 120


def test_a_killed_conversions_leftovers_go_with_the_next_one(tmp_path):
    """A conversion killed outright (SIGKILL) leaves its hidden folder and writer lock beside the
    output; the next conversion to that output removes them and ends with a whole dataset."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from traces.synth import generate_criteo

    generate_criteo(tmp_path / "a.tsv", 120, seed=0)
    out = tmp_path / "ds"
    stuck = ("import sys, time\nfrom traces import convert as conv\nreal = conv._write\n"
             "def stall(*a, **k):\n    real(*a, **k)\n    time.sleep(600)\n"
             "conv._write = stall\n"
             f"conv.convert([{str(tmp_path / 'a.tsv')!r}], 'criteo', {str(out)!r})\n")
    proc = subprocess.Popen([sys.executable, "-c", stuck], env={**os.environ})
    hidden = tmp_path / f".ds.converting-{proc.pid}"
    deadline = time.monotonic() + 60
    while not (hidden / "shard-00000").is_dir() and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert hidden.is_dir() and (tmp_path / ".ds.picasso-writer.lock").exists()  # what a kill leaves
    assert main(["convert", str(tmp_path / "a.tsv"), "--format", "criteo", "-o", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tsv", "ds"]
    assert Dataset(out).rows == 120
