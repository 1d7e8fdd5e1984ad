import numpy as np
import pytest

from planner.access import ProfileAccess, ZipfAccess, table_access
from planner.model_spec import ModelSpec, TableSpec


def brute(p, lookups, skip=0):
    return float(np.sum(1 - (1 - p[skip:]) ** lookups))


@pytest.mark.parametrize("rows", [50, 5000, 300_000])
def test_zipf_distinct_and_coverage_match_brute_force(rows):
    a = 1.05
    p = np.arange(1, rows + 1, dtype=np.float64) ** -a
    p /= p.sum()
    z = ZipfAccess("t", rows, 1.0, a)
    for lookups, skip in [(100, 0), (4096, 0), (4096, 10), (100_000, 1000)]:
        skip = min(skip, rows)
        assert z.distinct(lookups, skip) == pytest.approx(brute(p, lookups, skip), rel=2e-3)
    for n in [1, 10, rows // 3, rows]:
        assert z.coverage_at(n) == pytest.approx(p[:n].sum(), rel=1e-6)
    n = z.rows_above(1e-3)
    assert (p[:n] >= 1e-3 * (1 - 1e-9)).all() and (n == rows or p[n] < 1e-3)


class FakeFeature:
    """The traces FeatureProfile interface, exact, from raw ids."""

    def __init__(self, raw):
        ids, counts = np.unique(np.asarray(raw, dtype=np.int64), return_counts=True)
        order = np.lexsort((ids, -counts))
        self.ids, self.counts = ids[order], counts[order]
        self.rows = len(raw)
        self.accesses = len(raw)
        self.distinct = len(ids)
        self.pooling = 1.0

    def coverage_at(self, n):
        return self.counts[: int(n)].sum() / self.accesses

    def expected_distinct_per_batch(self, batch_size, skip_top=0):
        p = self.counts / self.accesses
        return brute(p, batch_size * self.pooling, skip_top)

    def hot_ids(self, n):
        return self.ids[:n]


def test_profile_access_uses_measured_counts_and_folds_ids_onto_capped_rows():
    rng = np.random.default_rng(0)
    raw = (rng.zipf(1.3, 20_000) * 7919 + 10**9).astype(np.int64)  # large raw hashes
    f = FakeFeature(raw)
    acc = ProfileAccess("C1", 10**12, f, 1.0)  # plenty of rows: ids are rows
    assert acc.coverage_at(10) == pytest.approx(f.coverage_at(10))
    assert acc.distinct(512) == pytest.approx(f.expected_distinct_per_batch(512))
    capped = ProfileAccess("C1", 100, f, 1.0)  # 100 rows: ids fold as id % 100
    rows = capped.hot_rows(100)
    assert len(np.unique(rows)) == 100 and rows.min() >= 0 and rows.max() < 100
    folded = np.bincount(raw % 100, minlength=100)
    assert rows[0] == np.argmax(folded)
    assert capped.coverage_at(5) == pytest.approx(np.sort(folded)[::-1][:5].sum() / len(raw))
    assert capped.distinct(10**6) == pytest.approx(100, rel=1e-3)  # every row seen


def test_table_access_falls_back_to_zipf_for_missing_features():
    model = ModelSpec("m", "dlrm", 1, (TableSpec("a", 1000, 4, pooling_factor=2.0), TableSpec("b", 10, 4)))

    class Prof:
        features = {"b": FakeFeature([1, 1, 2, 3])}

    acc = table_access(model, Prof())
    assert acc["a"].source.startswith("zipf") and acc["a"].pooling == 2.0
    assert acc["b"].source == "profile"
    assert table_access(model)["b"].source.startswith("zipf")


def test_wide_tables_are_planned_from_the_features_they_train_on(tmp_path):
    """Wide&Deep's wide tables W1..W26 read the Criteo columns C1..C26 (executor.data.batches): the
    planner takes their statistics from the same measured features, not an assumed Zipf."""
    from executor.data.batches import feature_map
    from planner.access import ProfileAccess, table_access, unmatched_tables
    from planner.presets import get_model
    from traces.profile import profile_file
    from traces.synth import generate_criteo

    data = tmp_path / "d.tsv"
    generate_criteo(data, 2000, seed=0)
    profile = profile_file(data, "criteo")
    model = get_model("wide-deep")
    access = table_access(model, profile)
    wide = [t.name for t in model.tables if t.name.startswith("W")]
    assert wide and all(isinstance(access[t], ProfileAccess) for t in wide)
    assert not unmatched_tables(model, profile)
    fmap = feature_map(model, profile.features)
    assert all(access[t].feature is profile.features[fmap[t]] for t in wide)
