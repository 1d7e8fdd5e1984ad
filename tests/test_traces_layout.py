"""A file read with the wrong format, header or option is refused with what it looks like;
labels that are not clicks and field maps with holes are malformed input, not data."""

from __future__ import annotations

import gzip
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from picasso.cli import main
from traces.errors import TraceError
from traces.extrapolate import scale_profile
from traces.profile import AccessProfile, profile_file
from traces.readers import open_reader
from traces.sniff import parse_sep
from traces.synth import generate_criteo

FS = [HealthCheck.function_scoped_fixture]


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    p = tmp_path_factory.mktemp("c") / "day.txt"
    generate_criteo(p, 3000, seed=1)
    return p


def libfm_text(rows: int, seed: int = 0, label=lambda r: r % 2) -> str:
    rng = np.random.default_rng(seed)
    out = []
    for r in range(rows):
        toks = [f"{f}:{f * 1000 + int(rng.integers(0, 50))}:1" for f in range(5)]
        out.append(f"{label(r)} " + " ".join(toks))
    return "\n".join(out) + "\n"


def one_line_error(args, *expected):
    r = subprocess.run([sys.executable, "-m", "picasso", *args], capture_output=True, text=True)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    for e in expected:
        assert e in r.stderr, r.stderr
    return r.stderr


# ---- wrong format, header or separator --------------------------------------------------
@settings(max_examples=30, deadline=None, suppress_health_check=FS)
@given(fmt=st.sampled_from(["csv", "avazu"]), sep=st.sampled_from([None, "\t", "tab", "\\t", ",", ";", "|"]),
       strict=st.booleans(), gz=st.booleans(), suffix=st.sampled_from([".txt", ".tsv", ".csv"]))  # fmt: skip
def test_criteo_rows_are_never_taken_for_a_header(criteo, tmp_path, fmt, sep, strict, gz, suffix):
    data = criteo.read_bytes()[:200_000]
    p = tmp_path / ("x" + suffix + (".gz" if gz else ""))
    p.write_bytes(gzip.compress(data) if gz else data)
    with pytest.raises(TraceError) as e:
        profile_file(p, fmt, sep=sep, strict=strict)
    msg = str(e.value)
    assert "not a header row" in msg and "try --format criteo" in msg and "\n" not in msg


def test_wrong_format_of_real_files(criteo_sample_dir, tmp_path):
    tsv, csv_ = criteo_sample_dir / "train_split.tsv", criteo_sample_dir / "kaggle_test_head2000.csv"
    with pytest.raises(TraceError, match=r"41 comma-separated fields, a header row: try --format csv --sep comma"):
        profile_file(csv_, "criteo")
    with pytest.raises(TraceError, match=r"expected 40 comma-separated fields .* try --format criteo"):
        profile_file(tsv, "criteo", sep=",")
    # the user states the header: no guessing, the first row names the columns (numbers here)
    years = tmp_path / "years.csv"
    years.write_text("2019,2020\na,b\n")
    with pytest.raises(TraceError, match="not a header row"):
        open_reader(years, "csv")
    assert open_reader(years, "csv", header=True).feature_names == ["2019", "2020"]
    # --no-header: columns by position
    r = open_reader(tsv, "csv", sep="tab", header=False, label="c1", dense=",".join(f"c{i}" for i in range(2, 15)))
    assert r.feature_names == [f"c{i}" for i in range(15, 41)] and sum(c.rows for c in r) == 7200


@pytest.mark.parametrize("fmt", ["csv", "avazu", "criteo", "libsvm"])
def test_text_formats_refuse_other_layouts(criteo, tmp_path, fmt):
    data = tmp_path / "d.parquet"
    pq.write_table(pa.table({"label": [0, 1], "item": [3, 4]}), data)
    with pytest.raises(TraceError, match="this is a Parquet file, not text: try --format parquet"):
        open_reader(data, fmt)
    if fmt == "libsvm":
        with pytest.raises(TraceError, match="none of the first .* lines is libsvm/libfm text .*try --format criteo"):
            profile_file(criteo, "libsvm")
        csv_ = tmp_path / "a.csv"
        csv_.write_text("click,site,app\n" + "".join(f"{i % 2},s{i},a{i % 3}\n" for i in range(30)))
        with pytest.raises(TraceError, match="3 comma-separated fields, a header row: try --format csv --sep comma"):
            profile_file(csv_, "libsvm")


def test_libfm_read_as_csv_points_at_libsvm(tmp_path):
    p = tmp_path / "apps.libfm"
    p.write_text(libfm_text(50))
    for sep in (None, " ", "\t"):
        with pytest.raises(TraceError, match=r"not a header row: .*libsvm/libfm text .*try --format libsvm"):
            open_reader(p, "csv", sep=sep)


def test_headerless_tsv_as_csv_with_repeated_values(tmp_path):
    p = tmp_path / "h.tsv"
    p.write_text("1\tab\tab\tx1\n0\tcd\tab\tx2\n")
    msg = one_line_error(["analyze", str(p), "--format", "csv", "-o", str(tmp_path / "p.json")],
                         "h.tsv:1: this is not a header row")
    assert "schema" not in msg
    # even when stated as a header, a repeated name is one clear line
    one_line_error(["analyze", str(p), "--format", "csv", "--header"], "column name 'ab' appears 2 times")


def test_sep_names_and_escapes():
    cases = {"tab": "\t", "\\t": "\t", "\t": "\t", "comma": ",", "SEMICOLON": ";", ",": ",", "|": "|", "space": " "}
    assert {text: parse_sep(text) for text in cases} == cases


def test_sep_errors_are_one_line(tmp_path):
    p = tmp_path / "d.tsv"
    p.write_text("label\ta\n1\tx\n")
    one_line_error(["analyze", str(p), "--format", "csv", "--sep", "ab"], "--sep 'ab': expected one character")
    assert main(["analyze", str(p), "--format", "csv", "--sep", "\\t", "--json"]) == 0
    assert main(["analyze", str(p), "--format", "csv", "--sep", "tab", "--json"]) == 0


# ---- labels ------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None, suppress_health_check=FS)
@given(labels=st.lists(st.sampled_from(["0", "1", "7", "-3", "0.5", "1.0", "2"]), min_size=1, max_size=40),
       fmt=st.sampled_from(["criteo", "csv", "libsvm", "parquet"]))  # fmt: skip
def test_labels_outside_0_1_are_malformed_rows(tmp_path, labels, fmt):
    n = len(labels)
    if fmt == "criteo":
        p = tmp_path / "d.tsv"
        p.write_text("".join("\t".join([lab, *["1"] * 13, *["0000000a"] * 26]) + "\n" for lab in labels))
    elif fmt == "csv":
        p = tmp_path / "d.csv"
        p.write_text("label,item\n" + "".join(f"{lab},i{i}\n" for i, lab in enumerate(labels)))
    elif fmt == "libsvm":
        p = tmp_path / "d.svm"
        p.write_text("".join(f"{lab} 1:{i}:1\n" for i, lab in enumerate(labels)))
    else:
        p = tmp_path / "d.parquet"
        pq.write_table(pa.table({"label": pa.array([float(x) for x in labels]), "item": pa.array(range(n))}), p)
    ok = [float(x) in (0.0, 1.0) for x in labels]
    r = open_reader(p, fmt)
    got = np.concatenate([c.labels for c in r] or [np.zeros(0)])
    assert got.tolist() == [float(x) for x, k in zip(labels, ok) if k]
    assert r.stats.rows_bad == n - sum(ok)
    if not all(ok):
        first = ok.index(False) + (2 if fmt == "csv" else 1)
        assert r.stats.first_bad_lines[0] == first
        with pytest.raises(TraceError, match=rf":{first}: .*expected a label 0 or 1"):
            list(open_reader(p, fmt, strict=True))


def test_libsvm_minus_one_is_the_negative_class(tmp_path):
    p = tmp_path / "d.svm"
    p.write_text("-1 3:1\n+1 4:1\n0 5:1\n")
    r = open_reader(p, "libsvm")
    assert np.concatenate([c.labels for c in r]).tolist() == [0, 1, 0] and r.stats.rows_bad == 0


# ---- libsvm fields -----------------------------------------------------------------------
def test_pooled_libsvm_feature_warns_and_points_at_field_map(tmp_path, capsys):
    p = tmp_path / "d.svm"
    rng = np.random.default_rng(0)
    p.write_text("".join(f"{i % 2} " + " ".join(f"{int(x)}:1" for x in rng.integers(0, 5000, 8)) + "\n"
                         for i in range(400)))  # fmt: skip
    prof = profile_file(p, "libsvm")
    assert list(prof.features) == ["f"]
    assert any("one feature 'f'" in w and "--field-map" in w for w in prof.meta["warnings"])
    # a libfm file whose field 3 pools many real fields
    q = tmp_path / "e.libfm"
    q.write_text("".join(f"{i % 2} 0:{i % 7}:1 1:{i % 5}:1 2:{i % 9}:1 3:{i * 13}:1\n" for i in range(600)))
    prof = profile_file(q, "libfm")
    assert [w for w in prof.meta["warnings"] if "'f3'" in w and "--field-map" in w]
    assert main(["analyze", str(q), "--format", "libsvm"]) == 0
    assert "warning: feature 'f3' holds 600 distinct IDs" in capsys.readouterr().err


@settings(max_examples=25, deadline=None, suppress_health_check=FS)
@given(cuts=st.lists(st.integers(0, 99), min_size=1, max_size=6, unique=True), hole=st.integers(0, 99),
       strict=st.booleans())  # fmt: skip
def test_field_map_holes_are_counted_or_refused(tmp_path, cuts, hole, strict):
    """Indices 0..99; the map covers all of them except `hole`."""
    rng = np.random.default_rng(len(cuts) * 100 + hole)
    rows = [rng.integers(0, 100, 5) for _ in range(60)]
    p = tmp_path / "d.svm"
    p.write_text("".join("1 " + " ".join(f"{x}:1" for x in r) + "\n" for r in rows))
    edges = sorted({0, 100, *cuts})
    ranges = [(lo, hi - 1) for lo, hi in zip(edges, edges[1:])]
    fm = tmp_path / "map.txt"
    lines = []
    for k, (lo, hi) in enumerate(ranges):  # split the range holding the hole around it
        parts = [(lo, hi)] if not lo <= hole <= hi else [(lo, hole - 1), (hole + 1, hi)]
        lines += [f"g{k}_{j} {a} {b}" for j, (a, b) in enumerate(parts) if a <= b]
    fm.write_text("\n".join(lines) + "\n")
    lost = sum(int((r == hole).sum()) for r in rows)
    if lost and strict:
        with pytest.raises(TraceError, match=rf"index {hole} is in no range of .*map.txt"):
            list(open_reader(p, "libsvm", field_map=str(fm), strict=True))
        return
    r = open_reader(p, "libsvm", field_map=str(fm), strict=strict)
    kept = sum(len(c.sparse[n][0]) for c in r for n in r.feature_names)
    assert kept == 300 - lost
    warned = [w for w in r.warnings if "no field-map range" in w]
    assert bool(warned) == bool(lost)
    if lost:
        assert f"{lost:,} of 300 tokens ({lost / 300:.1%} of accesses)" in warned[0]


def test_field_map_overlaps_and_misuse(tmp_path):
    p = tmp_path / "d.svm"
    p.write_text("1 1:1 5:1\n0 2:1 7:1\n")
    fm = tmp_path / "map.txt"
    fm.write_text("a 0 5\nb 5 9\n")
    with pytest.raises(TraceError, match=r"ranges of a \(0-5\) and b \(5-9\) overlap"):
        open_reader(p, "libsvm", field_map=str(fm), strict=True)
    assert any("overlap" in w for w in open_reader(p, "libsvm", field_map=str(fm)).warnings)
    fm.write_text("a 5 0\n")
    with pytest.raises(TraceError, match="range 5-0 is empty"):
        open_reader(p, "libsvm", field_map=str(fm))
    crit = tmp_path / "c.tsv"
    crit.write_text("\t".join(["1", *["1"] * 13, *["0000000a"] * 26]) + "\n")
    one_line_error(["analyze", str(crit), "--format", "criteo", "--field-map", str(fm)],
                   "--field-map does not apply to --format criteo (it applies to libsvm)")
    one_line_error(["analyze", str(p), "--format", "libsvm", "--label", "x"], "--label does not apply to --format libsvm")


# ---- outputs -----------------------------------------------------------------------------
def test_output_paths_checked_before_reading_and_no_orphans(tmp_path, capsys):
    p = tmp_path / "c.tsv"
    p.write_text("\t".join(["1", *["1"] * 13, *["0000000a"] * 26]) + "\n")
    (tmp_path / "adir").mkdir()
    one_line_error(["analyze", str(p), "--format", "criteo", "-o", str(p / "nope" / "p.json")],
                   "c.tsv is not a folder")
    one_line_error(["analyze", str(p), "--format", "criteo", "-o", str(tmp_path / "adir")], "is a directory")
    one_line_error(["analyze", str(p), "--format", "criteo", "-o", str(tmp_path / "p.json"), "--html",
                    str(p / "r.html")], "c.tsv is not a folder")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["adir", "c.tsv"]
    assert list((tmp_path / "adir").iterdir()) == []
    assert main(["analyze", str(p), "--format", "criteo"]) == 0
    assert "no profile written (give -o FILE" in capsys.readouterr().err


# ---- extrapolation -----------------------------------------------------------------------
@settings(max_examples=15, deadline=None, suppress_health_check=FS)
@given(card=st.integers(2, 40), seen=st.integers(1, 40), seed=st.integers(0, 99))
def test_cardinality_caps_extrapolation(tmp_path, card, seen, seed):
    seen = min(seen, card)
    rng = np.random.default_rng(seed)
    vals = np.concatenate([np.arange(seen), rng.integers(0, max(seen // 2, 1), 200)])  # a few singletons
    p = tmp_path / "d.csv"
    p.write_text("click,item,other\n" + "".join(f"0,{v},{i}\n" for i, v in enumerate(vals)))
    prof = profile_file(p, "csv")
    big = scale_profile(prof, len(vals) * 5000, cardinality={"item": card})
    f = big.features["item"]
    assert f.distinct <= card and f.model["cardinality"] == card
    assert big.features["other"].distinct > card  # uncapped: grows
    assert any("extrapolating 5,000x" in w for w in big.meta["warnings"])
    with pytest.raises(TraceError, match="no feature 'nope'"):
        scale_profile(prof, 100, cardinality={"nope": 3})


def test_analyze_cardinality_flag(tmp_path, capsys):
    p = tmp_path / "d.csv"
    # 9 known values; one of them seen once
    p.write_text("click,hour\n" + "".join(f"0,{v}\n" for v in [0] * 50 + [1] * 30 + [2] * 10 + [3]))
    assert main(["analyze", str(p), "--format", "csv", "--scale-to", "500000", "--json",
                 "--cardinality", "hour=9"]) == 0  # fmt: skip
    out = capsys.readouterr()
    import json

    rec = json.loads(out.out)[0]
    assert rec["distinct"] <= 9 and "extrapolating 5,495x" in out.err
    one_line_error(["analyze", str(p), "--format", "csv", "--cardinality", "hour=x", "--scale-to", "10"],
                   "--cardinality 'hour=x': expected FIELD=N")


def test_profile_save_json_and_npz_together(tmp_path):
    p = tmp_path / "c.tsv"
    p.write_text("\t".join(["1", *["1"] * 13, *["0000000a"] * 26]) + "\n")
    prof = profile_file(p, "criteo")
    (tmp_path / "x.json").mkdir()
    with pytest.raises((TraceError, OSError), match="is a (directory|folder)"):  # foundation's writer refuses it
        prof.save(tmp_path / "x.json")
    assert not (tmp_path / "x.npz").exists()
    prof.save(tmp_path / "ok.json")
    assert AccessProfile.load(tmp_path / "ok.json").rows == 1
