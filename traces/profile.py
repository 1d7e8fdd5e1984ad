"""AccessProfile: per-feature access statistics of a click log, the planner's input.

Per categorical feature: rows, missing values, distinct IDs, accesses, pooling factor,
counts sorted descending (exact up to a cap, else heavy head + sampled tail), the coverage
curve, the batch-presence histogram for a batch size (P2RES: in how many sampled batches
each ID appears), and hot-set stability (coverage on the later part of the data of a hot
set chosen on the earlier part). Saved as a JSON summary plus an .npz of arrays.

All distribution queries go through "frequency groups": (count value, number of IDs with
that count), sorted by count descending. Exact profiles have one group per distinct count
value (a few thousand at most), sketched and extrapolated ones a binned summary, so the
planner's many calls to `expected_distinct_per_batch` cost microseconds.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from foundation import fields
from foundation.documents import read_json
from foundation.fields import FieldError
from foundation.files import UnwritableTarget, atomic_write, check_output_path
from foundation.npz import BoundedNpz, NpzError
from traces.counting import IdCounter, unique_counts
from traces.coverage import presence, top_ids
from traces.errors import TraceError
from traces.readers import no_rows_reason, open_reader

PROFILE_VERSION = 1
COVERAGE_X = np.concatenate([np.logspace(-6, -2, 25)[:-1], np.linspace(0.01, 1.0, 100)])
STABILITY_FRACTIONS = (0.001, 0.01, 0.1)
DEFAULT_BATCH = 4096


def groups_from_counts(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Counts of IDs -> (distinct count values descending, number of IDs with each)."""
    if len(counts) == 0:
        return np.zeros(0), np.zeros(0)
    vals, mult = np.unique(np.asarray(counts), return_counts=True)
    return vals[::-1].astype(np.float64), mult[::-1].astype(np.float64)


@dataclass
class FeatureProfile:
    name: str
    rows: int
    missing: int
    distinct: int
    accesses: int
    ids: np.ndarray  # int64 raw IDs of the head, hottest first
    counts: np.ndarray  # int64 counts aligned with ids (descending)
    exact: bool = True  # ids/counts cover every distinct ID
    extrapolated_to: int | None = None
    group_values: np.ndarray | None = None  # count per ID in each group, descending (float)
    group_sizes: np.ndarray | None = None  # number of IDs in each group (float)
    count_error_bound: int = 0  # past the exact cap: head counts may be low by this much
    batch_size: int | None = None
    presence_batches: int = 0  # sampled batches behind presence_hist
    presence_hist: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [j]: IDs in j batches
    stability_fractions: np.ndarray = field(default_factory=lambda: np.zeros(0))
    stability_sizes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    stability_early: np.ndarray = field(default_factory=lambda: np.zeros(0))  # in-sample coverage
    stability_later: np.ndarray = field(default_factory=lambda: np.zeros(0))  # on the later part
    stability_oracle: np.ndarray = field(default_factory=lambda: np.zeros(0))  # best set of that size, later
    model: dict[str, Any] | None = None  # fitted tail model (see traces/extrapolate.py)

    def __post_init__(self) -> None:
        self.ids = np.asarray(self.ids, dtype=np.int64)
        self.counts = np.asarray(self.counts, dtype=np.int64)
        if self.group_values is None or self.group_sizes is None:
            self.group_values, self.group_sizes = groups_from_counts(self.counts)
        self._prepare()

    def _prepare(self) -> None:
        v = np.asarray(self.group_values, dtype=np.float64)
        m = np.asarray(self.group_sizes, dtype=np.float64)
        self.group_values, self.group_sizes = v, m
        self._cum_ids = np.concatenate(([0.0], np.cumsum(m)))
        self._cum_acc = np.concatenate(([0.0], np.cumsum(m * v)))
        self._mass = float(self._cum_acc[-1]) or 1.0

    # -- simple views ---------------------------------------------------------------------
    @property
    def pooling(self) -> float:
        """Mean IDs per row (accesses / rows), missing rows included."""
        return self.accesses / self.rows if self.rows else 0.0

    @property
    def missing_rate(self) -> float:
        return self.missing / self.rows if self.rows else 0.0

    def hot_ids(self, n: int) -> np.ndarray:
        """The top-n known raw IDs, hottest first."""
        return self.ids[: max(int(n), 0)].copy()

    # -- distribution queries ---------------------------------------------------------------
    def coverage_at(self, top_n):
        """Share of accesses covered by the top n IDs (n may be an array, fractional OK)."""
        n = np.clip(np.asarray(top_n, dtype=np.float64), 0.0, self._cum_ids[-1])
        g = np.clip(np.searchsorted(self._cum_ids, n, side="right") - 1, 0, max(len(self.group_values) - 1, 0))
        if len(self.group_values) == 0:
            out = np.zeros_like(n)
        else:
            out = (self._cum_acc[g] + (n - self._cum_ids[g]) * self.group_values[g]) / self._mass
            out = np.minimum(out, 1.0)
        return float(out) if out.ndim == 0 else out

    def coverage(self, top_fraction):
        """Share of accesses covered by the top x fraction of distinct IDs, in whole IDs (traces.coverage)."""
        return self.coverage_at(top_ids(top_fraction, self.distinct))

    def expected_distinct_per_batch(self, batch_size: int, skip_top: int = 0) -> float:
        """E[# distinct IDs among batch_size*pooling draws], counting IDs ranked below skip_top."""
        if len(self.group_values) == 0:
            return 0.0
        draws = float(batch_size) * self.pooling
        p = self.group_values / self._mass
        lo = np.maximum(self._cum_ids[:-1], float(skip_top))
        sizes = np.clip(self._cum_ids[1:] - lo, 0.0, None)
        seen = presence(p, draws)
        return float(np.dot(sizes, seen))

    def measured_distinct_per_batch(self) -> float | None:
        """Mean distinct IDs per sampled batch, from the presence histogram (None if no batch)."""
        if not self.presence_batches:
            return None
        j = np.arange(len(self.presence_hist))
        return float(np.dot(j, self.presence_hist) / self.presence_batches)

    def coverage_curve(self) -> tuple[np.ndarray, np.ndarray]:
        return COVERAGE_X.copy(), np.asarray(self.coverage(COVERAGE_X))

    # -- (de)serialisation ------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        d = {
            "name": self.name,
            "rows": int(self.rows),
            "missing": int(self.missing),
            "distinct": int(self.distinct),
            "accesses": int(self.accesses),
            "pooling": round(self.pooling, 6),
            "exact": bool(self.exact),
            "extrapolated_to": self.extrapolated_to,
            "head_size": len(self.ids),
            "count_error_bound": int(self.count_error_bound),
            "top1_share": float(self.coverage_at(1)) if self.distinct else 0.0,
            "coverage_top_0.1pct": float(self.coverage(0.001)),
            "coverage_top_1pct": float(self.coverage(0.01)),
            "coverage_top_10pct": float(self.coverage(0.1)),
            "top_ids_0.1pct_1pct_10pct": [top_ids(x, self.distinct) for x in (0.001, 0.01, 0.1)],
            "batch_size": self.batch_size,
            "presence_batches": int(self.presence_batches),
            "measured_distinct_per_batch": self.measured_distinct_per_batch(),
            "stability": [
                {"fraction": float(f), "size": int(s), "coverage_early": float(e), "coverage_later": float(lt),
                 "coverage_oracle": float(o) if np.isfinite(o) else None}
                for f, s, e, lt, o in zip(self.stability_fractions, self.stability_sizes, self.stability_early,
                                          self.stability_later, self.stability_oracle)
            ],
            "model": self.model,
        }  # fmt: skip
        return d

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        cx, cy = self.coverage_curve()
        return {
            f"{prefix}ids": self.ids,
            f"{prefix}counts": self.counts,
            f"{prefix}group_values": self.group_values,
            f"{prefix}group_sizes": self.group_sizes,
            f"{prefix}coverage_x": cx,
            f"{prefix}coverage_y": cy,
            f"{prefix}presence_hist": np.asarray(self.presence_hist, np.int64),
            f"{prefix}stability_fractions": np.asarray(self.stability_fractions, np.float64),
            f"{prefix}stability_sizes": np.asarray(self.stability_sizes, np.int64),
            f"{prefix}stability_early": np.asarray(self.stability_early, np.float64),
            f"{prefix}stability_later": np.asarray(self.stability_later, np.float64),
            f"{prefix}stability_oracle": np.asarray(self.stability_oracle, np.float64),
        }

    @classmethod
    def from_saved(cls, d: dict[str, Any], arrays, prefix: str) -> FeatureProfile:
        def a(k):
            return arrays[f"{prefix}{k}"]

        return cls(
            name=d["name"], rows=d["rows"], missing=d["missing"], distinct=d["distinct"],
            accesses=d["accesses"], ids=a("ids"), counts=a("counts"), exact=d["exact"],
            extrapolated_to=d.get("extrapolated_to"), group_values=a("group_values"),
            group_sizes=a("group_sizes"), count_error_bound=d.get("count_error_bound", 0),
            batch_size=d.get("batch_size"), presence_batches=d.get("presence_batches", 0),
            presence_hist=a("presence_hist"), stability_fractions=a("stability_fractions"),
            stability_sizes=a("stability_sizes"), stability_early=a("stability_early"),
            stability_later=a("stability_later"), stability_oracle=a("stability_oracle"),
            model=d.get("model"),
        )  # fmt: skip


@dataclass
class AccessProfile:
    features: dict[str, FeatureProfile]
    rows: int
    source: str
    batch_size: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def save(self, path: str | os.PathLike) -> None:
        """JSON summary at `path`, arrays in `path` with suffix .npz; both written atomically."""
        path = check_output_path(path)
        npz = check_output_path(path.with_suffix(".npz"))  # refuse both before writing either
        names = list(self.features)
        doc = {
            "version": PROFILE_VERSION,
            "source": self.source,
            "rows": int(self.rows),
            "batch_size": self.batch_size,
            "arrays": npz.name,
            "meta": self.meta,
            "features": [self.features[n].summary() for n in names],
        }
        arrays: dict[str, np.ndarray] = {}
        for i, n in enumerate(names):
            arrays.update(self.features[n].arrays(f"f{i}_"))
        check_output(path)
        check_output(npz)
        existed = npz.exists()
        _atomic_write(npz, lambda f: np.savez(f, **arrays))
        try:
            _atomic_write(path, lambda f: f.write((json.dumps(doc, indent=1, default=_json_default) + "\n").encode()))
        except BaseException:
            if not existed:
                npz.unlink(missing_ok=True)  # no arrays without the summary that names them
            raise

    @classmethod
    def load(cls, path: str | os.PathLike) -> AccessProfile:
        path = Path(path)
        if not path.exists():
            raise TraceError(f"{path}: no such profile")
        try:
            doc = read_json(path, "profile")  # bounded in size and nesting
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}: not a profile JSON ({str(exc).splitlines()[0][:120]})") from None
        except (OSError, ValueError) as exc:
            raise TraceError(str(exc)) from None
        if not isinstance(doc, dict) or "features" not in doc:
            raise TraceError(f"{path}: not an AccessProfile (no 'features')")
        if doc.get("version") != PROFILE_VERSION:
            raise TraceError(f"{path}: profile version {doc.get('version')}, expected {PROFILE_VERSION}")
        try:
            check_profile_doc(doc)
        except FieldError as exc:
            raise TraceError(f"{path}: {exc}") from None
        npz = path.parent / doc.get("arrays", path.with_suffix(".npz").name)  # a name beside it (check_profile_doc)
        if not npz.is_file():
            raise TraceError(f"{npz}: arrays of profile {path.name} not found")
        try:
            z = BoundedNpz(npz, "profile arrays")  # numbers only, no more than the file's bytes justify
        except (OSError, NpzError) as exc:
            raise TraceError(f"{exc}" if isinstance(exc, NpzError) else f"{npz}: cannot read ({exc.strerror})") from None
        try:
            with z as arrays:
                feats = {}
                for i, d in enumerate(doc["features"]):
                    checked = _CheckedArrays(arrays, f"f{i}_", f"features[{i}]")
                    f = feats[d["name"]] = FeatureProfile.from_saved(d, checked, f"f{i}_")
                    if len(f.ids) != len(f.counts) or len(f.group_values) != len(f.group_sizes):
                        raise FieldError(f"arrays features[{i}]: ids/counts or group_values/group_sizes differ in length")
                    _check_against_summary(f, f"features[{i}]")
        except FieldError as exc:
            raise TraceError(f"{npz}: {exc}") from None
        except NpzError as exc:
            raise TraceError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - a damaged member of the zip
            raise TraceError(f"{npz}: damaged profile arrays ({type(exc).__name__})") from None
        return cls(features=feats, rows=doc["rows"], source=doc["source"], batch_size=doc.get("batch_size"),
                   meta=doc.get("meta", {}))  # fmt: skip

    def table(self) -> list[dict[str, Any]]:
        """One summary record per feature (what `picasso analyze --json` prints)."""
        return [f.summary() for f in self.features.values()]


def check_profile_doc(doc: dict) -> None:
    """Types and ranges of the profile JSON's numbers (the one place they are checked)."""
    fields.integer(doc.get("rows"), "rows", 0)
    fields.text(doc.get("source"), "source")
    if doc.get("batch_size") is not None:
        fields.integer(doc["batch_size"], "batch_size", 1)
    fields.mapping(doc.get("meta", {}), "meta")
    if "arrays" in doc:  # the .npz beside the summary: a plain name, never a path out of its folder
        fields.file_name(doc["arrays"], "arrays")
    names = set()
    for i, d in enumerate(fields.sequence(doc["features"], "features")):
        w = f"features[{i}]"
        fields.mapping(d, w)
        name = fields.text(d.get("name"), f"{w}.name")
        if name in names:
            raise FieldError(f"field {w}.name: {name!r} appears twice")
        names.add(name)
        for k in ("rows", "missing", "distinct", "accesses"):
            fields.integer(d.get(k), f"{w}.{k}", 0)
        fields.boolean(d.get("exact"), f"{w}.exact")
        for k, lo in (("extrapolated_to", 0), ("batch_size", 1)):
            if d.get(k) is not None:
                fields.integer(d[k], f"{w}.{k}", lo)
        fields.integer(d.get("count_error_bound", 0), f"{w}.count_error_bound", 0)
        fields.integer(d.get("presence_batches", 0), f"{w}.presence_batches", 0)
        if d.get("model") is not None:  # the extrapolation fit: an object of finite numbers
            for k, v in fields.mapping(d["model"], f"{w}.model").items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    fields.real(v, f"{w}.model.{k}")


def _check_against_summary(f: FeatureProfile, where: str) -> None:
    """A feature's arrays agree with its summary: no more IDs than `distinct`, no more counted
    accesses than `accesses` (each exactly, for an exact count; an extrapolation's are estimates),
    counts hottest first, and one stability record per measured fraction."""
    ids, seen = len(f.ids), int(np.sum(f.counts, dtype=np.float64))
    if f.extrapolated_to is None:  # an extrapolation's counts are rounded estimates
        if ids > f.distinct or (f.exact and ids != f.distinct):
            raise FieldError(f"arrays {where}.ids: {ids} IDs, the summary says {f.distinct} distinct")
        if seen > f.accesses or (f.exact and seen != f.accesses):
            raise FieldError(f"arrays {where}.counts: {seen} accesses, the summary says {f.accesses}")
    if len(f.counts) > 1 and bool((np.diff(f.counts) > 0).any()):
        raise FieldError(f"arrays {where}.counts: not sorted hottest first")
    n = len(f.stability_fractions)
    if any(len(a) != n for a in (f.stability_sizes, f.stability_early, f.stability_later, f.stability_oracle)):
        raise FieldError(f"arrays {where}.stability_*: {n} fractions but records of other lengths")


class _CheckedArrays:
    """The profile's npz members, each checked for shape, type and range when read."""

    INTEGER = ("ids", "counts", "presence_hist", "stability_sizes")
    NONNEGATIVE = ("counts", "group_values", "group_sizes", "presence_hist", "stability_sizes",
                   "stability_fractions", "stability_early", "stability_later")

    def __init__(self, arrays, prefix: str, where: str) -> None:
        self.arrays, self.prefix, self.where = arrays, prefix, where

    def __getitem__(self, key: str) -> np.ndarray:
        short = key[len(self.prefix):]
        field = f"{self.where}.{short}"
        if key not in self.arrays.files:
            raise FieldError(f"array {field}: missing")
        a = self.arrays[key]
        if a.ndim != 1 or a.dtype.kind not in ("iu" if short in self.INTEGER else "iuf"):
            raise FieldError(f"array {field}: expected a 1-D {'integer' if short in self.INTEGER else 'numeric'} "
                             f"array, got {a.dtype} of shape {a.shape}")
        # the oracle coverage may be NaN (not measured); no other array may hold NaN
        if short != "stability_oracle" and a.dtype.kind == "f" and not np.isfinite(a).all():
            raise FieldError(f"array {field}: holds NaN or infinite values")
        if short in self.NONNEGATIVE and len(a) and a.min() < 0:
            raise FieldError(f"array {field}: holds negative values")
        return a


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def check_output(path: str | os.PathLike) -> None:
    """Refuse, in one line, an output path that cannot become a regular file."""
    p = Path(path)
    if p.is_dir():
        raise TraceError(f"{p}: is a directory, expected a file name")
    try:
        check_output_path(p)  # missing folders are created when it is written (foundation's rule)
    except UnwritableTarget as exc:
        raise TraceError(str(exc)) from None
    if p.exists() and not os.access(p.parent, os.W_OK):
        raise TraceError(f"{p}: folder {p.parent} is not writable")


def _atomic_write(path: Path, write) -> None:
    atomic_write(path, write)  # one atomic writer for every layer (foundation.files)


# ---------------------------------------------------------------------------------------
# Building a profile from a file
# ---------------------------------------------------------------------------------------
class _FeatureState:
    def __init__(self, exact_cap: int) -> None:
        self.counter = IdCounter(exact_cap=exact_cap)
        self.presence = IdCounter(exact_cap=1 << 62)
        self.rows = 0
        self.missing = 0
        self.accesses = 0
        self.early: tuple | None = None  # (top ids, their early counts, early accesses, early table)


class _Builder:
    def __init__(self, batch_size: int, exact_cap: int, presence_batches: int, split: float) -> None:
        self.B = int(batch_size)
        self.exact_cap = exact_cap
        self.max_batches = presence_batches
        self.split = split
        self.batches = 0  # sampled batches so far
        self.batch_seen = 0  # complete batches seen so far
        self.stride: int | None = None  # sample every stride-th batch
        self.state: dict[str, _FeatureState] = {}
        self.snapshotted = False

    def feature(self, name: str) -> _FeatureState:
        st = self.state.get(name)
        if st is None:
            st = self.state[name] = _FeatureState(self.exact_cap)
        return st

    def plan_sampling(self, rows_seen: int, bytes_seen: float, bytes_total: float) -> None:
        """Spread the sampled batches over the whole input (size estimated from the first chunk)."""
        if self.stride is None and rows_seen > 0 and bytes_seen > 0:
            est_batches = rows_seen * bytes_total / bytes_seen / max(self.B, 1)
            self.stride = max(1, int(np.ceil(est_batches / max(self.max_batches, 1))))

    def add(self, sparse: dict, n: int, row_lo: int, row_hi: int, names: list[str]) -> None:
        """Count rows [row_lo, row_hi) of a chunk."""
        nrows = row_hi - row_lo
        sel = np.zeros(0, np.int64)
        if self.B > 0:
            nb = nrows // self.B
            k = np.arange(nb)
            sel = k[(self.batch_seen + k) % (self.stride or 1) == 0][: max(self.max_batches - self.batches, 0)]
            self.batch_seen += nb
        for name in names:
            st = self.feature(name)
            ids, off = sparse[name]
            a, b = int(off[row_lo]), int(off[row_hi])
            part = ids[a:b]
            lengths = np.diff(off[row_lo : row_hi + 1])
            st.rows += nrows
            st.missing += int(np.count_nonzero(lengths == 0))
            st.accesses += len(part)
            if len(part) == 0:
                continue
            st.counter.add_counts(*unique_counts(part))
            if len(sel):
                st.presence.add(_batch_distinct_ids(part, off[row_lo : row_hi + 1] - a, self.B, sel))
        self.batches += len(sel)

    def snapshot(self) -> None:
        """Remember the hot sets of the earlier part for the stability measure."""
        self.snapshotted = True
        for st in self.state.values():
            ids, counts = st.counter.sorted_desc()
            d = len(ids)
            top = max(1, top_ids(max(STABILITY_FRACTIONS), d)) if d else 0
            table = (st.counter.keys.copy(), st.counter.counts.copy()) if st.counter.exact else None
            st.early = (ids[:top].copy(), counts[:top].copy(), st.accesses, d, table)

    def finish(self, names: list[str], rows: int) -> dict[str, FeatureProfile]:
        out = {}
        for name in names:
            st = self.feature(name)
            # A feature first seen mid-file (libfm fields) was missing from the rows before.
            st.missing += rows - st.rows
            st.rows = rows
            out[name] = self._profile(name, st)
        return out

    def _profile(self, name: str, st: _FeatureState) -> FeatureProfile:
        c = st.counter
        ids, counts = c.sorted_desc()
        distinct = c.distinct()
        if c.exact:
            gv, gs = groups_from_counts(counts)
        else:
            gv, gs = _sketch_groups(c, counts, distinct)
        # Presence histogram: hist[j] = IDs that appear in exactly j sampled batches.
        _, pres = st.presence.sorted_desc()
        hist = np.bincount(pres, minlength=self.batches + 1) if len(pres) else np.zeros(self.batches + 1, np.int64)
        stab = _stability(st, c)
        return FeatureProfile(
            name=name, rows=st.rows, missing=st.missing, distinct=distinct, accesses=st.accesses,
            ids=ids, counts=counts, exact=c.exact, group_values=gv, group_sizes=gs,
            count_error_bound=c.error_bound, batch_size=self.B, presence_batches=self.batches,
            presence_hist=hist.astype(np.int64), **stab,
        )  # fmt: skip


def _batch_distinct_ids(part: np.ndarray, off: np.ndarray, B: int, sel: np.ndarray) -> np.ndarray:
    """Each ID once per selected batch it appears in (batches of B rows from the segment start).

    `off` are the segment's bag offsets rebased to `part` (off[0] == 0).
    """
    lo, hi = off[sel * B], off[(sel + 1) * B]
    ids = np.concatenate([part[a:b] for a, b in zip(lo.tolist(), hi.tolist())])
    j = np.repeat(np.arange(len(sel), dtype=np.int64), hi - lo)
    if len(ids) == 0:
        return ids
    if ids.min() >= 0 and ids.max() < (1 << 40) and len(sel) < (1 << 22):
        # (batch, ID) packed in one int64: one sort finds the distinct pairs.
        key = np.sort((j << 40) | ids)
        key = key[np.concatenate(([True], key[1:] != key[:-1]))]
        return key & ((1 << 40) - 1)
    order = np.lexsort((ids, j))
    ids, j = ids[order], j[order]
    first = np.concatenate(([True], (ids[1:] != ids[:-1]) | (j[1:] != j[:-1])))
    return ids[first]


def _sketch_groups(c: IdCounter, head_counts: np.ndarray, distinct: int) -> tuple[np.ndarray, np.ndarray]:
    """Head table as is; the IDs outside it from the KMV sample, scaled to the estimated count."""
    sample_ids, sample_counts = c.sample()
    in_head = c.lookup(sample_ids) > 0
    tail = sample_counts[~in_head]
    rest = max(distinct - len(head_counts), 0)
    hv, hs = groups_from_counts(head_counts)
    if len(tail) == 0 or rest == 0:
        return hv, hs
    tv, ts = groups_from_counts(tail)
    ts = ts * (rest / len(tail))
    v = np.concatenate([hv, tv])
    s = np.concatenate([hs, ts])
    order = np.argsort(-v, kind="stable")
    return v[order], s[order]


def _stability(st: _FeatureState, c: IdCounter) -> dict[str, np.ndarray]:
    empty = {
        "stability_fractions": np.zeros(0), "stability_sizes": np.zeros(0, np.int64),
        "stability_early": np.zeros(0), "stability_later": np.zeros(0), "stability_oracle": np.zeros(0),
    }  # fmt: skip
    if st.early is None:
        return empty
    early_ids, top_early, early_acc, early_distinct, table = st.early
    later_acc = st.accesses - early_acc
    if early_acc == 0 or later_acc <= 0 or len(early_ids) == 0:
        return empty
    fr = np.asarray(STABILITY_FRACTIONS)
    sizes = np.maximum(1, top_ids(fr, early_distinct)).astype(np.int64)
    later_counts = c.lookup(early_ids) - top_early
    cum_later = np.concatenate(([0], np.cumsum(later_counts)))
    cum_early = np.concatenate(([0], np.cumsum(top_early)))
    sizes_c = np.minimum(sizes, len(early_ids))
    oracle = np.full(len(sizes), np.nan)
    if table is not None and c.exact:
        # Best hot set for the later part: the top IDs by (total - early) count.
        early_k, early_c = table  # non-empty: the early part had accesses
        pos = np.minimum(np.searchsorted(early_k, c.keys), len(early_k) - 1)
        early_of_key = np.where(early_k[pos] == c.keys, early_c[pos], 0)
        later_all = np.sort(c.counts - early_of_key)[::-1]
        cum_o = np.concatenate(([0], np.cumsum(later_all)))
        oracle = cum_o[np.minimum(sizes, len(later_all))] / later_acc
    return {
        "stability_fractions": fr,
        "stability_sizes": sizes,
        "stability_early": cum_early[sizes_c] / early_acc,
        "stability_later": cum_later[sizes_c] / later_acc,
        "stability_oracle": oracle,
    }


def profile_file(
    path: str | os.PathLike,
    fmt: str,
    *,
    batch_size: int = DEFAULT_BATCH,
    strict: bool = False,
    progress=None,
    exact_cap: int = 2_000_000,
    presence_batches: int = 64,
    stability_split: float = 0.5,
    chunk_bytes: int = 8 << 20,
    **format_options,
) -> AccessProfile:
    """Stream `path` once and build its AccessProfile.

    batch_size: batch for the batch-presence histogram, over `presence_batches` batches
    spread evenly over the input (every k-th batch of consecutive rows); exact_cap: distinct IDs per feature
    counted exactly before switching to head + sketch; stability_split: fraction of the
    input (by bytes) that is "earlier" for the hot-set stability measure.
    """
    t0 = time.perf_counter()
    reader = open_reader(path, fmt, strict=strict, chunk_bytes=chunk_bytes, progress=progress, **format_options)
    b = _Builder(batch_size, exact_cap, presence_batches, stability_split)
    split_at = stability_split * reader.bytes_total
    before = 0.0
    for chunk in reader:
        n = chunk.rows
        names = list(reader.feature_names)
        after = reader.bytes_done
        b.plan_sampling(n, after, reader.bytes_total)
        cut = n
        if not b.snapshotted and after >= split_at:
            # Split this chunk's rows in proportion to where the byte split falls inside it.
            frac = (split_at - before) / (after - before) if after > before else 1.0
            cut = int(round(n * min(max(frac, 0.0), 1.0)))
        if cut > 0:
            b.add(chunk.sparse, n, 0, cut, names)
        if cut < n:
            b.snapshot()
            b.add(chunk.sparse, n, cut, n, names)
        before = after
    names = list(reader.feature_names)
    stats = reader.stats
    if stats.rows_ok == 0:
        raise TraceError(no_rows_reason(reader))
    feats = b.finish(names, stats.rows_ok)
    meta = {
        "format": reader.fmt or fmt,
        "rows_ok": stats.rows_ok,
        "rows_bad": stats.rows_bad,
        "first_bad_lines": stats.first_bad_lines,
        "first_bad_reasons": stats.first_bad_reasons,
        "bytes": reader.bytes_total,
        "dense_names": list(reader.dense_names),
        "exact_cap": exact_cap,
        "stability_split": stability_split,
        "seconds": round(time.perf_counter() - t0, 3),
        "warnings": [*reader.warnings, *_pooling_warnings(reader, feats)],
    }
    return AccessProfile(features=feats, rows=stats.rows_ok, source=os.fspath(path), batch_size=batch_size, meta=meta)


POOLED_RATIO = 10.0  # a field with this many times the distinct IDs of a typical one looks pooled


def _pooling_warnings(reader, feats: dict[str, FeatureProfile]) -> list[str]:
    """libsvm tokens without a field map land in one feature per libfm field (or one for all):
    a field far larger than the others usually holds several real fields."""
    if reader.fmt != "libsvm" or getattr(reader, "ranges", None) is not None:
        return []
    hint = "give --field-map (a file of 'name lo hi' index ranges) to split it into its fields"
    if len(feats) == 1:
        (f,) = feats.values()
        return [f"every token of {reader.path} went into one feature {f.name!r} ({f.distinct:,} distinct IDs, "
                f"{f.pooling:.1f} per row); {hint}"]
    sizes = {n: f.distinct for n, f in feats.items()}
    typical = float(np.median(list(sizes.values())))
    return [f"feature {n!r} holds {d:,} distinct IDs, {d / max(typical, 1):.0f}x a typical field ({typical:,.0f}); "
            f"if it pools several fields, {hint}"
            for n, d in sizes.items() if d > POOLED_RATIO * max(typical, 1) and d >= 100]
