"""AccessProfile: exact counts, sketch past the cap, coverage, batch presence, stability, save/load."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

from traces.counting import IdCounter
from traces.errors import TraceError
from traces.profile import AccessProfile, FeatureProfile, profile_file
from traces.synth import generate_criteo


def python_counts(path, col):
    c = collections.Counter()
    for line in open(path):
        f = line.rstrip("\n").split("\t")
        if f[col]:
            c[int(f[col], 16)] += 1
    return c


def test_real_sample_distinct_and_counts_exact(criteo_sample_dir, tmp_path):
    path = criteo_sample_dir / "train_split.tsv"
    prof = profile_file(path, "criteo", batch_size=256, chunk_bytes=256 << 10)
    assert prof.rows == 7200
    for j in range(26):
        want = python_counts(path, 14 + j)
        f = prof.features[f"C{j + 1}"]
        assert f.exact and f.distinct == len(want)
        assert f.accesses == sum(want.values()) and f.missing == 7200 - f.accesses
        assert dict(zip(f.ids.tolist(), f.counts.tolist())) == dict(want)
        assert np.all(np.diff(f.counts) <= 0)
    prof.save(tmp_path / "p.json")
    back = AccessProfile.load(tmp_path / "p.json")
    for name, f in prof.features.items():
        g = back.features[name]
        assert g.distinct == f.distinct and np.array_equal(g.ids, f.ids) and np.array_equal(g.counts, f.counts)
        assert g.coverage(0.1) == pytest.approx(f.coverage(0.1))
        assert np.array_equal(g.presence_hist, f.presence_hist)
        assert np.allclose(g.stability_later, f.stability_later)
    doc = json.loads((tmp_path / "p.json").read_text())
    assert [d["name"] for d in doc["features"]] == [f"C{i}" for i in range(1, 27)]
    assert (tmp_path / "p.npz").is_file()


def brute_force_profile(rows: list[list[int]], B: int):
    flat = [x for r in rows for x in r]
    cnt = collections.Counter(flat)
    batches = [rows[i : i + B] for i in range(0, len(rows) - B + 1, B)]
    pres = collections.Counter()
    for b in batches:
        pres.update({x for r in b for x in r})
    return cnt, pres, len(batches)


def test_coverage_presence_and_expected_distinct(tmp_path):
    path = tmp_path / "s.tsv"
    generate_criteo(path, 20000, seed=3)
    prof = profile_file(path, "criteo", batch_size=500, presence_batches=30, chunk_bytes=512 << 10)
    lines = path.read_text().splitlines()
    for name, col in (("C2", 15), ("C26", 39)):
        rows = [[int(x.split("\t")[col], 16)] if x.split("\t")[col] else [] for x in lines]
        f = prof.features[name]
        cnt, _, _ = brute_force_profile(rows, 500)
        counts = np.sort(np.fromiter(cnt.values(), np.int64))[::-1]
        total = counts.sum()
        for n in (1, 7, 100, len(counts)):
            assert f.coverage_at(n) == pytest.approx(counts[:n].sum() / total)
        top = -(-len(counts) // 10)  # whole IDs: ceil(10% of distinct)
        assert f.coverage(0.1) == pytest.approx(counts[:top].sum() / total)
        assert f.hot_ids(3).tolist() == f.ids[:3].tolist() and cnt[int(f.ids[0])] == counts[0]
        # Batch presence: at most 30 batches, spread over the file (every 2nd of ~40 here).
        assert 10 <= f.presence_batches <= 30
        assert len(f.presence_hist) == f.presence_batches + 1 and f.presence_hist[-1] >= 1
        # Expected distinct per batch: the formula against a direct evaluation and the measurement.
        p = counts / total
        L = 500 * f.pooling
        assert f.expected_distinct_per_batch(500) == pytest.approx(np.sum(1 - (1 - p) ** L), rel=1e-9)
        assert f.expected_distinct_per_batch(500, skip_top=5) == pytest.approx(np.sum(1 - (1 - p[5:]) ** L), rel=1e-9)
        measured = f.measured_distinct_per_batch()
        assert measured == pytest.approx(f.expected_distinct_per_batch(500), rel=0.1)
        # Stability on a stationary trace: later coverage of the early hot set is close to the oracle.
        assert len(f.stability_later) == 3
        assert np.all(f.stability_later <= f.stability_oracle + 1e-12)
        assert f.stability_later[-1] > 0.8 * f.stability_oracle[-1]


def test_presence_hist_exact_on_one_chunk(tmp_path):
    path = tmp_path / "s.tsv"
    generate_criteo(path, 3000, seed=5)
    prof = profile_file(path, "criteo", batch_size=256)
    lines = path.read_text().splitlines()
    rows = [[int(x.split("\t")[15], 16)] if x.split("\t")[15] else [] for x in lines]
    # The split for stability cuts the single chunk in two: batches restart at the cut.
    f = prof.features["C2"]
    cut = round(3000 * 0.5)
    _, p1, n1 = brute_force_profile(rows[:cut], 256)
    _, p2, n2 = brute_force_profile(rows[cut:], 256)
    pres = p1 + p2
    assert f.presence_batches == n1 + n2
    assert np.array_equal(f.presence_hist, np.bincount(list(pres.values()), minlength=n1 + n2 + 1))


def test_sketch_past_the_cap():
    rng = np.random.default_rng(0)
    ids = (rng.zipf(1.3, 400_000) * 2654435761) % (1 << 40)
    exact = collections.Counter(ids.tolist())
    c = IdCounter(exact_cap=5000, sketch_k=4096)
    for part in np.array_split(ids, 40):
        c.add(part)
    assert not c.exact
    d = c.distinct()
    assert abs(d / len(exact) - 1) < 0.06  # KMV with k=4096: ~1.6% standard error
    top, counts = c.sorted_desc()
    true_top = sorted(exact.values(), reverse=True)[:50]
    assert counts[:50].tolist() == true_top  # the heavy head is exact (ties may swap IDs)
    assert all(exact[int(k)] == v for k, v in zip(top[:50], counts[:50]))
    err = np.array([exact[int(k)] - v for k, v in zip(top[:5000], counts[:5000])])
    assert np.all(err >= 0) and np.all(err <= c.error_bound)


def test_sketched_profile_coverage_close_to_exact(tmp_path):
    path = tmp_path / "s.tsv"
    generate_criteo(path, 60000, seed=2, cardinalities=[2_000_000] * 3 + [10] * 23,
                    zipf_s=[0.9, 1.05, 1.2] + [1.0] * 23, missing=0.0)  # fmt: skip
    exact = profile_file(path, "criteo", chunk_bytes=1 << 20)
    sk = profile_file(path, "criteo", exact_cap=3000, chunk_bytes=1 << 20)
    for name in ("C1", "C2", "C3"):
        e, s = exact.features[name], sk.features[name]
        assert e.exact and not s.exact
        assert abs(s.distinct / e.distinct - 1) < 0.06
        for x in (0.01, 0.1, 0.5):
            assert abs(s.coverage(x) - e.coverage(x)) < 0.03
        assert s.expected_distinct_per_batch(4096) == pytest.approx(e.expected_distinct_per_batch(4096), rel=0.05)


def test_expected_distinct_grouped_for_big_features():
    counts = np.maximum(1, 1e7 * np.arange(1, 3_000_001) ** -1.1).astype(np.int64)
    f = FeatureProfile(name="x", rows=3_000_000, missing=0, distinct=len(counts), accesses=int(counts.sum()),
                       ids=np.arange(len(counts)), counts=counts)  # fmt: skip
    # One group per distinct count value: the planner's calls cost O(groups), not O(IDs).
    assert len(f.group_values) < 10_000
    p = counts / counts.sum()
    L = 4096 * f.pooling
    for k in (0, 1, 1234, 2_999_999):
        want = np.sum(-np.expm1(L * np.log1p(-p[k:])))
        assert f.expected_distinct_per_batch(4096, skip_top=k) == pytest.approx(want, rel=1e-9)


def test_no_valid_rows_is_an_error(tmp_path):
    p = tmp_path / "bad.tsv"
    p.write_text("just one field\nanother\n")
    with pytest.raises(TraceError, match="expected 40 tab-separated fields .* none of the first 2 lines"):
        profile_file(p, "criteo")
    # Criteo's width, every row malformed: the reason is given without --strict
    p.write_text("\t".join(["1", *["1"] * 13, *["0000000a"] * 25, "nothex!!"]) + "\n")
    with pytest.raises(TraceError, match=r"no valid rows \(1 malformed; first: .*:1: field C26: expected 8 hex"):
        profile_file(p, "criteo")


def test_load_errors(tmp_path):
    with pytest.raises(TraceError, match="no such profile"):
        AccessProfile.load(tmp_path / "none.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(TraceError, match="not a profile"):
        AccessProfile.load(tmp_path / "x.json")
