"""`picasso convert` (round trip, every format, atomicity), per-rank shares of a dataset,
the epoch order, and the exact AUC."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from executor.data.batches import RawBatch, chunk_from_reader, dataset_batches
from executor.run.evaluate import auc, global_ranges, logloss, share
from picasso.cli import main
from traces.convert import convert
from traces.dataset import Dataset, EpochOrder, dlrm_dense, feistel_permute
from traces.errors import TraceError
from traces.readers import open_reader


def read_text(path, fmt, **opts) -> RawBatch:
    return RawBatch.concat([chunk_from_reader(c) for c in open_reader(path, fmt, **opts)])


def assert_same_rows(ds: Dataset, raw: RawBatch, transformed: bool) -> None:
    r = ds.read_range(0, ds.rows)
    assert ds.rows == len(raw)
    np.testing.assert_array_equal(r.labels, raw.labels)
    np.testing.assert_array_equal(r.dense, dlrm_dense(raw.dense) if transformed else raw.dense)
    for f, (ids, off) in raw.sparse.items():
        np.testing.assert_array_equal(r.sparse[f][0], ids, err_msg=f)
        np.testing.assert_array_equal(r.sparse[f][1], off, err_msg=f)


@pytest.fixture(scope="module")
def criteo_tsv(tmp_path_factory):
    from traces.synth import generate_criteo

    d = tmp_path_factory.mktemp("conv")
    generate_criteo(d / "data.tsv", 3000, seed=3)
    return d / "data.tsv"


def test_criteo_round_trip_across_shards_and_gzip(criteo_tsv, tmp_path):
    gz = tmp_path / "data.tsv.gz"
    gz.write_bytes(gzip.compress(criteo_tsv.read_bytes()))
    m = convert([str(gz)], "criteo", tmp_path / "ds", shard_rows=700)
    assert len(m["shards"]) == 5 and m["rows"] == 3000 and m["dense_transform"] == "log1p"
    assert_same_rows(Dataset(tmp_path / "ds"), read_text(criteo_tsv, "criteo"), transformed=True)
    # the shards are plain .npy files any tool can memory-map
    assert np.load(tmp_path / "ds" / "shard-00001" / "labels.npy", mmap_mode="r").shape == (700,)


def test_glob_of_files_concatenates_in_order(criteo_tsv, tmp_path):
    lines = criteo_tsv.read_text().splitlines(keepends=True)
    (tmp_path / "day_0.tsv").write_text("".join(lines[:1000]))
    (tmp_path / "day_1.tsv").write_text("".join(lines[1000:]))
    rc = main(["convert", str(tmp_path / "day_*.tsv"), "--format", "criteo", "-o", str(tmp_path / "ds"),
               "--dense", "none"])
    assert rc == 0
    assert_same_rows(Dataset(tmp_path / "ds"), read_text(criteo_tsv, "criteo"), transformed=False)


def test_multi_hot_csv_libsvm_and_parquet_keep_their_bags(tmp_path):
    csv = tmp_path / "d.csv"
    csv.write_text("label,price,user,tags\n1,3.5,u1,a|b|c\n0,,u2,\n1,7,u1,b\n0,1,,a|a\n")
    opts = {"dense": "price", "multi_sep": "|", "multi": "tags"}
    convert([str(csv)], "csv", tmp_path / "c", **opts)
    raw = read_text(csv, "csv", **opts)
    assert raw.sparse["tags"][1].tolist() == [0, 3, 3, 4, 6]
    assert_same_rows(Dataset(tmp_path / "c"), raw, transformed=True)

    svm = tmp_path / "d.svm"
    svm.write_text("1 3:1 7:1 12:1\n-1 5:1\n1 3:1 9:1\n")
    convert([str(svm)], "libsvm", tmp_path / "s")
    assert_same_rows(Dataset(tmp_path / "s"), read_text(svm, "libsvm"), transformed=True)

    from traces.synth import generate_criteo_multihot

    pq = tmp_path / "m.parquet"
    generate_criteo_multihot(pq, 300, seed=1)
    convert([str(pq)], "parquet", tmp_path / "p", shard_rows=128)
    assert_same_rows(Dataset(tmp_path / "p"), read_text(pq, "parquet"), transformed=True)


def test_interrupted_convert_leaves_no_dataset(criteo_tsv, tmp_path):
    calls = []

    def progress(done, total):
        calls.append(done)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert([str(criteo_tsv)], "criteo", tmp_path / "ds", shard_rows=500, chunk_bytes=1 << 16, progress=progress)
    assert list(tmp_path.iterdir()) == []  # neither the output nor its temporary folder
    # a folder that lost its manifest, or a truncated shard, is refused in one line
    convert([str(criteo_tsv)], "criteo", tmp_path / "ds", shard_rows=500)
    ids = tmp_path / "ds" / "shard-00002" / "ids.npy"
    ids.write_bytes(ids.read_bytes()[:-8])
    with pytest.raises(TraceError, match="truncated"):
        Dataset(tmp_path / "ds").read_range(0, 3000)
    (tmp_path / "ds" / "manifest.json").unlink()
    with pytest.raises(TraceError, match="no manifest"):
        Dataset(tmp_path / "ds")


def test_existing_output_needs_force_and_bad_input_is_one_line(criteo_tsv, tmp_path, capsys):
    out = tmp_path / "ds"
    assert main(["convert", str(criteo_tsv), "--format", "criteo", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["convert", str(criteo_tsv), "--format", "criteo", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already exists" in err[0]
    assert main(["convert", str(tmp_path / "nope_*.tsv"), "--format", "criteo", "-o", str(tmp_path / "x")]) == 2
    assert "no file matches" in capsys.readouterr().err
    bad = tmp_path / "bad.tsv"
    bad.write_text(criteo_tsv.read_text().splitlines()[0] + "\n" + "1\tx\n")
    assert main(["convert", str(bad), "--format", "criteo", "-o", str(tmp_path / "y"), "--strict", "--json"]) == 2
    assert "bad.tsv:2" in capsys.readouterr().err
    assert main(["convert", str(bad), "--format", "criteo", "-o", str(tmp_path / "y"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["malformed_rows"] == 1


def test_force_replaces_only_a_dataset(criteo_tsv, tmp_path, capsys):
    """--force onto a FIFO used to replace it and then block removing it; onto any folder, delete it."""
    import os

    fifo, folder, plain = tmp_path / "fifo", tmp_path / "folder", tmp_path / "file"
    os.mkfifo(fifo)
    folder.mkdir()
    (folder / "keep.txt").write_text("mine\n")
    plain.write_text("mine\n")
    for target in (folder, plain, fifo):  # the FIFO last: old code blocked on it
        rc = main(["convert", str(criteo_tsv), "--format", "criteo", "-o", str(target), "--force"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and "not a picasso dataset" in err[0], err
    assert fifo.is_fifo() and (folder / "keep.txt").read_text() == "mine\n" and plain.read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "file", "folder"]
    assert main(["convert", str(criteo_tsv), "--format", "criteo", "-o", str(tmp_path / "ds")]) == 0
    assert main(["convert", str(criteo_tsv), "--format", "criteo", "-o", str(tmp_path / "ds"), "--force"]) == 0


@pytest.mark.parametrize("n", [1, 2, 7, 64, 1000, 4097])
def test_feistel_is_a_permutation(n):
    p = feistel_permute(np.arange(n), n, key=12345)
    assert sorted(p.tolist()) == list(range(n))
    if n > 64:
        assert not (p == np.arange(n)).all()


def test_ranks_read_disjoint_rows_covering_each_epoch(tmp_path):
    """Every row once per epoch across 1, 2 and 3 ranks; the order changes with the epoch."""
    n = 1260  # a multiple of every global batch below
    csv = tmp_path / "rows.csv"
    csv.write_text("label,rid,f\n" + "".join(f"{i % 2},{i},{i % 13}\n" for i in range(n)))
    convert([str(csv)], "csv", tmp_path / "ds", dense="rid", dense_transform="none", shard_rows=200)
    ds = Dataset(tmp_path / "ds")
    orders = []
    for world, b in ((1, 60), (2, 30), (3, 20), (3, 35)):
        g = world * b
        per_epoch = n // g
        for epoch in range(2):
            seen = []
            for r in range(world):
                for x in dataset_batches(ds, g, r * b, (r + 1) * b, seed=7, start_step=epoch * per_epoch,
                                         stop_step=(epoch + 1) * per_epoch):
                    seen.append(x.dense[:, 0].astype(np.int64))
            rows = np.concatenate(seen)
            assert sorted(rows.tolist()) == list(range(n)), (world, b, epoch)
            orders.append(rows)
    assert not np.array_equal(orders[0], orders[1])  # epoch 1 is shuffled differently from epoch 0


def test_epoch_order_reads_contiguous_runs():
    o = EpochOrder(10_000, seed=1, run=256)
    segs = o.segments(0, 0, 2048)
    assert sum(b - a for a, b in segs) == 2048 and len(segs) <= 2048 // 256 + 1


def test_epoch_segments_by_runs_equal_the_row_by_row_definition():
    rng = np.random.default_rng(0)
    for rows in (1, 255, 257, 10_007, 65_549):
        for run in (1, 7, 256):
            o = EpochOrder(rows, seed=3, run=run)
            for _ in range(40):
                lo = int(rng.integers(0, rows + 1))
                hi, e = int(rng.integers(lo, rows + 1)), int(rng.integers(0, 3))
                assert o.segments(e, lo, hi) == o.segments_by_rows(e, lo, hi), (rows, run, lo, hi)


def test_auc_matches_pairwise_definition_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(5):
        s = rng.integers(0, 6, size=60).astype(np.float64)  # many ties
        y = rng.random(60) < 0.4
        pos, neg = s[y], s[~y]
        want = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (len(pos) * len(neg))
        assert abs(auc(s, y) - want) < 1e-12
    assert auc(np.array([0.1, 0.9]), np.array([0, 1])) == 1.0
    assert abs(logloss(np.array([0.0]), np.array([1])) - np.log(2)) < 1e-12


def test_eval_shares_give_every_rank_rows():
    for rows, size, world in ((1001, 100, 3), (7, 4, 3), (300, 128, 2)):
        ranges = global_ranges(rows, size, world)
        assert ranges[0][0] == 0 and ranges[-1][1] == rows
        for a, b in ranges:
            parts = [share(b - a, r, world) for r in range(world)]
            assert all(hi > lo for lo, hi in parts) and parts[-1][1] == b - a
