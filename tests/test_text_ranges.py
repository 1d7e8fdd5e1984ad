"""Plain-text training logs read per rank by byte ranges aligned on line ends; gzip
streamed whole with a note; global batches and --verify's reference consistent with them."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from executor.data.batches import RawBatch
from executor.data.text_ranges import TextRanges, byte_ranges, range_chunks, splittable
from picasso.cli import main
from traces.errors import TraceError
from traces.readers import _BlockSource, open_reader


def lines_of(path, byte_range=None) -> list[bytes]:
    out = []
    for block, _ in _BlockSource(str(path), 1 << 12, byte_range):
        out.extend(block.split(b"\n")[:-1])
    return out


def test_every_cut_point_reads_each_line_once(tmp_path):
    # lines of uneven length, one empty, no newline at the end: every pair of cuts tiles the lines
    text = b"a\nbb\n\nccc\ndddd\ne\nfffffff\ng"
    p = tmp_path / "t.txt"
    p.write_bytes(text)
    want = text.split(b"\n")
    n = len(text)
    for c1 in range(n + 1):
        for c2 in range(c1, n + 1):
            got = lines_of(p, (0, c1)) + lines_of(p, (c1, c2)) + lines_of(p, (c2, n))
            assert got == want, (c1, c2)


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    from traces.synth import generate_criteo

    d = tmp_path_factory.mktemp("ranges")
    generate_criteo(d / "a.tsv", 1500, seed=4)
    generate_criteo(d / "b.tsv", 700, seed=5)
    return d


def _key(raw: RawBatch) -> list[tuple]:
    """A row's identity: its label, dense values and first three IDs."""
    sp = [raw.sparse[f] for f in ("C1", "C2", "C3")]
    return [(float(raw.labels[i]), *np.nan_to_num(raw.dense[i], nan=-1).tolist(),
             *(tuple(ids[off[i]:off[i + 1]].tolist()) for ids, off in sp)) for i in range(len(raw))]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_read_every_row_exactly_once(logs, world):
    files = [str(logs / "a.tsv"), str(logs / "b.tsv")]
    whole = []
    for f in files:
        whole += _key(RawBatch.concat(list(range_chunks([(f, 0, 1 << 40)], "criteo"))))
    per_rank = [_key(RawBatch.concat(list(range_chunks(pieces, "criteo")))) for pieces in byte_ranges(files, world)]
    assert sum(per_rank, []) == whole and len(whole) == 2200  # each once, none twice, in order
    sizes = [len(r) for r in per_rank]
    assert max(sizes) - min(sizes) < 2200 / world * 0.1  # shares about equal
    if world > 1:  # no rank reads the whole log
        assert max(sizes) < len(whole)


def test_rank_batches_skip_resume_and_whole_batches(logs):
    tr = [TextRanges(str(logs / "a.tsv"), "criteo", 2, r, 100) for r in range(2)]
    mine = [list(zip(range(9), t.local(0, None))) for t in tr]  # 7 whole batches per pass, then a new pass
    assert [len(b) for _, b in mine[0]] == [100] * 9
    assert _key(mine[0][7][1]) == _key(mine[0][0][1])  # the range starts over
    resumed = next(tr[1].local(3, None))
    assert _key(resumed) == _key(mine[1][3][1])
    g = next(tr[0].whole(2))
    assert _key(g) == _key(mine[0][2][1]) + _key(mine[1][2][1])  # rank 0's rows, then rank 1's


def test_csv_header_and_malformed_line_numbers_in_a_later_range(tmp_path):
    rows = [f"{i % 2},{i},u{i}" for i in range(400)]
    rows[300] = "x,1,u300"  # a bad label on line 302 (after the header)
    p = tmp_path / "d.csv"
    p.write_text("label,num,user\n" + "\n".join(rows) + "\n")
    opts = {"label": "label", "dense": "num", "categorical": "user"}
    size = p.stat().st_size
    got = []
    for lo, hi in ((0, size // 2), (size // 2, size)):
        r = open_reader(str(p), "csv", byte_range=(lo, hi), **opts)
        for c in r:
            got += c.dense[:, 0].tolist()
        if lo:
            assert r.stats.rows_bad == 1 and r.stats.first_bad_reasons[0].startswith(f"{p}:302:")
    assert got == [float(i) for i in range(400) if i != 300]


def test_gzip_and_parquet_are_not_split(logs, tmp_path):
    gz = tmp_path / "a.tsv.gz"
    gz.write_bytes(gzip.compress((logs / "a.tsv").read_bytes()))
    assert not splittable(str(gz), "criteo") and splittable(str(logs / "*.tsv"), "criteo")
    with pytest.raises(TraceError, match="gzip file cannot be read by byte ranges"):
        open_reader(str(gz), "criteo", byte_range=(0, 10))


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    from dataclasses import replace

    from planner.plan import PackPlan, Plan
    from planner.presets import get_model

    d = tmp_path_factory.mktemp("rangeplans")
    m = replace(get_model("dlrm-criteo-kaggle").with_row_cap(500), bottom_mlp=(16, 16), top_mlp=(16, 1))
    Plan(m, 2, 32, [PackPlan("pack0", m.table_names[:20], "row_wise"),
                    PackPlan("pack1", m.table_names[20:], "column_wise")],
         hot_rows={"C1": 50}, micro_batches=2, kernel_interleaving=True).save(d / "plan2.json",
                                                                             hot_ids={"C1": np.arange(50)})
    return d


def run_json(capsys, *argv) -> tuple[dict, str]:
    rc = main(["run", *map(str, argv), "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return json.loads(cap.out), cap.err


@pytest.mark.dist
def test_text_run_by_byte_ranges_verifies_and_counts_epochs(logs, plans, capsys):
    res, err = run_json(capsys, plans / "plan2.json", "--data", logs / "a.tsv", "--epochs", "1", "--verify")
    assert res["data"]["reading"] == "byte ranges" and "gzip" not in err
    tr = [TextRanges(str(logs / "a.tsv"), "criteo", 2, r, 32) for r in range(2)]
    fewest = min(sum(len(c) for c in range_chunks(t.ranges[t.rank], "criteo")) // 32 for t in tr)
    assert res["steps"] == res["data"]["steps_per_epoch"] == fewest
    assert res["verify"]["passed"], res["verify"]
    w = res["input_wait"]  # the wait for input is measured per rank, as a share of the step
    assert len(w["fraction_of_step_per_rank"]) == 2 and all(0 <= f < 1 for f in w["fraction_of_step_per_rank"])


@pytest.mark.dist
def test_gzip_text_run_streams_whole_with_a_note(logs, plans, capsys, tmp_path):
    gz = tmp_path / "a.tsv.gz"
    gz.write_bytes(gzip.compress((logs / "a.tsv").read_bytes()))
    res, err = run_json(capsys, plans / "plan2.json", "--data", gz, "--steps", "3", "--verify")
    notes = [x for x in err.splitlines() if "gzip" in x]
    assert len(notes) == 1 and "picasso convert" in notes[0]
    assert res["data"]["reading"] == "whole stream per rank" and "picasso convert" in res["data"]["note"]
    assert res["verify"]["passed"]


@pytest.mark.dist
def test_malformed_rows_of_every_range_are_counted_with_their_line(logs, plans, capsys, tmp_path):
    lines = (logs / "a.tsv").read_text().splitlines(keepends=True)
    lines[1200] = "1\tnot-a-row\n"  # in rank 1's byte range: line 1201
    bad = tmp_path / "bad.tsv"
    bad.write_text("".join(lines))
    res, _ = run_json(capsys, plans / "plan2.json", "--data", bad, "--epochs", "1")
    d = res["data"]
    assert d["reading"] == "byte ranges" and d["malformed_rows_skipped"] == 1
    assert d["first_malformed"].startswith(f"{bad}:1201:")
