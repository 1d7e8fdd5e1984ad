"""Per-table access statistics the planner needs, from a measured profile or a Zipf fallback.

Lowering and search ask three questions of each table, always in terms of table rows
(IDs map to rows as `id % num_rows`):
- `pooling`: mean IDs per sample;
- `coverage_at(n)`: the fraction of lookups that hit the n hottest rows;
- `distinct(lookups, skip_top)`: expected distinct rows among `lookups` independent
  lookups, leaving out the `skip_top` hottest rows: the sum over rows of 1-(1-p)^L.
And `hot_rows(n)` gives the n hottest rows themselves (for the plan's hot-ID file).

With a `traces.AccessProfile` the answers come from the measured counts
(`ProfileAccess`); with none, or for a table the profile lacks, the planner assumes
Zipf(alpha) over the table's rows with the TableSpec's pooling factor (`ZipfAccess`,
alpha = 1.05 unless the model's `extra["zipf_alpha"]` says otherwise). `picasso plan`
refuses a profile that lacks tables unless told to assume (`unmatched_tables`), and
`access_sources` says per table which of the two it got.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from planner.features import data_feature
from planner.model_spec import ModelSpec, TableSpec
from planner.presets import DEFAULT_ZIPF_ALPHA
from traces.coverage import presence

if TYPE_CHECKING:  # types only: the seams' own classes, not loaded at import
    from traces.profile import AccessProfile


MEASURED = "profile"  # TableAccess.source of statistics read from a profile; any other is assumed


def assumed(sources: list[str]) -> bool:
    """Some table's statistics were assumed, not measured (a plan's Provenance.access_source)."""
    return any(src != MEASURED for src in sources)


class TableAccess(Protocol):
    name: str
    num_rows: int
    pooling: float
    source: str  # "profile" or "zipf(1.05)"

    def coverage_at(self, n: int) -> float: ...
    def distinct(self, lookups: float, skip_top: int = 0) -> float: ...
    def hot_rows(self, n: int) -> np.ndarray: ...
    def head(self, skip: int, m: int) -> tuple[np.ndarray, np.ndarray]: ...
    def rows_above(self, p_min: float) -> int: ...


# ---- Zipf fallback ------------------------------------------------------------------


def _log_buckets(n: int, per_decade: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Rank buckets [lo, hi) covering 1..n: exact for the first 256 ranks, then log-spaced."""
    head = np.arange(1, min(n, 256) + 1, dtype=np.float64)
    if n <= 256:
        return head, head + 1
    edges = np.unique(np.round(np.logspace(math.log10(257), math.log10(n + 1), per_decade * 8)).astype(np.int64))
    edges = np.concatenate(([257], edges[edges > 257]))
    if edges[-1] != n + 1:
        edges = np.append(edges, n + 1)
    lo = np.concatenate((head, edges[:-1].astype(np.float64)))
    hi = np.concatenate((head + 1, edges[1:].astype(np.float64)))
    return lo, hi


@lru_cache(maxsize=64)
def _head_sums(alpha: float) -> np.ndarray:
    """H(n, alpha) for n = 0..4096, exact."""
    return np.concatenate(([0.0], np.cumsum(np.arange(1, 4097, dtype=np.float64) ** -alpha)))


class ZipfAccess:
    """Zipf(alpha) over the rows of one table: row r (0-based) has weight (r+1)^-alpha.

    Sums over rows are taken on ~600 log-spaced rank buckets (exact for the first 256
    ranks), so a 40M-row table costs as much as a small one.
    """

    def __init__(self, name: str, num_rows: int, pooling: float, alpha: float = DEFAULT_ZIPF_ALPHA) -> None:
        self.name, self.num_rows, self.pooling, self.alpha = name, int(num_rows), float(pooling), float(alpha)
        self.source = f"zipf({alpha:g})"
        lo, hi = _log_buckets(self.num_rows)
        self._lo, self._hi = lo, hi
        self._count = hi - lo
        # mean probability of a rank in each bucket, from exact partial harmonic sums
        total = self._h(self.num_rows)
        cum = self._h_vec(hi - 1)
        prev = self._h_vec(lo - 1)
        self._p = (cum - prev) / total / self._count
        self._total = total
        self._cache: dict[tuple[int, int], float] = {}

    def _h_vec(self, n: np.ndarray) -> np.ndarray:
        """Generalised harmonic numbers H(n, alpha) = sum_{i<=n} i^-alpha."""
        n = np.asarray(n, dtype=np.float64)
        a = self.alpha
        out = np.zeros_like(n)
        small = n <= 4096
        if small.any():
            out[small] = _head_sums(a)[n[small].astype(np.int64)]
        big = ~small
        if big.any():
            from scipy.special import zeta  # here: scipy's import costs every rank 0.1 s at start

            if abs(a - 1.0) < 1e-9:
                # Euler-Maclaurin: H(n) ~ ln n + gamma + 1/(2n)
                out[big] = np.log(n[big]) + 0.5772156649015329 + 0.5 / n[big]
            elif a > 1:
                out[big] = zeta(a) - zeta(a, n[big] + 1)
            else:
                # H(n, a) ~ n^(1-a)/(1-a) + zeta(a) + n^-a/2 for a < 1
                out[big] = n[big] ** (1 - a) / (1 - a) + zeta(a) + 0.5 * n[big] ** -a
        return out

    def coverage_at(self, n: int) -> float:
        n = max(0, min(int(n), self.num_rows))
        return 0.0 if n == 0 else min(1.0, self._h(n) / self._total)

    def _h(self, n: float) -> float:
        if n <= 4096:
            return float(_head_sums(self.alpha)[int(n)])
        return float(self._h_vec(np.array([float(n)]))[0])

    def distinct(self, lookups: float, skip_top: int = 0) -> float:
        if lookups <= 0:
            return 0.0
        key = (int(round(lookups)), int(skip_top))
        value = self._cache.get(key)
        if value is None:
            value = self._cache[key] = self._distinct(lookups, skip_top)
        return value

    def rows_above(self, p_min: float) -> int:
        """How many rows have a per-lookup probability of at least p_min."""
        if p_min <= 0:
            return self.num_rows
        return int(min(self.num_rows, math.floor((p_min * self._total) ** (-1.0 / self.alpha))))

    def _distinct(self, lookups: float, skip_top: int) -> float:
        skip = max(0, min(int(skip_top), self.num_rows))
        # buckets fully past the skipped head, plus the part of the straddling bucket
        keep = np.clip(self._hi - 1 - np.maximum(self._lo - 1, skip), 0, None)
        q = presence(self._p, lookups)
        return float(np.sum(keep * q))

    def hot_rows(self, n: int) -> np.ndarray:
        return np.arange(min(int(n), self.num_rows), dtype=np.int64)

    def head(self, skip: int, m: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows ranked skip..skip+m-1 by hotness and their per-lookup probabilities."""
        rows = np.arange(skip, min(skip + m, self.num_rows), dtype=np.int64)
        return rows, (rows + 1.0) ** -self.alpha / self._total


# ---- measured profile ---------------------------------------------------------------


def groups_of(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Counts -> (distinct count values descending, number of rows with each)."""
    if len(counts) == 0:
        return np.zeros(0), np.zeros(0)
    vals, mult = np.unique(np.asarray(counts, dtype=np.float64), return_counts=True)
    return vals[::-1], mult[::-1].astype(np.float64)


class ProfileAccess:
    """Access statistics of one table from a traces FeatureProfile (raw IDs hashed to rows)."""

    def __init__(self, name: str, num_rows: int, feature: Any, pooling_fallback: float) -> None:
        self.name, self.num_rows, self.source = name, int(num_rows), MEASURED
        self.feature = feature
        pooling = float(getattr(feature, "pooling", 0.0) or 0.0)
        self.pooling = pooling if pooling > 0 else pooling_fallback
        ids = np.asarray(feature.ids, dtype=np.int64)
        counts = np.asarray(feature.counts, dtype=np.float64)
        # Data sets map each distinct value to its own row, so IDs are rows as long as the
        # table has room; only a table capped below the feature's distinct count (CPU runs
        # with --row-cap) folds IDs onto rows, and then counts of colliding IDs add up.
        # (extrapolated distinct counts are estimates: only a clear excess means folding)
        distinct = float(getattr(feature, "distinct", len(ids)) or len(ids))
        self._hashed = distinct > 1.5 * self.num_rows
        if self._hashed:
            rows = np.mod(ids, self.num_rows)
            uniq, inv = np.unique(rows, return_inverse=True)
            merged = np.zeros(len(uniq))
            np.add.at(merged, inv, counts)
            order = np.lexsort((uniq, -merged))
            self._rows, self._counts = uniq[order], merged[order]
        else:
            self._rows, self._counts = np.mod(ids, self.num_rows), counts
        self._cache: dict[tuple[int, int], float] = {}
        # the whole distribution (head and summarised tail) as (count, number of IDs) groups
        gv = getattr(feature, "group_values", None)
        gs = getattr(feature, "group_sizes", None)
        if gv is not None and gs is not None and len(gv) and not self._hashed:
            self._gv, self._gs = np.asarray(gv, dtype=np.float64), np.asarray(gs, dtype=np.float64)
        else:
            self._gv, self._gs = groups_of(self._counts)
        self._accesses = float(np.dot(self._gv, self._gs)) or float(self._counts.sum()) or 1.0

    def head(self, skip: int, m: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows ranked skip..skip+m-1 by measured count and their per-lookup probabilities."""
        rows = np.mod(self._rows[skip: skip + m], self.num_rows)
        return rows, self._counts[skip: skip + m] / self._accesses

    def rows_above(self, p_min: float) -> int:
        """How many rows have a measured per-lookup probability of at least p_min."""
        sel = self._gv / self._accesses >= p_min
        return int(min(self.num_rows, self._gs[sel].sum()))

    def coverage_at(self, n: int) -> float:
        n = max(0, min(int(n), self.num_rows))
        if n == 0:
            return 0.0
        if not self._hashed:
            return float(self.feature.coverage_at(n))
        return float(min(1.0, self._counts[:n].sum() / self._accesses))

    def distinct(self, lookups: float, skip_top: int = 0) -> float:
        if lookups <= 0:
            return 0.0
        key = (int(round(lookups)), int(skip_top))
        if key not in self._cache:
            self._cache[key] = self._distinct(lookups, skip_top)
        return self._cache[key]

    def _distinct(self, lookups: float, skip_top: int) -> float:
        batch = max(lookups / max(self.pooling, 1e-9), 1.0)
        if not self._hashed:
            value = float(self.feature.expected_distinct_per_batch(int(round(batch)), skip_top=int(skip_top)))
        else:
            cum = np.concatenate(([0.0], np.cumsum(self._gs)))
            keep = np.clip(cum[1:] - np.maximum(cum[:-1], float(skip_top)), 0.0, None)
            p = self._gv / self._accesses
            value = float(np.dot(keep, presence(p, lookups)))
        return min(value, float(self.num_rows - min(skip_top, self.num_rows)), lookups)

    def hot_rows(self, n: int) -> np.ndarray:
        """The n hottest rows (id % num_rows, first occurrence kept), distinct.

        Padded with the lowest unused rows when the profile knows fewer hot IDs than n.
        """
        n = min(int(n), self.num_rows)
        rows = self._rows[: max(n * 2, n + 64)] if self._hashed else self._rows
        _, first = np.unique(rows, return_index=True)
        rows = rows[np.sort(first)][:n]
        if len(rows) < n:
            pad = np.setdiff1d(np.arange(min(self.num_rows, n + len(rows)), dtype=np.int64), rows)[: n - len(rows)]
            rows = np.concatenate((rows, pad))
        return rows.astype(np.int64)


def table_access(model: ModelSpec, profile: AccessProfile | None = None) -> dict[str, TableAccess]:
    """Access statistics for every table of `model`, from `profile` where it has the feature."""
    alpha_cfg = model.extra.get("zipf_alpha", DEFAULT_ZIPF_ALPHA)
    features = getattr(profile, "features", {}) if profile is not None else {}
    out: dict[str, TableAccess] = {}
    for t in model.tables:
        f = features.get(data_feature(model, t.name, features))
        if f is not None and len(getattr(f, "ids", ())) > 0:
            out[t.name] = ProfileAccess(t.name, t.num_rows, f, t.pooling_factor)
        else:
            alpha = alpha_cfg.get(t.name, DEFAULT_ZIPF_ALPHA) if isinstance(alpha_cfg, dict) else alpha_cfg
            out[t.name] = _zipf(t, float(alpha))
    return out


def _zipf(t: TableSpec, alpha: float) -> ZipfAccess:
    return _zipf_cached(t.name, t.num_rows, t.pooling_factor, alpha)


@lru_cache(maxsize=4096)
def _zipf_cached(name: str, rows: int, pooling: float, alpha: float) -> ZipfAccess:
    return ZipfAccess(name, rows, pooling, alpha)


# ---- where each table's statistics come from ------------------------------------------


def unmatched_tables(model: ModelSpec, profile: AccessProfile) -> list[str]:
    """Tables of `model` that `profile` has no feature for (they would get an assumed Zipf)."""
    features = getattr(profile, "features", {}) or {}
    return [t.name for t in model.tables if data_feature(model, t.name, features) is None]


def access_sources(model: ModelSpec, profile: AccessProfile | None, profile_name: str | None = None) -> dict[str, str]:
    """Per table, in words, where its access statistics come from (what --explain and --json show)."""
    features = getattr(profile, "features", {}) if profile is not None else {}
    alpha_cfg = model.extra.get("zipf_alpha", DEFAULT_ZIPF_ALPHA)
    where = profile_name or getattr(profile, "source", "the profile")
    out = {}
    for t in model.tables:
        alpha = alpha_cfg.get(t.name, DEFAULT_ZIPF_ALPHA) if isinstance(alpha_cfg, dict) else alpha_cfg
        name = data_feature(model, t.name, features) or t.name
        f = features.get(name)
        if profile is None:
            out[t.name] = f"assumed zipf({float(alpha):g}): no profile given"
        elif f is None:
            out[t.name] = f"assumed zipf({float(alpha):g}): {where} has no feature {name!r}"
        elif len(getattr(f, "ids", ())) == 0:
            out[t.name] = f"assumed zipf({float(alpha):g}): feature {name!r} of {where} has no IDs"
        else:
            kind = (f"extrapolated to {f.extrapolated_to:,} rows from {f.model.get('source_rows', 0):,}"
                    if getattr(f, "extrapolated_to", None) and f.model else
                    ("exact counts" if f.exact else "head counts + sketched tail"))
            out[t.name] = f"measured: feature {name!r} of {where} ({f.distinct:,} distinct IDs, {kind})"
    return out
