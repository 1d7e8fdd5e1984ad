"""Errors name their real cause in one line: data with no well-formed row is said to be malformed,
not too short for the ranks; ..."""

from __future__ import annotations

import pytest

from executor.data.batches import BadRows, DataError, reader_chunks
from executor.data.text_ranges import TextRanges
from executor.worker import resumed_batches


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
