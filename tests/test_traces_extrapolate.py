"""Extrapolation from a 10% row sample to the whole trace, validated against exact counts.

Measured errors (bench/bench_traces.py, bench/results/traces.json) are larger than zero;
the tolerances below are the documented accuracy, tight enough to catch a broken fit
(for instance, scaling the sample's distinct count linearly misses C3 by about 30%).
"""

from __future__ import annotations

import numpy as np
import pytest

from traces.extrapolate import ZipfMandelbrotFit, scale_profile, validation_errors, write_row_sample
from traces.profile import AccessProfile, profile_file
from traces.synth import ZipfSampler, generate_criteo

HEAVY = ("C3", "C4", "C7", "C10", "C16", "C24", "C26")


def subset(p: AccessProfile, names) -> AccessProfile:
    return AccessProfile(features={n: p.features[n] for n in names}, rows=p.rows, source=p.source,
                         batch_size=p.batch_size, meta=p.meta)  # fmt: skip


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    d = tmp_path_factory.mktemp("extrap")
    full, sub = d / "full.tsv", d / "sub.tsv"
    generate_criteo(full, 200_000, seed=21)
    write_row_sample(full, sub, 0.1, seed=2)
    names = (*HEAVY, "C2", "C9")
    return subset(profile_file(full, "criteo"), names), subset(profile_file(sub, "criteo"), names)


def test_synthetic_sample_predicts_whole(synthetic):
    full, sub = synthetic
    assert 19_000 < sub.rows < 21_000
    errs = {e["name"]: e for e in validation_errors(full, sub)}
    for name in HEAVY:
        e = errs[name]
        assert abs(e["distinct_rel_err"]) < 0.08, e
        assert abs(e["cov_err_top1pct"]) < 0.03 and abs(e["cov_err_top10pct"]) < 0.03, e
    # Scaling the sample's distinct count linearly would be far off: the check can tell.
    c3 = errs["C3"]
    assert c3["sample_distinct"] * full.rows / sub.rows / c3["true_distinct"] - 1 > 0.2
    # Small vocabularies fully seen in the sample stay as they are.
    assert errs["C2"]["model"] == "complete" and abs(errs["C2"]["distinct_rel_err"]) < 0.01
    assert errs["C9"]["pred_distinct"] == 3


def test_scaled_profile_is_usable(synthetic, tmp_path):
    full, sub = synthetic
    big = scale_profile(sub, full.rows)
    f, g = full.features["C3"], big.features["C3"]
    assert g.extrapolated_to == full.rows and not g.exact and g.model["kind"] == "zipf-mandelbrot"
    assert g.hot_ids(10).tolist() == sub.features["C3"].ids[:10].tolist()
    assert g.pooling == pytest.approx(f.pooling, rel=0.02)
    assert g.expected_distinct_per_batch(4096) == pytest.approx(f.expected_distinct_per_batch(4096), rel=0.05)
    big.save(tmp_path / "big.json")
    back = AccessProfile.load(tmp_path / "big.json")
    assert back.features["C3"].distinct == g.distinct and back.features["C3"].model == g.model
    assert back.features["C3"].coverage(0.01) == pytest.approx(g.coverage(0.01))


def test_fit_recovers_known_parameters():
    rng = np.random.default_rng(0)
    s = ZipfSampler(200_000, 1.05)
    counts = np.bincount(s.sample(rng, 100_000))
    fit = ZipfMandelbrotFit(counts[counts > 0]).fit()
    assert fit.s == pytest.approx(1.05, abs=0.08)
    assert fit.deviance / len(fit.edges) < 5  # a good fit: deviance about one per class


def test_real_sample_ten_percent_predicts_8k(criteo_sample_dir, tmp_path):
    full_path = tmp_path / "criteo_8k.tsv"
    full_path.write_bytes(b"".join((criteo_sample_dir / f).read_bytes()
                                   for f in ("train_split.tsv", "dev_split.tsv", "test_split.tsv")))  # fmt: skip
    sub_path = tmp_path / "sub.tsv"
    write_row_sample(full_path, sub_path, 0.1, seed=1)
    full = profile_file(full_path, "criteo")
    assert full.rows == 8000
    big = [n for n, f in full.features.items() if f.distinct >= 1000]
    errs = validation_errors(subset(full, big), subset(profile_file(sub_path, "criteo"), big))
    d = np.abs([e["distinct_rel_err"] for e in errs])
    c1 = np.abs([e["cov_err_top1pct"] for e in errs])
    c10 = np.abs([e["cov_err_top10pct"] for e in errs])
    assert len(errs) >= 12
    assert np.median(d) < 0.12 and d.max() < 0.3, d
    assert np.median(c1) < 0.03 and c1.max() < 0.12, c1
    assert np.median(c10) < 0.05 and c10.max() < 0.12, c10


def test_sketched_sample_extrapolates_like_exact(synthetic, tmp_path):
    """A profile past its exact cap (head + KMV tail) still fits from its frequency groups."""
    full, _ = synthetic
    sub_path = tmp_path / "sub.tsv"
    generate_criteo(sub_path, 20_000, seed=33)
    exact = subset(profile_file(sub_path, "criteo"), ["C3"])
    sk = subset(profile_file(sub_path, "criteo", exact_cap=2000), ["C3"])
    assert exact.features["C3"].exact and not sk.features["C3"].exact
    a = scale_profile(exact, full.rows).features["C3"]
    b = scale_profile(sk, full.rows).features["C3"]
    assert b.model["kind"] == "zipf-mandelbrot"
    assert b.distinct == pytest.approx(a.distinct, rel=0.1)
    assert b.coverage(0.01) == pytest.approx(a.coverage(0.01), abs=0.03)
