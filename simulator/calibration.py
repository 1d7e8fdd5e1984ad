"""Fit the cost model's coefficients to measurements by least squares (scipy).

Measurements are plain dicts `{"kind": ..., <size features>, "us": measured}` (from
`picasso calibrate`'s microbenchmarks, or per-op timings of executed plans). Each kind
of work is fitted to the cost model's form for it:

- memory-bound ops (gather, pooling, copies):  t = latency + bytes / bandwidth
- compute-bound ops (GEMM):                    t = latency + flops / flop_rate
- all_to_all over n ranks (direct):             t = alpha + (n-1)/n * bytes / bw
- all_reduce over n ranks (ring):               t = 2 (n-1) * alpha + 2 (n-1)/n * bytes / bw
(the closed forms of simulator.cost on one node; `bytes` per rank, the whole send buffer)

Residuals are relative ((predicted - measured) / measured), so small and large sizes
weigh the same and the fit reports its error as a percentage. A soft-L1 loss keeps one
noisy sample (a shared machine) from pulling the fit.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from simulator.calibration_spec import Calibration, ClassFit, class_key
from simulator.device_perf import DeviceRates, perf_from_rates
from simulator.hardware import HardwareSpec


class CalibrationError(ValueError):
    """Too few or malformed measurements to fit."""


@dataclass
class AffineFit:
    """t_us = latency_us + work * scale / rate, fitted on `n` samples of one kind."""

    kind: str
    latency_us: float
    rate: float  # work units per second: bytes/s or FLOP/s (the bus bandwidth for collectives)
    unit: str  # "B/s" or "FLOP/s"
    n: int
    rel_rms: float  # root mean square of the relative residuals
    rel_max: float  # largest absolute relative residual
    residuals: list[float]  # per sample, in the order given
    per_item_us: float = 0.0  # cost per item (a gathered row: one cache miss), when fitted

    def predict_us(self, work: np.ndarray | float, scale: np.ndarray | float = 1.0,
                   latency_scale: np.ndarray | float = 1.0, items: np.ndarray | float = 0.0) -> np.ndarray:
        return (latency_scale * self.latency_us + np.asarray(items, dtype=float) * self.per_item_us
                + np.asarray(work, dtype=float) * scale / self.rate * 1e6)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["residuals"] = [round(r, 5) for r in self.residuals]
        d["problem"] = fit_problem(self.rate, self.rel_rms, self.rel_max)
        return d


UNCONSTRAINED_RATE = 1e15  # B/s or FLOP/s: no link or core of a machine comes near; a fit there saw no slope
POOR_FIT_RMS = 0.25  # relative residuals above this (rms): the line does not describe the samples


def fit_problem(rate: float, rel_rms: float, rel_max: float) -> str | None:
    """What is wrong with a fit, in words (None: nothing): a rate the samples do not constrain (the
    times did not grow with the work, so the fixed cost took all of it), or residuals too large
    for the line to describe the samples."""
    if not rate > 0 or rate >= UNCONSTRAINED_RATE:
        return ("degenerate: the times did not grow with the size measured, so the rate is not measured "
                "(the fixed cost holds all of it)")
    if rel_rms > POOR_FIT_RMS:
        return (f"poor fit: residuals {rel_rms:.0%} rms, up to {rel_max:.0%}; predictions of this kind are "
                "uncertain (a busy machine or too few sizes)")
    return None


def fit_affine(
    kind: str,
    work: Sequence[float],
    t_us: Sequence[float],
    unit: str,
    scale: Sequence[float] | float = 1.0,
    latency_scale: Sequence[float] | float = 1.0,
    items: Sequence[float] | None = None,
) -> AffineFit:
    """Least-squares fit of `t = latency_scale * L [+ items * c] + scale * work / rate` (all >= 0)."""
    w = np.asarray(work, dtype=float)
    t = np.asarray(t_us, dtype=float)
    if w.ndim != 1 or w.shape != t.shape:
        raise CalibrationError(f"{kind}: work and times must be equal-length 1-D sequences")
    s = np.broadcast_to(np.asarray(scale, dtype=float), t.shape)
    ls = np.broadcast_to(np.asarray(latency_scale, dtype=float), t.shape)
    cols = [ls, w * s] + ([np.asarray(items, dtype=float)] if items is not None else [])
    coef, r = fit_linear(kind, np.stack(cols, axis=1), t)
    return AffineFit(
        kind=kind, latency_us=float(coef[0]), rate=1e6 / max(float(coef[1]), 1e-15), unit=unit, n=len(t),
        rel_rms=float(np.sqrt(np.mean(r**2))), rel_max=float(np.max(np.abs(r))),
        residuals=[float(v) for v in r], per_item_us=float(coef[2]) if items is not None else 0.0,
    )


def fit_linear(kind: str, X: np.ndarray, t_us: Sequence[float],
               weights: Sequence[float] | None = None, loss: str = "soft_l1") -> tuple[np.ndarray, np.ndarray]:
    """Non-negative coefficients p of `t = X @ p` minimising relative residuals (each
    weighted by `weights` when given; `loss` as scipy's least_squares, soft-L1 by default:
    one noisy microbenchmark sample does not pull the fit).

    Returns (p, relative residuals). Linear in p, so an ordinary least-squares solve on
    the relative form gives the start of the robust (soft-L1) fit.
    """
    X = np.asarray(X, dtype=float)
    t = np.asarray(t_us, dtype=float)
    if X.ndim != 2 or X.shape[0] != t.shape[0]:
        raise CalibrationError(f"{kind}: features and times disagree in length")
    if len(t) < X.shape[1]:
        raise CalibrationError(f"{kind}: need at least {X.shape[1]} measurements to fit, got {len(t)}")
    if np.any(~np.isfinite(t)) or np.any(t <= 0) or np.any(X < 0):
        raise CalibrationError(f"{kind}: times must be positive and work non-negative")
    A = X / t[:, None]
    sw = np.ones_like(t) if weights is None else np.sqrt(np.asarray(weights, dtype=float))
    # Columns scaled to unit norm so that bytes (1e7) and counts (1) condition alike.
    norm = np.maximum(np.linalg.norm(A, axis=0), 1e-30)
    start, *_ = np.linalg.lstsq(A / norm * sw[:, None], sw, rcond=None)
    start = np.maximum(start, 1e-9)

    def resid(q: np.ndarray) -> np.ndarray:
        return (A / norm) @ q - 1.0

    sol = least_squares(lambda q: resid(q) * sw, start, bounds=(0.0, np.inf), loss=loss, f_scale=0.1)
    return sol.x / norm, resid(sol.x)


# How each microbenchmark kind maps to a fitted form.
MEMORY_KINDS = ("gather", "pool", "h2d", "d2h", "d2d")
COMPUTE_KINDS = ("gemm",)
COLLECTIVE_KINDS = ("all_to_all", "all_reduce")


def collective_factors(kind: str, world: int) -> tuple[float, float]:
    """(bandwidth factor, latency steps) of a collective's algorithm over `world` ranks."""
    n = max(int(world), 1)
    if kind == "all_to_all":
        return (n - 1) / n, 1.0
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n, 2.0 * (n - 1)
    raise CalibrationError(f"unknown collective kind {kind!r}")


def fit_samples(samples: Iterable[dict[str, Any]]) -> dict[str, AffineFit]:
    """One fit per measurement kind present (at least two samples of it)."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for i, s in enumerate(samples):
        try:
            by_kind.setdefault(str(s["kind"]), []).append(s)
            float(s["us"])
        except (KeyError, TypeError, ValueError):
            raise CalibrationError(f"measurement {i}: needs 'kind' and a numeric 'us'") from None
    fits: dict[str, AffineFit] = {}
    for kind, rows in sorted(by_kind.items()):
        t = [float(r["us"]) for r in rows]
        if kind in MEMORY_KINDS:
            if len(rows) >= 2:
                fits[kind] = fit_affine(kind, [float(r["bytes"]) for r in rows], t, "B/s")
            if kind in ("gather", "pool") and len(rows) >= 4:
                # Random rows cost a cache miss each on top of the bytes: the two-term form.
                fits[f"{kind}_rows"] = fit_affine(
                    f"{kind}_rows", [float(r["bytes"]) for r in rows], t, "B/s",
                    items=[float(r["n"]) for r in rows],
                )
        elif kind in COMPUTE_KINDS:
            for phase in sorted({r.get("phase", "fwd") for r in rows}):
                sub = [r for r in rows if r.get("phase", "fwd") == phase]
                if len(sub) >= 2:
                    fits[f"{kind}_{phase}"] = fit_affine(
                        f"{kind}_{phase}", [float(r["flops"]) for r in sub], [float(r["us"]) for r in sub],
                        "FLOP/s",
                    )
        elif kind == "launch":
            fits[kind] = AffineFit(kind, float(np.median(t)), float("inf"), "-", len(t), 0.0, 0.0, [0.0] * len(t))
    coll = {k: by_kind[k] for k in COLLECTIVE_KINDS if k in by_kind}
    if coll:
        fits.update(fit_collectives(coll, launch_of(fits)))
    if not fits:
        raise CalibrationError("no measurement kind had enough samples to fit")
    return fits


def launch_of(fits: dict[str, AffineFit]) -> float:
    """The per-op fixed cost: measured launch overhead, else the median fixed part of local ops."""
    if "launch" in fits:
        return fits["launch"].latency_us
    fixed = [f.latency_us for k, f in fits.items() if k.startswith("gemm") or k in ("gather", "pool")]
    return float(np.median(fixed)) if fixed else 0.0


def fit_collectives(rows_by_kind: dict[str, list[dict[str, Any]]], launch_us: float = 0.0) -> dict[str, AffineFit]:
    """Joint fit of the collectives as simulator.cost prices them on one node: every op pays
    `launch_us`, a step latency `alpha` shared by all collective types (the spec has one,
    intra_latency_us) times the algorithm's steps, and a bus bandwidth per type."""
    kinds = sorted(rows_by_kind)
    rows = [(k, r) for k in kinds for r in rows_by_kind[k]]
    if len(rows) < len(kinds) + 1:
        raise CalibrationError(f"collectives: need at least {len(kinds) + 1} measurements, got {len(rows)}")
    t = np.array([float(r["us"]) for _, r in rows])
    X = np.zeros((len(rows), 1 + len(kinds)))
    for i, (k, r) in enumerate(rows):
        bw_factor, steps = collective_factors(k, int(r["world"]))
        X[i, 0] = steps
        X[i, 1 + kinds.index(k)] = bw_factor * float(r["bytes"])
    # The launch part is known from the local ops; never let it eat a whole sample.
    target = np.maximum(t - launch_us, 0.2 * t)
    coef, _ = fit_linear("collectives", X, target)
    pred = X @ coef + (t - target)
    rel = (pred - t) / t
    out = {}
    for j, k in enumerate(kinds):
        idx = [i for i, (kk, _) in enumerate(rows) if kk == k]
        r = rel[idx]
        out[k] = AffineFit(
            kind=k, latency_us=float(coef[0]), rate=1e6 / max(float(coef[1 + j]), 1e-15), unit="B/s", n=len(idx),
            rel_rms=float(np.sqrt(np.mean(r**2))), rel_max=float(np.max(np.abs(r))),
            residuals=[float(v) for v in r],
        )
    return out


def summarize(fits: dict[str, AffineFit]) -> dict[str, Any]:
    """Residual summary over all fits: the worst relative RMS and the overall one."""
    allr = np.concatenate([np.asarray(f.residuals) for f in fits.values() if f.residuals] or [np.zeros(1)])
    return {
        "kinds": sorted(fits),
        "rel_rms_overall": float(np.sqrt(np.mean(allr**2))),
        "rel_rms_worst": max((f.rel_rms for f in fits.values()), default=0.0),
        "samples": int(sum(f.n for f in fits.values())),
    }


# ----------------------------------------------------------------------------- hardware spec


def efficiency_from_fits(hw: HardwareSpec, fits: dict[str, AffineFit]) -> dict[str, float]:
    """Efficiency factors (fitted rate / the spec's peak rate) for the keys the simulator reads.

    simulator.cost multiplies a resource key by an op's own `eff_key`, so each measured
    rate goes to exactly one key: compute (GEMMs; ops naming eff_key "gemm" then run at
    the measured GEMM rate), hbm (random-row gather: a worker's memory), and the
    collective keys all_to_all, all_reduce (bus bandwidth against the loopback link).
    """
    eff: dict[str, float] = {}
    peak = hw.flops_for("fp32")
    gemm = [f for k, f in fits.items() if k.startswith("gemm")]
    if gemm:
        # One compute factor: the harmonic mean rate over phases (backward counts as much).
        rate = len(gemm) / sum(1.0 / f.rate for f in gemm)
        eff["compute"] = rate / peak
    if "gather" in fits:
        eff["hbm"] = fits["gather"].rate / hw.gpu.hbm_bw
    link = hw.intra_bw()
    for kind in COLLECTIVE_KINDS:
        if kind in fits:
            eff[kind] = fits[kind].rate / link
    if "h2d" in fits or "d2h" in fits:
        rates = [fits[k].rate for k in ("h2d", "d2h") if k in fits]
        eff["pcie"] = min(rates) / hw.pcie_bw
    return {k: float(np.clip(v, 1e-4, 1e4)) for k, v in eff.items()}


def latencies_from_fits(fits: dict[str, AffineFit]) -> dict[str, float]:
    """Per-op fixed cost (launch_us) and the collective step latency (intra_latency_us)."""
    out: dict[str, float] = {}
    if any(k == "launch" or k.startswith("gemm") or k in ("gather", "pool") for k in fits):
        out["launch_us"] = launch_of(fits)
    steps = [fits[k].latency_us for k in COLLECTIVE_KINDS if k in fits]
    if steps:
        out["intra_latency_us"] = float(steps[0])  # shared by the joint fit
    return out


def calibrated_spec(base: HardwareSpec, fits_by_world: dict[int, dict[str, AffineFit]], world: int) -> HardwareSpec:
    """`base` (a HardwareSpec) with the coefficients fitted at each world size in its
    calibration (`worlds[n]`), made live for `world` ranks (see `spec_for_world`)."""
    if world not in fits_by_world:
        raise CalibrationError(f"no fit for world size {world} (have {sorted(fits_by_world)})")
    cal = Calibration()
    for n, fits in sorted(fits_by_world.items()):
        wf = cal.world(n)
        wf.efficiency = efficiency_from_fits(base, fits)
        for k, v in latencies_from_fits(fits).items():
            setattr(wf, k, max(v, 1e-3))  # positive, as the spec requires
    spec = _with(base, calibration=cal)
    return spec_for_world(spec, world)


def gpu_calibrated_spec(base: HardwareSpec, rates: DeviceRates) -> HardwareSpec:
    """`base` (a GPU spec) with the perf section and kernel gap its device's microbenchmarks
    measured (executor.measure.microbench.measure_device): factors of the same meaning as a preset's,
    measured / the spec's peaks, one per dtype and GEMM shape. Nothing measured on the CPU
    enters it: the CPU-fitted `efficiency` keys are dropped."""
    if base.kind != "gpu":
        raise CalibrationError(f"hardware {base.name} is a {base.kind} spec: a GPU calibration needs a GPU "
                               "preset or file as its base (e.g. h200, dgx-h100)")
    perf = perf_from_rates(base.gpu.flops, base.gpu.hbm_bw, base.pcie_bw, rates, base.perf)
    spec = _with(base, perf=perf, efficiency={})
    spec.gpu.launch_us = float(rates.launch_us)
    spec.source = {**base.source, "gpu.launch_us": perf.source.get("gemm", "picasso calibrate")}
    return spec


def calibrated_worlds(hw: HardwareSpec) -> list[int]:
    """World sizes the spec's calibration has figures for."""
    return sorted(hw.calibration.worlds) if hw.calibration is not None else []


def spec_for_world(hw: HardwareSpec, world: int) -> HardwareSpec:
    """The spec for `world` ranks on one node: the launch, latency and rate factors measured
    at that world size (or the nearest measured one) become the live figures. Its op-class
    fits and host gaps are applied by the cost model for the spec's world size
    (Calibration.resolve)."""
    d = hw.to_dict()
    d["gpus_per_node"] = int(world)
    d["nodes"] = 1
    cal = hw.calibration
    if cal is not None and cal.worlds:
        near = cal.nearest(world)
        wf = cal.worlds[near]
        eff = {**d["efficiency"], **wf.efficiency}
        if wf.launch_us is not None:
            d["gpu"]["launch_us"] = wf.launch_us
        if wf.intra_latency_us is not None:
            d["intra_latency_us"] = wf.intra_latency_us
        coll = [n for n in cal.worlds if n > 1]
        if world > 1 and near == 1 and coll:
            # Collectives were never measured below 2 ranks; use the smallest world that has them.
            w2 = cal.worlds[min(coll)]
            eff.update({k: v for k, v in w2.efficiency.items() if k in COLLECTIVE_KINDS})
            if w2.intra_latency_us is not None:
                d["intra_latency_us"] = w2.intra_latency_us
        d["efficiency"] = eff
    return HardwareSpec.from_dict(d, where=f"hardware {hw.name}")


def _with(hw: HardwareSpec, **fields: Any) -> HardwareSpec:
    """A copy of the spec `hw` with `fields` replaced (the calibration copied, never shared)."""
    spec = HardwareSpec.from_dict(hw.to_dict(), where=f"hardware {hw.name}")
    for k, v in fields.items():
        setattr(spec, k, v)
    return spec


def _calibration_of(hw: HardwareSpec) -> Calibration:
    """A copy of the spec's calibration to change (an empty one when it has none)."""
    return copy.deepcopy(hw.calibration) if hw.calibration is not None else Calibration()


# ----------------------------------------------------------------------------- per-op-class fit
# Fixed costs are kept in units of the spec's launch_us so that they follow the contention
# of each world size (the `worlds[n].launch_us` microbenchmarks measure it), as rates do.


def compute_before_collectives(graph: Any, hw: HardwareSpec) -> dict[str, float]:
    """Per collective op id: the modelled solo time (simulator.cost under `hw`, the base
    model) of the non-collective ops its rank runs, in program order, since its previous
    collective. Ranks that share cores (a CPU "cluster" with more ranks than cores) do not
    run that stretch in step: the OS runs some ranks ahead while others wait, so the
    early ranks wait at the next collective for the late ones, in proportion to the
    stretch (the same bytes take 2 ms after a short stretch, 10-18 ms after the dense
    forward and backward at 4 ranks on 2 cores). fit_op_classes fits the proportion per
    world size (`coll_wait`); the cost model adds it to the collective
    (simulator.compiled.pre_collective_compute computes the stretch for both)."""
    from simulator.compiled import _base_ops, pre_collective_compute, structure

    st = structure(graph)
    _, fixed, flow, _ = _base_ops(st, hw)
    is_coll = st.column("coll") >= 0
    pre = pre_collective_compute(st, fixed + flow, is_coll)
    return {st.ids[i]: float(pre[i]) for i in np.flatnonzero(is_coll)}


def _fit_class(rows: np.ndarray, fixed: bool, min_samples: int) -> tuple[float, float, np.ndarray]:
    """(f, s, relative residuals) of `measured = f * launch + s * flow` over rows (flow,
    launch, measured[, weight]); weights make each executed plan count alike, however many
    ops of the class it has."""
    flow, launch, meas = rows[:, 0], rows[:, 1], rows[:, 2]
    w = rows[:, 3] if rows.shape[1] > 3 else None
    spread = np.ptp(flow / launch) > 0.05 * max(float(np.max(flow / launch)), 1e-9)
    if fixed and len(rows) >= min_samples and spread and np.any(flow > 0):
        # plain least squares: sizes seen in one plan only (one big exchange among many small
        # ones) are a regime to fit, not outliers to discount
        coef, res = fit_linear("op class", np.stack([launch, flow], axis=1), meas, w, loss="linear")
        return float(coef[0]), float(coef[1]), res
    if np.all(flow > 0):
        # one size seen (or fixed=False): launch as measured, the rest scales
        s = max(float(np.median((meas - launch) / flow)), 1e-3)
        return 1.0, s, (launch + s * flow - meas) / meas
    f = float(np.median(meas / launch))
    return f, 0.0, (f * launch - meas) / meas


def hidden_wait(wait: np.ndarray, queued: np.ndarray | None) -> np.ndarray:
    """Per row, the mean over its measured events of the part of a release `wait` that the
    queue did not hide: max(wait - time queued, 0) (the engines start a collective at
    max(lane free, data ready + wait), simulator.compiled). `queued`: (rows, events), NaN
    where a row has fewer events (simulator.measured.queue_delays); None: never queued."""
    if queued is None:
        return np.maximum(wait, 0.0)
    return np.nanmean(np.maximum(wait[:, None] - queued, 0.0), axis=1)


def _fit_release(lane: np.ndarray, wait: np.ndarray, meas: np.ndarray, queued: np.ndarray | None,
                 weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Non-negative (b, g, relative residuals) of measured = lane @ b + hidden_wait(wait @ g,
    queued): a collective's own run on its lane and its release wait, the part of the wait
    its time queued hid left out. Plain least squares (as _fit_class); the start is the
    linear fit with nothing hidden."""
    nl = lane.shape[1]
    A = np.concatenate([lane, wait], axis=1) / meas[:, None]
    sw = np.ones(len(meas)) if weights is None else np.sqrt(weights)
    norm = np.maximum(np.linalg.norm(A, axis=0), 1e-30)
    start, *_ = np.linalg.lstsq(A / norm * sw[:, None], sw, rcond=None)
    start = np.maximum(start, 1e-9)

    def resid(p: np.ndarray) -> np.ndarray:
        q = p / norm
        return (lane @ q[:nl] + hidden_wait(wait @ q[nl:], queued) - meas) / meas

    sol = least_squares(lambda p: resid(p) * sw, start, bounds=(0.0, np.inf), diff_step=1e-4)
    q = sol.x / norm
    return q[:nl], q[nl:], resid(sol.x)


def _fit_wait(rows: np.ndarray, pre: np.ndarray, min_samples: int,
              queued: np.ndarray | None = None) -> tuple[float, float, float, np.ndarray] | None:
    """(f, s, c, relative residuals) of `measured = f * launch + s * flow + hidden(c * pre)`
    for the collectives of one world size (rows as _fit_class; pre: compute_before_collectives;
    hidden: hidden_wait), or None when the rows cannot tell the three apart (too few, sizes
    or stretches alike)."""
    flow, launch, meas = rows[:, 0], rows[:, 1], rows[:, 2]
    w = rows[:, 3] if rows.shape[1] > 3 else None
    if len(rows) < max(min_samples, 3) or not _spans(rows) or np.ptp(pre) <= 0.05 * max(float(np.max(pre)), 1e-9):
        return None
    b, g, res = _fit_release(np.stack([launch, flow], axis=1), pre[:, None], meas, queued, w)
    return float(b[0]), float(b[1]), float(g[0]), res


Coef = tuple[float, float, float, float]  # (f, s, c, a): f * launch + s * flow on the lane, a wait c * pre + a * launch


def _fit_form(form: str, rows: np.ndarray, pre: np.ndarray, fixed: bool, min_samples: int,
              queued: np.ndarray | None = None) -> tuple[str, Coef]:
    """(form used, (f, s, c, a)) of one model form for one world's samples of a class (rows
    as _fit_class): "skew" (collectives, _fit_skew); "wait": measured = f * launch + s * flow
    + the unhidden part of a wait c * pre (collectives, _fit_wait); "own": a fixed + rate
    fit (_fit_class); "kappa": the world's own model (one launch and the flow at its
    microbenchmarked rates, which hold how its ops scale with size) scaled by one factor. A
    form the rows cannot support falls back to the next simpler one."""
    if form == "wait":
        got = _fit_wait(rows, pre, min_samples, queued)
        if got is not None:
            return "wait", (got[0], got[1], got[2], 0.0)
    if form == "skew" and (sk := _fit_skew(rows, pre, min_samples, queued)) is not None:
        return "skew", sk
    if form in ("wait", "own") and len(rows) >= min_samples and _spans(rows):
        fw, sw, _ = _fit_class(rows, fixed, min_samples)
        return "own", (fw, sw, 0.0, 0.0)
    own = rows[:, 1] + rows[:, 0]
    kappa = float(np.median(rows[:, 2] / np.maximum(own, 1e-9)))
    return "kappa", (kappa, kappa, 0.0, 0.0)


def _fit_skew(rows: np.ndarray, pre: np.ndarray, min_samples: int,
              queued: np.ndarray | None = None) -> Coef | None:
    """(k, k, c, a) of measured = k * (one launch + the modelled collective) + the part of a
    release wait c * pre + a * launch that its time queued (`queued`, see hidden_wait) did
    not hide, by least squares on relative residuals. The wait's fixed part `a` is fitted
    where the sizes span (`_spans`: else it and k are one coefficient), else 0. None when
    the rows cannot tell the parts apart, or show no wait."""
    if len(rows) < min_samples or np.count_nonzero(pre) < 2:
        return None
    launch, own, m = rows[:, 1], rows[:, 1] + rows[:, 0], rows[:, 2]
    wait = np.stack([pre, launch], axis=1) if _spans(rows) else pre[:, None]
    b, g, _ = _fit_release(own[:, None], wait, m, queued)
    k, c, a = float(b[0]), float(g[0]), float(g[1]) if len(g) > 1 else 0.0
    if k <= 0 or np.max(c * pre + a * launch) <= 1e-3 * float(np.min(m)):
        return None
    return k, k, c, a


def _predict_form(coef: Coef, rows: np.ndarray, pre: np.ndarray, queued: np.ndarray | None = None) -> np.ndarray:
    f, s, c, a = coef
    return f * rows[:, 1] + s * rows[:, 0] + hidden_wait(c * pre + a * rows[:, 1], queued)


def _choose_form(rows: np.ndarray, pre: np.ndarray, plans: np.ndarray, wait_ok: bool, fixed: bool,
                 min_samples: int, queued: np.ndarray | None = None) -> str:
    """The model form for one world's samples of a class, chosen by leave-one-plan-out
    error: each form is fitted without one executed plan and scored on that plan's ops,
    in turn. A form with more coefficients must predict plans it has not seen better, not
    just fit the ones it has: a fixed cost per collective fitted on the few large exchanges
    of two plans doubled the prediction of an unpacked plan's 78 small ones, and the plain
    form, where the rows have too few sizes for a fixed + rate fit, extrapolates
    badly across batch sizes. With one plan, the richest form the rows support.

    Two priors come before that score, because a world has a few fit plans only and the
    score then picks by chance among forms that fit them alike:
    - a collective (`wait_ok`) takes the "skew" form wherever the rows can fit it: the
      microbenchmarked collective scaled by one factor, plus a wait for slower ranks in
      proportion to the compute its rank ran since its previous collective. A collective
      issued right behind another one waits for nobody; a pure scale fitted on plans with
      few, unqueued collectives charged every queued one that wait (one 4-rank plan with
      300+ collectives a step was predicted at twice its time);
    - a compute class whose sizes span (`_spans`) takes the fixed + rate form ("own")
      unless another form predicts the left-out plans clearly better (OWN_MARGIN): one scale
      cannot hold a fixed cost and a rate at once, and over-predicted 1-rank plans at
      batch 512-1024 by 16-25% when fitted on micro-batches of 128-512.
    Replayed on two quiet sweeps (`picasso validate --replay`) the priors took the MAPE
    of the held-out plans from 12.4% to 11.1% and from 13.6% to 9.8%."""
    if wait_ok and _fit_skew(rows, pre, min_samples, queued) is not None:
        return "skew"
    forms = (["wait"] if wait_ok else []) + (["own"] if fixed else []) + ["kappa"]
    ids = sorted(set(plans.tolist()))
    if len(ids) < 2:
        return forms[0]
    scores = {}
    for form in forms:
        errs = []
        for pid in ids:
            out = plans == pid
            _, coef = _fit_form(form, rows[~out], pre[~out], fixed, min_samples, _rows_of(queued, ~out))
            pred = _predict_form(coef, rows[out], pre[out], _rows_of(queued, out))
            errs.append(float(np.mean(np.abs(pred - rows[out, 2]) / rows[out, 2])))
        scores[form] = float(np.mean(errs))
    best = min(forms, key=lambda k: (scores[k], forms.index(k)))
    if "own" in scores and _spans(rows) and scores["own"] <= OWN_MARGIN * scores[best]:
        return "own"
    return best


def _rows_of(queued: np.ndarray | None, sel: np.ndarray) -> np.ndarray | None:
    return None if queued is None else queued[sel]


def _padded(rows: list[np.ndarray]) -> np.ndarray:
    """Per-row sequences of different lengths as one (rows, longest) array, NaN-padded."""
    out = np.full((len(rows), max((len(r) for r in rows), default=1)), np.nan)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


OWN_MARGIN = 1.3  # _choose_form keeps the fixed + rate form unless another one is better by this factor
SPAN_RATIO = 4.0  # a world's own fixed + rate fit needs sizes (flow / launch) this far apart


def _spans(rows: np.ndarray) -> bool:
    """Do the rows' sizes span enough to tell a fixed cost from a rate (else extrapolating
    a two-coefficient fit to other sizes is a guess)?"""
    r = rows[:, 0] / rows[:, 1]
    return bool(np.min(r) > 0 and np.max(r) >= SPAN_RATIO * np.min(r))


def fit_op_classes(
    hw: HardwareSpec,
    runs: Sequence[tuple[Any, ...]],
    classify: Callable[[str], str],
    min_samples: int = 3,
    fixed: bool = True,
    per_world: bool = True,
    collectives: bool = True,
) -> tuple[Any, dict[str, Any]]:
    """Fit each compute op class's fixed cost and rate factor to executed plans.

    `runs` = (OpGraph as lowered, world size, measured per-op us by op name[, per collective
    name the time each of its measured events sat queued, simulator.measured.queue_delays;
    none: never queued]). For every op
    of a class, the model's flow time under `hw` (simulator.cost, the spec of its world
    size) and that world's launch_us are held against the measured duration:
    measured = f * launch_us + s * flow (f, s >= 0, relative residuals). The class then
    costs f launches fixed and its flow runs 1/s as fast (the calibration's ClassFit: rate =
    old factor / s, fixed_launches = f). Classes with fewer than `min_samples` ops or no
    spread (or with fixed=False) keep the launch as fixed cost and get a pure scale, or
    without flow a pure fixed cost.

    With `per_world`, a class is also fitted apart at each world size the fit plans ran
    at (the calibration's `worlds[n].classes`, which the cost model applies at that world
    size): the ranks of a CPU "cluster" share the cores, so how much an op's
    Python dispatch and its kernels slow down with the rank count differs per op (a
    single-threaded dispatch from a multi-threaded GEMM), which one factor per resource
    from the microbenchmarks does not capture. A world whose samples of a class are too few,
    or too alike in size (`_spans`), for two coefficients scales its own model (one launch
    plus the flow at the rates microbenchmarked at that world size) by one factor; a world
    with none keeps the pooled fit.

    With `collectives`, collective ops form classes of their own (`class_key`): their
    measured span runs from launch to completion (executor.step.timing), and their "flow" is
    the whole modelled collective (its own fixed part, latency and bandwidth terms), so
    `s` scales all of it ("lat:op:<class>" the latency terms, "op:<class>" the bandwidth)
    and `f` adds launches: on a CPU "cluster" a collective competes with the ranks' compute
    for the cores, which the idle-machine microbenchmarks do not see. A collective's wait
    for slower ranks (the "skew" and "wait" forms, `_choose_form`) is a release delay: an
    event that sat queued longer than the wait shows none of it (hidden_wait), so the fit
    reads it off the events that were not queued. Returns (spec, report).
    """
    from simulator.cost import op_busy

    samples: dict[str, list[tuple[float, ...]]] = {}  # class -> (flow, launch, measured, weight, world, pre, plan)
    queued_of: dict[str, list[np.ndarray]] = {}  # class -> per sample its events' times queued
    old_k: dict[tuple[str, int], float] = {}
    colls: set[str] = set()
    for run_i, run in enumerate(runs):
        graph, world, meas = run[:3]
        queue = run[3] if len(run) > 3 else {}
        spec = spec_for_world(hw, int(world))
        before = compute_before_collectives(graph, spec) if collectives else {}
        per_name: dict[tuple[str, str], list[float]] = {}
        pre_name: dict[str, list[float]] = {}
        for nid, a in graph.ops():
            args = a.get("args") or {}
            coll = a.get("collective") is not None and collectives
            if a.get("collective") is not None and not collectives:
                continue
            fixed_part, flow, _ = op_busy(a, spec)
            if coll:  # the whole modelled collective (own fixed part, latency, bandwidth) is its "flow"
                flow = fixed_part - (spec.gpu.launch_us if args.get("launch", True) else 0.0) + flow
            cls = class_key(classify(a["name"]), coll)
            if coll:
                colls.add(cls)
                pre_name.setdefault(a["name"], []).append(before.get(nid, 0.0))
            per_name.setdefault((a["name"], cls), []).append(flow)
            old_k[(cls, int(world))] = spec.eff(args.get("eff_key"))
        got = [(name, cls, flows) for (name, cls), flows in per_name.items() if (meas.get(name) or 0) > 0]
        count = Counter(cls for _, cls, _ in got)
        for name, cls, flows in got:
            samples.setdefault(cls, []).append(
                (float(np.mean(flows)), spec.gpu.launch_us, float(meas[name]), 1.0 / count[cls], int(world),
                 float(np.mean(pre_name.get(name, [0.0]))), run_i))
            queued_of.setdefault(cls, []).append(np.asarray(queue.get(name) or [0.0], float))
    if not samples:
        raise CalibrationError("fit_op_classes: no measured op matched a lowered op by name")
    cal = _calibration_of(hw)
    report: dict[str, Any] = {}
    for cls, rows in sorted(samples.items()):
        arr = np.array([r[:4] for r in rows])
        worlds = np.array([r[4] for r in rows])
        pres = np.array([r[5] for r in rows])
        plans = np.array([r[6] for r in rows])
        queued = _padded(queued_of[cls])
        f, s, res = _fit_class(arr, fixed, min_samples)
        k0 = float(np.median([old_k[(cls, int(w))] for w in set(worlds.tolist())]))
        pooled = cal.classes.setdefault(cls, ClassFit())
        pooled.fixed_launches = max(f, 1e-3)
        if s > 0:
            pooled.rate = float(np.clip(k0 / s, 1e-5, 1e5))
        if cls in colls:  # latency and bandwidth terms alike (s = 0: all of it in the fixed part)
            pooled.latency_scale = float(np.clip(s, 1e-5, 1e5))
            pooled.rate = float(np.clip(k0 / max(s, 1e-5), 1e-5, 1e5))
        entry: dict[str, Any] = {"n": len(rows), "fixed_launches": round(f, 3), "flow_scale": round(s, 4),
                                 "rel_rms": round(float(np.sqrt(np.mean(res**2))), 4)}
        if per_world:
            by_world: dict[str, Any] = {}
            for w in sorted(set(worlds.tolist())):
                sel = worlds == w
                sub, sub_pre, sub_plans, sub_q = arr[sel], pres[sel], plans[sel], queued[sel]
                form, coef = _fit_form(_choose_form(sub, sub_pre, sub_plans, cls in colls and w > 1 and fixed,
                                                    fixed, min_samples, sub_q), sub, sub_pre, fixed, min_samples, sub_q)
                fw, sw = coef[0], coef[1]
                rw = (_predict_form(coef, sub, sub_pre, sub_q) - sub[:, 2]) / sub[:, 2]
                wait = coef if form in ("wait", "skew") else None
                if wait is not None:
                    cal.world(w).coll_wait = max(wait[2], 1e-6)  # the spec wants it positive
                    cal.world(w).coll_wait_launches = wait[3] if wait[3] > 1e-6 else None
                one = cal.world(w).classes.setdefault(cls, ClassFit())
                one.fixed_launches = max(fw, 1e-3)
                if sw > 0:
                    one.rate = float(np.clip(old_k[(cls, w)] / sw, 1e-5, 1e5))
                elif s > 0:  # no flow at this world: keep the pooled rate, the fixed part carries it
                    one.rate = float(np.clip(old_k[(cls, w)] / s, 1e-5, 1e5))
                if cls in colls:
                    one.latency_scale = float(np.clip(sw, 1e-5, 1e5))
                    one.rate = float(np.clip(old_k[(cls, w)] / max(sw, 1e-5), 1e-5, 1e5))
                by_world[str(w)] = {"n": len(sub), "form": form, "fixed_launches": round(fw, 3),
                                    "flow_scale": round(sw, 4), "rel_rms": round(float(np.sqrt(np.mean(rw**2))), 4)}
                if wait is not None:
                    by_world[str(w)]["wait_per_compute_us"] = round(wait[2], 4)
                    by_world[str(w)]["wait_launches"] = round(wait[3], 3)
            entry["worlds"] = by_world
        report[cls] = entry
    return _with(hw, calibration=cal), report


def fit_host_gaps(hw: HardwareSpec, runs: Sequence[tuple[int, float, float]]) -> tuple[HardwareSpec, dict[str, Any]]:
    """The host time no op's timing holds, measured on executed plans: `runs` = (world
    size, compute ops per rank and step, median untimed host time per rank and step, us;
    simulator.measured.host_gap). Modelled as a fixed part per step plus a part per
    op (the Python between two ops): gap = g0 + g1 * ops. g1 (us per op) is fitted on all
    runs, from the spread of op counts within each world size (the interpreter runs the
    same code at every world size); g0 per world size (what runs outside the ops each
    step, and how busy the cores are). Stored in launches of each world (the calibration's
    `worlds[n].op_gap`, `step_gap`; the cost model adds them). Returns (spec, report)."""

    rows = [(int(w), float(n), float(g)) for w, n, g in runs if n > 0 and g >= 0]
    if not rows:
        raise CalibrationError("fit_host_gaps: no run with timed ops")
    launch = {w: max(spec_for_world(hw, w).gpu.launch_us, 1e-3) for w in {r[0] for r in rows}}
    n = np.array([r[1] for r in rows])
    g = np.array([r[2] for r in rows])
    worlds = np.array([r[0] for r in rows])
    # g1 (us per op) from the spread of op counts within each world: demeaned per world
    x = n - np.array([n[worlds == w].mean() for w in worlds])
    y = g - np.array([g[worlds == w].mean() for w in worlds])
    g1 = float(max((x @ y) / (x @ x), 0.0)) if float(x @ x) > 0 else 0.0
    cal = _calibration_of(hw)
    report: dict[str, Any] = {"op_us": round(g1, 2), "worlds": {}}
    for w in sorted(launch):
        sel = worlds == w
        g0 = float(max(np.median(g[sel] - g1 * n[sel]), 0.0))
        cal.world(w).op_gap = max(g1 / launch[w], 1e-6)
        cal.world(w).step_gap = max(g0 / launch[w], 1e-6)
        report["worlds"][str(w)] = {"step_us": round(g0, 1), "op_us": round(g1, 2), "runs": int(sel.sum())}
    return _with(hw, calibration=cal), report
