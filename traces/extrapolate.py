"""Sample-to-full extrapolation of a feature's ID distribution.

Model: ID ranks r = 1..V have probabilities proportional to (r + q)^-s (Zipf-Mandelbrot on
a finite vocabulary V). It is fitted to the sample's fingerprint (how many IDs were seen
once, twice, ... in log-spaced classes) by maximum likelihood under Poisson sampling:
E[#IDs with count in class] = sum_r P(Poisson(n p_r) in class). The unseen mass is what
the fit implies for ranks whose expected count is below one (Good-Turing, F1/n, is
reported next to it as a check).

Prediction at N accesses: IDs with at least HEAD_MIN sightings keep their empirical share
c/n (accurate, and the planner needs their identities); the rest of the mass follows the
fitted model beyond those ranks. Then E[distinct] = sum_r 1 - exp(-N p_r), and the counts
of the seen IDs (count per seen ID lambda / (1 - exp(-lambda)), lambda = N p_r) give the
coverage curve. A feature whose sample has no singleton is treated as complete: its
distinct count stays and its counts scale by N/n.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize
from scipy.special import pdtr

from traces.errors import TraceError
from traces.profile import AccessProfile, FeatureProfile

HEAD_MIN = 10  # sightings from which an ID's empirical share is trusted
EXACT_RANKS = 64
RANK_BINS = 160
MAX_VOCAB = 1e11


def _rank_bins(V: float, start: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) inclusive rank ranges covering start..V: single ranks first, then geometric."""
    V = int(max(V, start))
    k = min(V, start + EXACT_RANKS - 1)
    lo = list(range(start, k + 1))
    hi = list(lo)
    if V > k:
        edges = np.unique(np.round(np.geomspace(k + 1, V + 1, RANK_BINS)).astype(np.int64))
        edges = edges[edges > k]
        if edges[0] != k + 1:
            edges = np.concatenate(([k + 1], edges))
        if edges[-1] != V + 1:
            edges = np.concatenate((edges, [V + 1]))
        lo.extend(edges[:-1].tolist())
        hi.extend((edges[1:] - 1).tolist())
    return np.asarray(lo, np.float64), np.asarray(hi, np.float64)


def _bin_weights(lo: np.ndarray, hi: np.ndarray, s: float, q: float) -> np.ndarray:
    """Mean of (r + q)^-s over each rank range (integral of the continuous law for wide bins)."""
    a, b = lo - 0.5 + q, hi + 0.5 + q
    if abs(s - 1.0) < 1e-9:
        integral = np.log(b / a)
    else:
        integral = (b ** (1 - s) - a ** (1 - s)) / (1 - s)
    w = integral / (hi - lo + 1)
    single = lo == hi
    w[single] = (lo[single] + q) ** -s
    return w


def fingerprint_classes(max_count: int) -> np.ndarray:
    """Class lower edges: 1..8 then x1.5 steps; the last class is open-ended."""
    edges = list(range(1, 9))
    while edges[-1] * 1.5 < max_count:
        edges.append(int(np.ceil(edges[-1] * 1.5)))
    return np.asarray(edges, np.int64)


def expected_fingerprint(lam: np.ndarray, sizes: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """E[#IDs with count in each class] when ID i's count is Poisson(lam[i]) (sizes[i] alike)."""
    out = np.zeros(len(edges))
    big = lam > 4.0 * edges[-1] + 50.0  # all mass in the open last class
    out[-1] += sizes[big].sum()
    tiny = lam < 1e-7  # P(count = 1) = lam, higher counts negligible
    out[0] += np.dot(sizes[tiny], lam[tiny])
    mid = ~(big | tiny)
    if mid.any():
        cdf = pdtr(edges[None, :] - 1, lam[mid][:, None])  # P(X <= a-1) per class edge a
        probs = np.diff(np.concatenate([cdf, np.ones((len(cdf), 1))], axis=1), axis=1)
        out += sizes[mid] @ np.clip(probs, 0.0, 1.0)
    return out


class ZipfMandelbrotFit:
    """Fit of (s, q, V) to a sample fingerprint; see the module docstring."""

    def __init__(self, counts: np.ndarray, sizes: np.ndarray | None = None, max_vocab: float | None = None) -> None:
        """`counts` per ID, or with `sizes`: count values and how many IDs have each
        (the frequency groups of a sketched profile; sizes may be estimates); `max_vocab`:
        a known cardinality the vocabulary may not exceed."""
        values = np.rint(np.asarray(counts, np.float64)).astype(np.int64)
        weights = np.ones(len(values)) if sizes is None else np.asarray(sizes, np.float64)
        keep = (values > 0) & (weights > 0)
        values, weights = values[keep], weights[keep]
        self.n = int(round(float(np.dot(values, weights))))
        self.D = int(round(float(weights.sum())))
        self.f1 = float(weights[values == 1].sum())
        self.edges = fingerprint_classes(int(values.max()) if len(values) else 1)
        idx = np.searchsorted(self.edges, values, side="right") - 1
        self.obs = np.bincount(idx, weights=weights, minlength=len(self.edges)).astype(np.float64)
        self.s = self.q = self.V = None
        self.deviance = None
        self.max_logv = float(np.log(min(MAX_VOCAB, max_vocab or MAX_VOCAB) / max(self.D, 1)))

    def _probs(self, s: float, q: float, V: float) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = _rank_bins(V)
        w = _bin_weights(lo, hi, s, q)
        m = hi - lo + 1
        return w / np.dot(m, w), m

    def _deviance(self, theta: np.ndarray) -> float:
        s, logq, logv = theta
        if not (0.05 <= s <= 5.0 and -3 <= logq <= 14 and 0.0 <= logv <= self.max_logv):
            return 1e18
        V = self.D * np.exp(logv)
        p, m = self._probs(s, float(np.exp(logq)), V)
        e = np.maximum(expected_fingerprint(self.n * p, m, self.edges), 1e-12)
        o = self.obs
        # Poisson deviance of the class counts (0 log 0 = 0).
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(o > 0, o * np.log(o / e), 0.0)
        return float(2.0 * np.sum(t - (o - e)))

    def fit(self) -> ZipfMandelbrotFit:
        # Coarse grid for a starting point, then Nelder-Mead from the best cell.
        lvs = sorted({min(lv, self.max_logv) for lv in (0.05, 1.0, 3.0, 7.0)})
        grid = [np.array([s0, 0.0, lv]) for s0 in (0.6, 0.8, 1.0, 1.2, 1.6, 2.5) for lv in lvs]
        x0 = min(grid, key=self._deviance)
        best = minimize(self._deviance, x0, method="Nelder-Mead",
                        options={"xatol": 1e-3, "fatol": 1e-4, "maxiter": 300, "initial_simplex": _simplex(x0)})  # fmt: skip
        s, logq, logv = best.x
        self.s, self.q, self.V = float(s), float(np.exp(logq)), float(self.D * np.exp(logv))
        self.deviance = float(best.fun)
        return self

    def params(self) -> dict:
        return {
            "kind": "zipf-mandelbrot",
            "s": self.s, "q": self.q, "vocabulary": self.V, "deviance": self.deviance,
            "classes": len(self.edges), "sample_accesses": self.n, "sample_distinct": self.D,
            "good_turing_unseen_mass": float(self.f1 / self.n) if self.n else 0.0,
        }  # fmt: skip


def _simplex(x0: np.ndarray) -> np.ndarray:
    steps = np.diag([0.15, 1.0, 1.0])
    return np.vstack([x0, x0 + steps])


def predict(fp: FeatureProfile, target_accesses: float, fit: ZipfMandelbrotFit | None):
    """(distinct, group_values, group_sizes, head_counts) expected at `target_accesses`."""
    counts = fp.counts.astype(np.float64)
    n = float(fp.accesses)
    scale = target_accesses / n
    if fit is None:
        gv, gs = fp.group_values * scale, fp.group_sizes.copy()
        return float(fp.distinct), gv, gs, counts * scale
    head = counts[counts >= HEAD_MIN]
    k = len(head)
    head_mass = head.sum() / n
    lo, hi = _rank_bins(fit.V, start=k + 1) if fit.V > k else (np.zeros(0), np.zeros(0))
    if len(lo):
        w = _bin_weights(lo, hi, fit.s, fit.q)
        m = hi - lo + 1
        p = w * ((1.0 - head_mass) / np.dot(m, w))
    else:
        m = p = np.zeros(0)
    lam = target_accesses * p
    seen = -np.expm1(-lam)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_id = np.where(seen > 0, lam / seen, 0.0)
    head_vals = head * scale
    gv = np.concatenate([head_vals, per_id])
    gs = np.concatenate([np.ones(k), m * seen])
    keep = gs > 0
    gv, gs = gv[keep], gs[keep]
    order = np.argsort(-gv, kind="stable")
    distinct = float(k + np.dot(m, seen))
    return distinct, gv[order], gs[order], head_vals


def needs_model(fp: FeatureProfile) -> bool:
    """False when the sample looks complete (no singleton) or is too small to fit."""
    if fp.distinct < 3 or fp.accesses < 20:
        return False
    return bool(np.any(fp.group_values == 1))


def scale_feature(fp: FeatureProfile, rows: int, cardinality: int | None = None) -> FeatureProfile:
    """The feature's expected profile at `rows` rows (same pooling factor and missing rate).

    `cardinality`: the number of values the feature is known to have (a model's num_rows,
    `--cardinality`); the fitted vocabulary never exceeds it. The model record tells
    whether a fit without the cap went past it (`capped_from`: the sample's head is then
    unrepresentative) and the range the distinct count may lie in (`distinct_range`: the
    IDs seen up to the fitted vocabulary, as many as there are accesses at most).
    """
    rows = int(rows)
    if rows <= 0:
        raise ValueError(f"scale_to: rows must be positive, got {rows}")
    if cardinality is not None and cardinality < 1:
        raise ValueError(f"cardinality of {fp.name} must be at least 1, got {cardinality}")
    if fp.rows == 0 or fp.accesses == 0:
        return FeatureProfile(name=fp.name, rows=rows, missing=rows, distinct=0, accesses=0,
                              ids=fp.ids[:0], counts=fp.counts[:0], exact=False, extrapolated_to=rows)  # fmt: skip
    target = fp.accesses * rows / fp.rows
    fit, capped_from = None, None
    if cardinality is not None and fp.distinct >= cardinality:
        reason = f"every one of its {cardinality:,} known values was seen"
    elif needs_model(fp):
        fit = ZipfMandelbrotFit(fp.group_values, fp.group_sizes).fit()
        if cardinality is not None and fit.V > cardinality:
            capped_from = fit.V
            fit = ZipfMandelbrotFit(fp.group_values, fp.group_sizes, max_vocab=cardinality).fit()
    else:
        reason = "no singleton in the sample: every ID seen"
    distinct, gv, gs, head_vals = predict(fp, target, fit)
    model = fit.params() if fit else {"kind": "complete", "reason": reason}
    high = min(fit.V, target) if fit else fp.distinct
    model = dict(model, source_rows=fp.rows, head_min=HEAD_MIN, scale_factor=rows / fp.rows,
                 cardinality=cardinality, capped_from=capped_from, distinct_range=[fp.distinct, high])
    head_n = len(head_vals) if fit else len(fp.ids)
    return FeatureProfile(
        name=fp.name, rows=rows, missing=int(round(fp.missing * rows / fp.rows)),
        distinct=int(round(distinct)), accesses=int(round(target)),
        ids=fp.ids[:head_n], counts=np.round(head_vals[:head_n]).astype(np.int64),
        exact=False, extrapolated_to=rows, group_values=gv, group_sizes=gs,
        batch_size=fp.batch_size, model=model,
    )  # fmt: skip


LARGE_SCALE = 100.0  # scale factors from which the tail beyond the sample is mostly model


def extrapolation_warnings(feats: dict[str, FeatureProfile], sample_rows: int, rows: int) -> list[str]:
    """What makes an extrapolation doubtful: a large scale factor, a fitted tail past a known cardinality."""
    out = []
    capped = [f for f in feats.values() if (f.model or {}).get("capped_from")]
    for f in capped[:5]:
        m = f.model
        out.append(f"{f.name}: the fitted vocabulary ({m['capped_from']:,.0f}) exceeds its known cardinality "
                   f"({m['cardinality']:,}): the sample's head is not representative; capped at the cardinality")
    factor = rows / max(sample_rows, 1)
    if factor >= LARGE_SCALE:
        spans = [(f.model["distinct_range"][1] / max(f.model["distinct_range"][0], 1), f) for f in feats.values()
                 if f.model and f.model.get("distinct_range")]
        wide = ", ".join(f"{f.name} {f.distinct:,} (seen {f.model['distinct_range'][0]:,}, at most "
                         f"{f.model['distinct_range'][1]:,.0f})" for _, f in sorted(spans, key=lambda x: -x[0])[:3])
        out.append(f"extrapolating {factor:,.0f}x beyond {sample_rows:,} sampled rows: distinct counts and tail "
                   f"coverage come from a fitted model, and a sample from a short time window misses IDs that "
                   f"appear later; most uncertain: {wide}")
    return out


def write_row_sample(src, dst, fraction: float, seed: int = 0) -> int:
    """Copy a random `fraction` of the lines of text file `src` to `dst`; returns lines kept."""
    rng = np.random.default_rng(seed)
    kept = 0
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while True:
            lines = fin.readlines(1 << 24)
            if not lines:
                break
            keep = np.flatnonzero(rng.random(len(lines)) < fraction)
            fout.writelines(lines[i] for i in keep)
            kept += len(keep)
    return kept


def validation_errors(full, sample, fractions=(0.01, 0.1)) -> list[dict]:
    """Per feature: predicted (from `sample` scaled to full.rows) vs actual distinct and coverage."""
    pred = scale_profile(sample, full.rows)
    out = []
    for name, f in full.features.items():
        g = pred.features[name]
        rec = {
            "name": name,
            "sample_distinct": sample.features[name].distinct,
            "true_distinct": f.distinct,
            "pred_distinct": g.distinct,
            "distinct_rel_err": g.distinct / f.distinct - 1 if f.distinct else 0.0,
        }
        for x in fractions:
            key = f"top{x * 100:g}pct"
            rec[f"true_cov_{key}"] = float(f.coverage(x))
            rec[f"pred_cov_{key}"] = float(g.coverage(x))
            rec[f"cov_err_{key}"] = float(g.coverage(x) - f.coverage(x))
        rec["model"] = (g.model or {}).get("kind")
        out.append(rec)
    return out


def scale_profile(profile: AccessProfile, rows: int, cardinality: dict[str, int] | None = None) -> AccessProfile:
    """`profile` (an AccessProfile) extrapolated to `rows` rows.

    `cardinality`: known numbers of values per feature (caps); meta["warnings"] gains
    what makes the result doubtful (a large scale factor, a fit that passed a cap).
    """
    caps = cardinality or {}
    unknown = sorted(set(caps) - set(profile.features))
    if unknown:
        raise TraceError(f"--cardinality: no feature {unknown[0]!r} in the profile "
                         f"(features: {', '.join(list(profile.features)[:8])}...)")
    feats = {n: scale_feature(f, rows, caps.get(n)) for n, f in profile.features.items()}
    meta = dict(profile.meta, extrapolated_from_rows=profile.rows)
    meta["warnings"] = [*profile.meta.get("warnings", []), *extrapolation_warnings(feats, profile.rows, rows)]
    return AccessProfile(features=feats, rows=int(rows), source=profile.source, batch_size=profile.batch_size,
                         meta=meta)  # fmt: skip
