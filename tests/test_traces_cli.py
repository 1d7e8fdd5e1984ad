"""`picasso synth` and `picasso analyze` end to end, and the synthetic generator."""

from __future__ import annotations

import collections
import json
import subprocess
import sys

import numpy as np
import pytest

from picasso.cli import main
from traces.errors import TraceError
from traces.profile import AccessProfile
from traces.synth import CRITEO_KAGGLE_CARDINALITIES, ZipfSampler, generate_criteo, scramble


def test_analyze_json_reports_exact_distinct_of_real_sample(criteo_sample_dir, capsys):
    path = criteo_sample_dir / "train_split.tsv"
    assert main(["analyze", str(path), "--format", "criteo", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    distinct = {r["name"]: r["distinct"] for r in records}
    # Straightforward count of distinct non-missing values per column.
    seen = [set() for _ in range(26)]
    for line in path.read_text().splitlines():
        f = line.split("\t")
        for j in range(26):
            if f[14 + j]:
                seen[j].add(f[14 + j])
    assert distinct == {f"C{j + 1}": len(seen[j]) for j in range(26)}


def test_synth_then_analyze_with_outputs(tmp_path, capsys):
    data = tmp_path / "d.tsv"
    assert main(["synth", "--preset", "criteo-kaggle", "--rows", "3000", "-o", str(data), "--seed", "4"]) == 0
    assert len(data.read_text().splitlines()) == 3000
    out = tmp_path / "p.json"
    html = tmp_path / "r.html"
    capsys.readouterr()
    rc = main(["analyze", str(data), "--format", "criteo", "--batch-size", "256", "-o", str(out),
               "--html", str(html), "--scale-to", "30000"])  # fmt: skip
    assert rc == 0
    text = capsys.readouterr().out
    assert "C26" in text and "extrapolated to 30,000 rows" in text
    prof = AccessProfile.load(out)
    assert prof.rows == 30000 and all(f.extrapolated_to == 30000 for f in prof.features.values())
    page = html.read_text()
    assert "plotly" in page.lower() and "Top-k coverage" in page and len(page) > 1_000_000  # plotly.js inlined


def test_cli_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("\t".join(["1", *["1"] * 13, *["0000000a"] * 25, "nothex!!"]) + "\n")
    for args, expected in (
        (["analyze", str(tmp_path / "missing.tsv"), "--format", "criteo"], "no such file"),
        (["analyze", str(bad), "--format", "criteo", "--strict"], f"{bad}:1: field C26: expected 8 hex"),
        (["analyze", str(bad), "--format", "criteo"], "no valid rows"),
    ):
        r = subprocess.run([sys.executable, "-m", "picasso", *args], capture_output=True, text=True)
        assert r.returncode == 2, r.stderr
        assert r.stderr.count("\n") == 1 and expected in r.stderr and "Traceback" not in r.stderr


def test_synth_deterministic_and_shaped(tmp_path):
    a, b, c = tmp_path / "a.tsv", tmp_path / "b.tsv", tmp_path / "c.tsv.gz"
    generate_criteo(a, 70000, seed=7)
    generate_criteo(b, 70000, seed=7)
    generate_criteo(c, 1000, seed=8)
    assert a.read_bytes() == b.read_bytes()
    import gzip

    assert len(gzip.decompress(c.read_bytes()).splitlines()) == 1000
    lines = a.read_text().splitlines()
    assert len(lines) == 70000
    fields = [x.split("\t") for x in lines]
    assert all(len(f) == 40 for f in fields)
    clicks = np.mean([int(f[0]) for f in fields])
    assert 0.24 < clicks < 0.26
    for j, card in enumerate(CRITEO_KAGGLE_CARDINALITIES):
        vals = [f[14 + j] for f in fields if f[14 + j]]
        assert all(len(v) == 8 for v in vals[:100])
        cnt = collections.Counter(vals)
        assert len(cnt) <= card
        if card <= 30:
            # Small vocabularies: the IDs are exactly the scrambled ranks 0..card-1.
            allowed = {f"{x:08x}" for x in scramble(np.arange(card), j)}
            assert set(cnt) <= allowed
    # Missing rates near the preset's (C22: 81.9%, C1: 0).
    assert sum(1 for f in fields if not f[14 + 21]) / 70000 == pytest.approx(0.819, abs=0.01)
    assert all(f[14] for f in fields)


def test_zipf_sampler_matches_its_law():
    s = ZipfSampler(5000, 1.1)
    r = s.sample(np.random.default_rng(0), 400_000)
    assert r.min() >= 0 and r.max() < 5000
    emp = np.bincount(r, minlength=5000) / len(r)
    p = s.probabilities(np.arange(5000))
    assert p.sum() == pytest.approx(1.0, abs=1e-3)
    assert np.abs(emp[:20] - p[:20]).max() < 0.004
    # Tail (continuous part) mass per decade agrees with the law.
    for lo, hi in ((1024, 2000), (2000, 5000)):
        assert emp[lo:hi].sum() == pytest.approx(p[lo:hi].sum(), rel=0.03)


def test_scramble_is_a_bijection_per_feature():
    x = np.arange(1 << 18)
    for j in (0, 25):
        y = scramble(x, j)
        assert len(np.unique(y)) == len(x) and y.min() >= 0 and y.max() < 1 << 32
    assert not np.array_equal(scramble(x[:10], 0), scramble(x[:10], 1))


def test_synth_rejects_bad_parameters(tmp_path):
    with pytest.raises(TraceError, match="26 entries"):
        generate_criteo(tmp_path / "x.tsv", 10, cardinalities=[10, 20])
    with pytest.raises(TraceError, match="unknown synth preset"):
        generate_criteo(tmp_path / "x.tsv", 10, preset="nope")
    (tmp_path / "f").write_text("")
    with pytest.raises(OSError, match="f is not a folder"):
        generate_criteo(tmp_path / "f" / "x.tsv", 10)
