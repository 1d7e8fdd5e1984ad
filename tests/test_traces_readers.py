"""Readers: real Criteo rows, every format, gzip, malformed rows (hypothesis), strict mode."""

from __future__ import annotations

import gzip
import string

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traces.errors import TraceError
from traces.ids import fnv1a64, strings_to_ids
from traces.readers import open_reader


def read_all(reader):
    chunks = list(reader)
    n = sum(c.rows for c in chunks)
    labels = np.concatenate([c.labels for c in chunks]) if chunks else np.zeros(0)
    dense = np.concatenate([c.dense for c in chunks]) if chunks else np.zeros((0, len(reader.dense_names)))
    bags = {}
    for name in reader.feature_names:
        rows = []
        for c in chunks:
            ids, off = c.sparse[name]
            rows.extend(ids[off[i] : off[i + 1]].tolist() for i in range(c.rows))
        bags[name] = rows
    return chunks, n, labels, dense, bags


# ---- real Criteo ---------------------------------------------------------------------------
def test_criteo_real_sample_matches_python_parse(criteo_sample_dir, tmp_path):
    path = criteo_sample_dir / "train_split.tsv"
    lines = path.read_text().splitlines()
    r = open_reader(path, "criteo", chunk_bytes=64 << 10)  # several blocks
    chunks, n, labels, dense, bags = read_all(r)
    assert n == len(lines) == r.stats.rows_ok and r.stats.rows_bad == 0
    assert r.feature_names == [f"C{i}" for i in range(1, 27)] and r.dense_names == [f"I{i}" for i in range(1, 14)]
    assert [c.first_row for c in chunks] == list(np.cumsum([0] + [c.rows for c in chunks[:-1]]))
    for i in (0, 1, 777, len(lines) - 1):
        f = lines[i].split("\t")
        assert labels[i] == float(f[0])
        assert dense[i].tolist() == [float(x) if x else 0.0 for x in f[1:14]]
        for j in range(26):
            want = [int(f[14 + j], 16)] if f[14 + j] else []
            assert bags[f"C{j + 1}"][i] == want
    # gzip gives the same rows
    gz = tmp_path / "train.tsv.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    _, n2, labels2, _, bags2 = read_all(open_reader(gz, "criteo", chunk_bytes=64 << 10))
    assert n2 == n and np.array_equal(labels2, labels) and bags2["C3"] == bags["C3"]


def test_kaggle_test_csv_as_generic_csv(criteo_sample_dir):
    path = criteo_sample_dir / "kaggle_test_head2000.csv"
    dense = ",".join(f"I{i}" for i in range(1, 14))
    r = open_reader(path, "csv", label="Label", dense=dense, skip="Id")
    _, n, labels, dense_v, bags = read_all(r)
    assert n == 1999 and r.feature_names == [f"C{i}" for i in range(1, 27)]
    first = path.read_text().splitlines()[1].split(",")
    assert dense_v[0].tolist() == [float(x) if x else 0.0 for x in first[2:15]]
    want = strings_to_ids(pa.array([first[15]]))[0][0]
    assert bags["C1"][0] == [want]
    assert bags["C6"][0] == []  # empty field = missing


# ---- malformed rows ------------------------------------------------------------------------
HEX = "0123456789abcdefABCDEF"


@st.composite
def criteo_rows(draw):
    """(text, expected list of (line, ok, fields)) with random corruptions and blank lines.

    Field values come from a numpy generator seeded by hypothesis (cheap to draw);
    hypothesis chooses which rows are blank or corrupted and how.
    """
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kinds = draw(st.lists(st.sampled_from(["ok"] * 5 + ["blank", "extra", "short", "nonhex", "hexlen", "number",
                                                        "label"]), min_size=1, max_size=60))  # fmt: skip
    lines, expect = [], []
    for kind in kinds:
        if kind == "blank":
            lines.append("")  # blank lines are skipped silently
            continue
        label = str(rng.integers(0, 2))
        dense = ["" if rng.random() < 0.2 else str(rng.integers(-3, 10**6)) for _ in range(13)]
        cats = ["" if rng.random() < 0.2 else "".join(rng.choice(list(HEX), 8)) for _ in range(26)]
        fields = [label, *dense, *cats]
        j = int(rng.integers(0, 26))
        if kind == "extra":
            fields.append("x")
        elif kind == "short":
            fields = fields[: draw(st.integers(1, 39))]
        elif kind == "nonhex":
            fields[14 + j] = "".join(rng.choice(list(HEX), 7)) + draw(st.sampled_from("gxz-"))
        elif kind == "hexlen":
            fields[14 + j] = draw(st.text(HEX, min_size=1, max_size=12).filter(lambda s: len(s) != 8))
        elif kind == "number":
            fields[1 + int(rng.integers(0, 13))] = draw(st.sampled_from(["1x", "abc", "--1", "1-", "0x1f"]))
        elif kind == "label":
            fields[0] = draw(st.sampled_from(["", "yes", "1a"]))
        lines.append("\t".join(fields))
        expect.append((len(lines), kind == "ok", fields))
    return "\n".join(lines) + "\n", expect


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=criteo_rows(), gz=st.booleans())
def test_criteo_malformed_rows_skipped_and_counted(tmp_path, data, gz):
    text, expect = data
    path = tmp_path / ("m.tsv.gz" if gz else "m.tsv")
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    good = [(ln, f) for ln, ok, f in expect if ok]
    bad_lines = [ln for ln, ok, _ in expect if not ok]
    if not good and not bad_lines:
        return
    if all(len(f) != 40 for _, _, f in expect):  # no line has Criteo's width: the wrong format
        with pytest.raises(TraceError, match="expected 40 tab-separated fields"):
            open_reader(path, "criteo")
        return
    r = open_reader(path, "criteo", chunk_bytes=4096)
    _, n, labels, dense, bags = read_all(r)
    assert n == len(good) == r.stats.rows_ok
    assert r.stats.rows_bad == len(bad_lines)
    assert r.stats.first_bad_lines == bad_lines[:10]
    for i, (_, f) in enumerate(good):
        assert labels[i] == float(f[0])
        assert bags["C1"][i] == ([int(f[14], 16)] if f[14] else [])
        assert bags["C26"][i] == ([int(f[39], 16)] if f[39] else [])
        assert dense[i, 1] == (float(f[2]) if f[2] else 0.0)
    if bad_lines:
        with pytest.raises(TraceError, match=rf":{bad_lines[0]}: "):
            list(open_reader(path, "criteo", strict=True, chunk_bytes=4096))
    else:
        assert sum(c.rows for c in open_reader(path, "criteo", strict=True)) == n


def test_strict_message_names_file_line_and_field(tmp_path):
    ok = "\t".join(["1", *["1"] * 13, *["0000000a"] * 26])
    bad = "\t".join(["0", *["1"] * 13, *["0000000a"] * 4, "zzzzzzzz", *["0000000a"] * 21])
    p = tmp_path / "s.tsv"
    p.write_text("\n".join([ok, ok, bad, ok]) + "\n")
    with pytest.raises(TraceError) as e:
        list(open_reader(p, "criteo", strict=True))
    msg = str(e.value)
    assert msg == f"{p}:3: field C5: expected 8 hex characters, got 'zzzzzzzz'"
    r = open_reader(p, "criteo")
    assert sum(c.rows for c in r) == 3 and r.stats.rows_bad == 1 and r.stats.first_bad_lines == [3]


@pytest.mark.parametrize(
    "content,expected",
    [(None, "no such file"), (b"", "file is empty"), (b"\x1f\x8bnot really gzip", "cannot read")],
)
def test_unreadable_files_one_line(tmp_path, content, expected):
    p = tmp_path / "f.tsv"
    if content is not None:
        p.write_bytes(content)
    with pytest.raises(TraceError) as e:
        list(open_reader(p, "criteo"))
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_directory_and_unknown_format(tmp_path):
    with pytest.raises(TraceError, match="is a directory"):
        open_reader(tmp_path, "criteo")
    f = tmp_path / "x.csv"
    f.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match="unknown format"):
        open_reader(f, "xml")


# ---- Avazu, CSV with sequences, Parquet, libsvm/libfm ------------------------------------
AVAZU = (
    "id,click,hour,C1,banner_pos,site_id,site_domain,device_ip,C14\n"
    "1000009418151094273,0,14102100,1005,0,1fbe01fe,f3845767,ddd2926e,15706\n"
    "10000169349117863715,1,14102100,1005,0,1fbe01fe,f3845767,96809ac8,15704\n"
    "10000371904215119486,0,14102100,1005,1,85f751fd,,b3cf8def,15704\n"
)


def test_avazu(tmp_path):
    p = tmp_path / "train.csv"
    p.write_text(AVAZU)
    r = open_reader(p, "avazu")
    _, n, labels, dense, bags = read_all(r)
    assert n == 3 and labels.tolist() == [0, 1, 0] and dense.shape == (3, 0)
    assert r.feature_names == ["hour", "C1", "banner_pos", "site_id", "site_domain", "device_ip", "C14"]
    assert bags["C1"] == [[1005]] * 3  # decimal strings are kept as integers
    h = fnv1a64(pa.array(["1fbe01fe"]))[0]
    assert bags["site_id"][:2] == [[h], [h]] and bags["site_id"][2] != [h]
    assert bags["site_domain"][2] == []


def test_fnv1a_reference_values():
    # Published FNV-1a 64 test vectors (before the sign mask).
    mask = 0x7FFFFFFFFFFFFFFF
    assert fnv1a64(pa.array([""]))[0] == 0xCBF29CE484222325 & mask
    assert fnv1a64(pa.array(["a"]))[0] == 0xAF63DC4C8601EC8C & mask
    assert fnv1a64(pa.array(["foobar"]))[0] == 0x85944171F73967E8 & mask


def test_csv_multivalued_and_bad_numbers(tmp_path):
    p = tmp_path / "seq.tsv"
    p.write_text("label\tage\thist\tuser\n1\t30\t5|7|9\tu1\n0\tx\t5\tu2\n0\t\t\tu1\n1\t2.5\t7||8\tu3\n")
    r = open_reader(p, "csv", dense="age", multi_sep="|", multi="hist")
    _, n, labels, dense, bags = read_all(r)
    assert n == 3 and r.stats.rows_bad == 1 and r.stats.first_bad_lines == [3]
    assert bags["hist"] == [[5, 7, 9], [], [7, 8]]
    assert dense[:, 0].tolist() == [30.0, 0.0, 2.5]
    assert bags["user"][0] == bags["user"][1]
    with pytest.raises(TraceError, match=r"seq.tsv:3: field age: expected a number, got 'x'"):
        list(open_reader(p, "csv", dense="age", multi_sep="|", multi="hist", strict=True))


def test_parquet_with_list_column(tmp_path):
    t = pa.table({
        "label": pa.array([1, 0, 1, None], pa.int64()),
        "price": pa.array([1.5, None, 3.0, 4.0]),
        "item": pa.array([10, 11, None, 10], pa.int64()),
        "tags": pa.array([[1, 2], [], None, [3]], pa.list_(pa.int64())),
        "city": pa.array(["a", "b", "", "a"]),
    })  # fmt: skip
    p = tmp_path / "d.parquet"
    pq.write_table(t, p, row_group_size=2)
    r = open_reader(p, "parquet", dense="price")
    _, n, labels, dense, bags = read_all(r)
    assert n == 3 and r.stats.rows_bad == 1 and r.stats.first_bad_lines == [4]  # missing label
    assert bags["item"] == [[10], [11], []] and bags["tags"] == [[1, 2], [], []]
    assert dense[:, 0].tolist() == [1.5, 0.0, 3.0]
    assert bags["city"][2] == [] and bags["city"][0] != bags["city"][1]
    with pytest.raises(TraceError, match="row|:4:"):
        list(open_reader(p, "parquet", dense="price", strict=True))
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 garbage")
    with pytest.raises(TraceError, match="Parquet"):
        open_reader(bad, "parquet")


@st.composite
def libsvm_lines(draw):
    lines, expect = [], []
    for _ in range(draw(st.integers(1, 30))):
        toks = draw(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 5000)), max_size=6))
        kind = draw(st.sampled_from(["ok"] * 4 + ["label", "token"]))
        label = draw(st.sampled_from(["0", "1", "-1"])) if kind != "label" else draw(st.sampled_from(["a", "1x"]))
        parts = [label] + [f"{f}:{i}:1" for f, i in toks]
        if kind == "token":
            parts.insert(1 + draw(st.integers(0, len(toks))), draw(st.sampled_from(["3", "a:b:1", "1:2:x", ":"])))
        lines.append(" ".join(parts))
        expect.append((len(lines), kind == "ok", toks))
    return "\n".join(lines) + "\n", expect


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=libsvm_lines())
def test_libfm_malformed(tmp_path, data):
    text, expect = data
    p = tmp_path / "d.libfm"
    p.write_text(text)
    good = [toks for _, ok, toks in expect if ok]
    bad = [ln for ln, ok, _ in expect if not ok]
    if not good:  # every line malformed: either counted, or refused as not libsvm text at all
        try:
            open_reader(p, "libsvm")
        except TraceError as e:
            assert "is libsvm/libfm text" in str(e)
            return
    r = open_reader(p, "libsvm", chunk_bytes=4096)
    chunks = list(r)
    assert sum(c.rows for c in chunks) == len(good) and r.stats.rows_bad == len(bad)
    assert r.stats.first_bad_lines == bad[:10]
    got: dict[str, list] = {}
    for c in chunks:
        for name, (ids, off) in c.sparse.items():
            got.setdefault(name, []).extend(ids[off[i] : off[i + 1]].tolist() for i in range(c.rows))
    for i, toks in enumerate(good):
        for f in {f for f, _ in toks}:
            assert sorted(got[f"f{f}"][i]) == sorted(idx for ff, idx in toks if ff == f)


def test_libsvm_field_map_and_dense(tmp_path):
    p = tmp_path / "d.svm"
    p.write_text("1 1:0.5 2:3 10:1 25:1\n0 2:1 11:1 30:1\n1 1:x 10:1\n")
    fm = tmp_path / "fields.txt"
    fm.write_text("# name lo hi\nnum 1 2\nuser 10 19\nitem 20 39\n")
    r = open_reader(p, "libsvm", field_map=str(fm), dense_fields="num")
    _, n, labels, dense, bags = read_all(r)
    assert n == 2 and r.stats.first_bad_lines == [3]
    assert r.dense_names == ["num_0", "num_1"] and dense.tolist() == [[0.5, 3.0], [0.0, 1.0]]
    assert bags["user"] == [[10], [11]] and bags["item"] == [[25], [30]]


def test_string_ids_rule():
    ids, present = strings_to_ids(pa.array(["42", "", None, "-1", "abc", "007"]))
    assert present.tolist() == [True, False, False, True, True, True]
    assert ids[0] == 42 and ids[5] == 7 and ids[3] == (2**64 - 1) & 0x7FFFFFFFFFFFFFFF
    assert ids[4] == fnv1a64(pa.array(["abc"]))[0] and ids[4] >= 0


def test_large_header_only_csv(tmp_path):
    p = tmp_path / "h.csv"
    p.write_text(",".join(string.ascii_lowercase) + "\n")
    r = open_reader(p, "csv")
    assert list(r) == [] and r.stats.rows_ok == 0


# ---- the real sample through the other readers ---------------------------------------------
def real_rows(criteo_sample_dir, n=1500):
    lines = (criteo_sample_dir / "train_split.tsv").read_text().splitlines()[:n]
    return [line.split("\t") for line in lines]


def criteo_ids(rows, j):
    return [[int(r[14 + j], 16)] if r[14 + j] else [] for r in rows]


def test_real_sample_as_parquet_avazu_and_libfm(criteo_sample_dir, tmp_path):
    rows = real_rows(criteo_sample_dir)
    cols = {"label": pa.array([int(r[0]) for r in rows])}
    for i in range(13):
        cols[f"I{i + 1}"] = pa.array([int(r[1 + i]) if r[1 + i] else None for r in rows], pa.int64())
    for j in range(26):
        cols[f"C{j + 1}"] = pa.array([int(r[14 + j], 16) if r[14 + j] else None for r in rows], pa.int64())
    pq.write_table(pa.table(cols), tmp_path / "c.parquet", row_group_size=500)
    r = open_reader(tmp_path / "c.parquet", "parquet", dense=",".join(f"I{i}" for i in range(1, 14)))
    _, n, labels, dense, bags = read_all(r)
    assert n == len(rows) and bags["C3"] == criteo_ids(rows, 2) and bags["C26"] == criteo_ids(rows, 25)
    assert dense[:, 4].tolist() == [float(x[5]) if x[5] else 0.0 for x in rows]
    # Avazu layout: id, click, then the hashes as text (hashed by the stable rule).
    text = "id,click," + ",".join(f"C{j}" for j in range(1, 27)) + "\n"
    text += "".join(f"{i},{r[0]}," + ",".join(r[14:]) + "\n" for i, r in enumerate(rows))
    (tmp_path / "a.csv").write_text(text)
    _, n, labels, _, bags = read_all(open_reader(tmp_path / "a.csv", "avazu"))
    assert n == len(rows) and labels.tolist() == [float(r[0]) for r in rows]
    want = [[int(strings_to_ids(pa.array([v]))[0][0])] if v else [] for v in (r[16] for r in rows)]
    assert bags["C3"] == want
    # libfm: field:idx:1 with the hash as the index.
    lines = [" ".join([r[0], *(f"{j}:{int(r[14 + j], 16)}:1" for j in range(26) if r[14 + j])]) for r in rows]
    (tmp_path / "c.libfm").write_text("\n".join(lines) + "\n")
    _, n, _, _, bags = read_all(open_reader(tmp_path / "c.libfm", "libsvm"))
    assert n == len(rows) and bags["f2"] == criteo_ids(rows, 2) and bags["f25"] == criteo_ids(rows, 25)


@st.composite
def csv_rows(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kinds = draw(st.lists(st.sampled_from(["ok"] * 4 + ["blank", "extra", "short", "number", "label"]),
                          min_size=1, max_size=40))  # fmt: skip
    lines, expect = ["label,price,user,hist"], []
    for kind in kinds:
        if kind == "blank":
            lines.append("")
            continue
        f = [str(rng.integers(0, 2)), f"{rng.random() * 100:.2f}", f"u{rng.integers(0, 20)}",
             "|".join(str(x) for x in rng.integers(0, 50, rng.integers(0, 4)))]  # fmt: skip
        if kind == "extra":
            f.append("x")
        elif kind == "short":
            f = f[:2]
        elif kind == "number":
            f[1] = draw(st.sampled_from(["1.2.3", "abc", "--4"]))
        elif kind == "label":
            f[0] = draw(st.sampled_from(["", "no"]))
        lines.append(",".join(f))
        expect.append((len(lines), kind == "ok", f))
    return "\n".join(lines) + "\n", expect


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=csv_rows(), gz=st.booleans())
def test_csv_malformed_rows(tmp_path, data, gz):
    text, expect = data
    p = tmp_path / ("d.csv.gz" if gz else "d.csv")
    p.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    good = [f for _, ok, f in expect if ok]
    bad = [ln for ln, ok, _ in expect if not ok]
    if expect and all(len(f) != 4 for _, _, f in expect):  # no row fits the header: not taken for one
        with pytest.raises(TraceError, match="not a header row: it has 4 fields but none of the"):
            open_reader(p, "csv", dense="price")
        return
    r = open_reader(p, "csv", dense="price", multi_sep="|", multi="hist", chunk_bytes=4096)
    _, n, labels, dense, bags = read_all(r)
    assert n == len(good) and r.stats.rows_bad == len(bad) and r.stats.first_bad_lines == bad[:10]
    assert dense[:, 0].tolist() == pytest.approx([float(f[1]) for f in good])
    assert bags["hist"] == [[int(x) for x in f[3].split("|") if x] for f in good]
    if bad:
        with pytest.raises(TraceError, match=rf":{bad[0]}: "):
            list(open_reader(p, "csv", dense="price", strict=True, chunk_bytes=4096))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(labels=st.lists(st.one_of(st.none(), st.sampled_from(["0", "1", "x"])), min_size=1, max_size=30),
       seed=st.integers(0, 1000))  # fmt: skip
def test_parquet_malformed_values(tmp_path, labels, seed):
    rng = np.random.default_rng(seed)
    n = len(labels)
    price = [None if rng.random() < 0.2 else ("bad" if rng.random() < 0.2 else f"{rng.random():.3f}") for _ in range(n)]
    t = pa.table({"label": pa.array(labels, pa.string()), "price": pa.array(price, pa.string()),
                  "item": pa.array(rng.integers(0, 9, n))})  # fmt: skip
    pq.write_table(t, tmp_path / "d.parquet", row_group_size=7)
    ok = [lab in ("0", "1") and p != "bad" for lab, p in zip(labels, price)]
    r = open_reader(tmp_path / "d.parquet", "parquet", dense="price")
    _, got, lab, dense, bags = read_all(r)
    assert got == sum(ok) and r.stats.rows_bad == n - sum(ok)
    assert r.stats.first_bad_lines == [i + 1 for i, k in enumerate(ok) if not k][:10]
    assert lab.tolist() == [float(x) for x, k in zip(labels, ok) if k]
    assert bags["item"] == [[int(v)] for v, k in zip(t.column("item").to_pylist(), ok) if k]
