"""Errors name their real cause in one line: data with no well-formed row is said to be malformed,
not too short for the ranks; a huge field is one malformed row, not a parser abort; a line with no
end is bounded."""

from __future__ import annotations

import pytest

from executor.data.batches import BadRows, DataError, reader_chunks
from executor.data.text_ranges import TextRanges
from executor.run.sources import resumed_batches


def _criteo_rows(path, n: int, label: str) -> None:
    row = label + "\t" + "\t".join(["1"] * 13) + "\t" + "\t".join(["ab12cd34"] * 26) + "\n"
    path.write_text(row * n)


@pytest.mark.parametrize("world", [1, 2])
def test_every_row_malformed_is_named_not_the_rank_count(tmp_path, world):
    data = tmp_path / "bad.tsv"
    _criteo_rows(data, 400, "abc")
    bad = BadRows()
    with pytest.raises(DataError) as e:
        next(TextRanges(str(data), "criteo", world, 0, 8).local(0, bad))
    msg = str(e.value)
    assert "every row is malformed" in msg and "field label" in msg and "ranks" not in msg, msg


def test_some_rows_malformed_names_both_counts(tmp_path):
    data = tmp_path / "bad.tsv"
    _criteo_rows(data, 5, "1")
    with data.open("a") as f:
        f.write(("x\t" + "\t".join(["1"] * 13) + "\t" + "\t".join(["ab12cd34"] * 26) + "\n") * 7)
    bad = BadRows()
    with pytest.raises(DataError, match=r"fewer well-formed rows \(5\) than one batch \(8\); 7 malformed"):
        next(resumed_batches(lambda: reader_chunks(str(data), "criteo", bad=bad), 8, 0, bad))


def test_a_short_log_with_good_rows_keeps_the_rank_hint(tmp_path):
    data = tmp_path / "short.tsv"
    _criteo_rows(data, 6, "1")
    with pytest.raises(DataError, match=r"fewer rows \(\d\) than one batch \(8\): use fewer ranks"):
        next(TextRanges(str(data), "criteo", 2, 0, 8).local(0, BadRows()))


def test_a_field_longer_than_the_parse_block_is_one_malformed_row(tmp_path):
    """pyarrow refused the whole file ('straddling object') for one line longer than its block."""
    from traces import readers

    data = tmp_path / "long.tsv"
    _criteo_rows(data, 20, "1")
    with data.open("a") as f:
        f.write("1\t" + "\t".join(["1"] * 13) + "\t" + "z" * (3 * readers.PARSE_BLOCK) + "\t"
                + "\t".join(["ab12cd34"] * 25) + "\n")
    _criteo_rows_append(data, 20)
    r = readers.open_reader(data, "criteo")
    assert sum(c.rows for c in r) == 40 and r.stats.rows_bad == 1
    assert "long.tsv:21: field C1" in r.stats.first_bad_reasons[0]


def _criteo_rows_append(path, n: int) -> None:
    with path.open("a") as f:
        f.write(("0\t" + "\t".join(["2"] * 13) + "\t" + "\t".join(["ab12cd34"] * 26) + "\n") * n)


@pytest.mark.parametrize("gz", [False, True])
def test_a_line_without_end_is_bounded(tmp_path, monkeypatch, gz):
    """A row is held whole while parsed: a file with no line end past the bound is refused in one line,
    not read whole into memory."""
    import gzip

    from traces import readers
    from traces.errors import TraceError

    monkeypatch.setattr(readers, "MAX_LINE_BYTES", 1 << 20, raising=False)
    data = tmp_path / ("blob.gz" if gz else "blob.tsv")
    payload = b"1\t" + b"7" * (3 << 20)
    data.write_bytes(gzip.compress(payload) if gz else payload)
    with pytest.raises(TraceError, match="line 1 runs over 1 MiB without a line end"):
        list(readers._BlockSource(str(data), 1 << 16))


def test_glued_error_lines_are_read_apart():
    """Two ranks failing at once wrote into one log line; the rank that failed on its own is named."""
    from executor.process.launch import first_error

    log = ("executor rank 0: error: a collective failed, another rank probably died or hung (Connection closed)"
           "executor rank 1: error: /data/x.tsv: line 7: field C3: bad\n\n"
           "[W socket.cpp:1] partial warningpicasso agent: rank 1 exited with code 1\n")
    assert first_error(log) == "rank 1: /data/x.tsv: line 7: field C3: bad"
    glued_exit = "[W gloo] half a linepicasso agent: rank 1 exited with code -9\n"
    assert first_error(glued_exit) == "worker rank 1 died (exit code -9); the other ranks stopped"


def test_a_rank_writes_its_error_line_in_one_write(tmp_path):
    """Ranks run under `python -u`, where print writes the text and its newline apart: a peer's
    line could land between them. The error line must be one write."""
    import os
    import shutil
    import subprocess
    import sys

    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    from executor.run.config import RunConfig

    trace = tmp_path / "writes.txt"
    RunConfig(plan=str(tmp_path / "nope.json"), data="synthetic", steps=1).save(tmp_path / "config.json")
    proc = subprocess.run(["strace", "-f", "-qq", "-e", "trace=write", "-s", "300", "-o", str(trace),
                           sys.executable, "-u", "-m", "executor", str(tmp_path / "config.json")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "WORLD_SIZE": "1"})
    if "Operation not permitted" in proc.stderr and not trace.read_text():
        pytest.skip("ptrace is not permitted here")
    assert "no such plan file" in proc.stderr
    writes = [ln for ln in trace.read_text().splitlines() if "write(2," in ln]
    mine = [ln for ln in writes if "executor rank 0: error:" in ln]
    assert len(mine) == 1 and "no such plan file\\n\"" in mine[0], writes
