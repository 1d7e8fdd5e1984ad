"""`picasso calibrate`: microbenchmark this machine, fit the cost model, write a hardware spec.

Wiring only: the benchmarks are in `microbench`, the fitting in `simulator.calibration`.
The benchmarks run at every world size in {1, 2, 4, ...} up to `--nproc` (the ranks of a
CPU "cluster" share the cores, so a rank's speed depends on how many there are); the
spec's live factors are those of `--nproc`, the others are kept as `w{n}.` keys that
`simulator.calibration.spec_for_world` selects for plans of another world size.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any


def mlp_shapes(model: Any) -> tuple[tuple[int, int], ...]:
    """(in, out) of every linear layer of the model's bottom and top MLPs."""
    shapes = []
    w = model.num_dense
    for out in model.bottom_mlp:
        shapes.append((w, out))
        w = out
    if model.arch == "dlrm" and model.interaction == "dot":
        f = len(model.tables) + (1 if model.bottom_mlp else 0)
        w = f * (f - 1) // 2 + (model.bottom_mlp[-1] if model.bottom_mlp else 0)
    else:
        w = sum(t.dim for t in model.tables) + (model.bottom_mlp[-1] if model.bottom_mlp else model.num_dense)
    for out in model.top_mlp:
        shapes.append((w, out))
        w = out
    return tuple(shapes)


def calibration_worlds(nproc: int) -> list[int]:
    worlds = [n for n in (1, 2, 4, 8) if n < nproc] + [nproc]
    return sorted(set(worlds))


def calibrate(
    nproc: int = 2,
    base: str = "local-cpu",
    model: str = "dlrm-criteo-kaggle",
    quick: bool = False,
    log: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """Measure, fit and build the spec. Returns (HardwareSpec, report dict with residuals)."""
    from executor.microbench import run_microbenchmarks
    from planner.presets import get_model
    from simulator.calibration import calibrated_spec, fit_samples, summarize
    from simulator.hardware import load_hardware

    base_hw = load_hardware(base)
    shapes = mlp_shapes(get_model(model))
    fits_by_world, samples_by_world, timings = {}, {}, {}
    for n in calibration_worlds(nproc):
        t0 = time.perf_counter()
        if log:
            log(f"calibrate: microbenchmarks at {n} rank(s) ...")
        samples = run_microbenchmarks(n, mlp_shapes=shapes, quick=quick)
        fits_by_world[n] = fit_samples(samples)
        samples_by_world[n] = samples
        timings[n] = time.perf_counter() - t0
    hw = calibrated_spec(base_hw, fits_by_world, nproc)
    hw.name = f"{base}-calibrated"
    source = dict(hw.source)
    source["calibration"] = (
        f"picasso calibrate on {platform.node() or 'this machine'} ({platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores), {time.strftime('%Y-%m-%d %H:%M:%S')}, worlds {sorted(fits_by_world)}"
    )
    for n, fits in fits_by_world.items():
        for k, f in fits.items():
            source[f"fit.w{n}.{k}"] = f"rel_rms={f.rel_rms:.3f} rel_max={f.rel_max:.3f} n={f.n}"
    hw.source = source
    report = {
        "hardware": hw.name,
        "nproc": nproc,
        "worlds": sorted(fits_by_world),
        "efficiency": {k: v for k, v in hw.efficiency.items() if "." not in k},
        "launch_us": hw.gpu.launch_us,
        "intra_latency_us": hw.intra_latency_us,
        "fits": {str(n): {k: f.to_dict() for k, f in fits.items()} for n, fits in fits_by_world.items()},
        "residuals": {str(n): summarize(fits) for n, fits in fits_by_world.items()},
        "seconds": {str(n): round(t, 2) for n, t in timings.items()},
        "samples": {str(n): s for n, s in samples_by_world.items()},
        "machine": {"processor": platform.processor(), "cpus": os.cpu_count(), "platform": platform.platform()},
    }
    return hw, report


def run_calibrate(args: Any) -> int:
    import sys

    from simulator.report import write_report

    out = Path(args.output)
    t0 = time.perf_counter()
    log = None if args.json else (lambda m: print(m, file=sys.stderr))
    hw, report = calibrate(nproc=args.nproc, base=args.base, model=args.model, quick=args.quick, log=log)
    hw.save(out)
    fit_path = out.with_name(out.stem + ".fit.json")
    write_report(fit_path, json.dumps(report, indent=1))
    report["seconds_total"] = round(time.perf_counter() - t0, 2)
    if args.json:
        slim = {k: v for k, v in report.items() if k not in ("samples", "fits")}
        slim["output"] = str(out)
        slim["fit_file"] = str(fit_path)
        print(json.dumps(slim, indent=1))
        return 0
    print(f"wrote {out} (fit details in {fit_path}) in {report['seconds_total']:.1f} s")
    print(f"{'world':>5} {'kind':<12} {'fixed us':>9} {'rate':>12} {'unit':<7} {'rel rms':>8} {'rel max':>8}")
    for n, fits in report["fits"].items():
        for k, f in fits.items():
            print(f"{n:>5} {k:<12} {f['latency_us']:9.1f} {f['rate']:12.4g} {f['unit']:<7} "
                  f"{f['rel_rms']:8.3f} {f['rel_max']:8.3f}")
    live = ", ".join(f"{k}={v:.3g}" for k, v in sorted(report["efficiency"].items()))
    print(f"efficiency (live, world {args.nproc}): {live}")
    print(f"launch_us={hw.gpu.launch_us:.1f} intra_latency_us={hw.intra_latency_us:.1f}")
    return 0
