"""`picasso calibrate`: microbenchmark this machine, fit the cost model, build a hardware spec.

The benchmarks (executor.measure.microbench) run at every world size in {1, 2, 4, ...} up to
`nproc` (the ranks of a CPU "cluster" share the cores, so a rank's speed depends on how
many there are); the fitting is simulator.calibration's. The spec's live factors are
those of `nproc`; every world size's are kept in its calibration (`worlds[n]`), which
`simulator.calibration.spec_for_world` selects for plans of another world size.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from executor.measure.microbench import CudaBench, DeviceBench, measure_device, run_microbenchmarks
from foundation.progress import activity
from planner.dense import mlp_shapes
from planner.modes import Mode
from planner.presets import get_model
from simulator.calibration import calibrated_spec, fit_problem, fit_samples, gpu_calibrated_spec, summarize
from simulator.hardware import HardwareSpec, load_hardware


class CalibrationDevice(Mode):
    """Where the microbenchmarks run: the CPU worker processes, or the GPU (`auto`: the GPU
    when CUDA is there and the base spec is a GPU's)."""

    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


@dataclass
class CalibrateConfig:
    """The parameters of a calibration (`picasso calibrate`'s flags)."""

    nproc: int = 2
    base: str = "local-cpu"  # the hardware preset or file the fitted factors go into
    model: str = "dlrm-criteo-kaggle"  # whose MLP shapes are timed
    quick: bool = False  # fewer sizes (tests, the demo)
    device: CalibrationDevice = CalibrationDevice.AUTO

    def check(self) -> None:
        if self.nproc < 1:
            raise ValueError(f"--nproc must be at least 1, got {self.nproc}")


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # a broken torch install: no GPU to calibrate
        return False


def on_gpu(cfg: CalibrateConfig, base: HardwareSpec) -> bool:
    """Whether this calibration runs on the GPU (see CalibrationDevice)."""
    if cfg.device == CalibrationDevice.CUDA:
        if base.kind != "gpu":
            raise ValueError(f"--device cuda needs a GPU spec as --base (h200, dgx-h100, ...), got {base.name}")
        if not _cuda_available():
            raise ValueError("--device cuda: no CUDA device on this machine")
        return True
    return cfg.device == CalibrationDevice.AUTO and base.kind == "gpu" and _cuda_available()


def calibrate_gpu(base: HardwareSpec, bench: DeviceBench,
                  log: Callable[[str], None] | None = None) -> tuple[HardwareSpec, dict[str, Any]]:
    """The GPU's microbenchmarks through `bench` (executor.measure.microbench.DeviceBench) and the spec
    they give: `base` with its perf section and kernel gap measured (no CPU rate in it)."""
    t0 = time.perf_counter()
    if log:
        log(f"calibrate: GPU microbenchmarks on {bench.name} ...")
    rates = measure_device(bench)
    hw = gpu_calibrated_spec(base, rates)
    hw.name = f"{base.name}-calibrated"
    hw.source = {**hw.source, "calibration": f"picasso calibrate on {bench.name} ({platform.node() or 'this machine'}), "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S')}"}
    report = {"hardware": hw.name, "device": bench.name, "rates": asdict(rates), "perf": hw.perf.to_dict(),
              "launch_us": hw.gpu.launch_us, "seconds": round(time.perf_counter() - t0, 2)}
    return hw, report


def calibration_worlds(nproc: int) -> list[int]:
    worlds = [n for n in (1, 2, 4, 8) if n < nproc] + [nproc]
    return sorted(set(worlds))


def calibrate(cfg: CalibrateConfig, log: Callable[[str], None] | None = None,
              bench: DeviceBench | None = None) -> tuple[HardwareSpec, dict[str, Any]]:
    """Measure, fit and build the spec. Returns (HardwareSpec, report dict with residuals).
    On a GPU (`cfg.device`, or `bench` given: a DeviceBench to time with) the device's own
    microbenchmarks make the spec's perf section; else the CPU ranks' fits its efficiency."""
    cfg.check()
    nproc, base = cfg.nproc, cfg.base
    base_hw = load_hardware(base)
    if bench is not None or on_gpu(cfg, base_hw):
        return calibrate_gpu(base_hw, bench if bench is not None else CudaBench(), log)
    shapes = mlp_shapes(get_model(cfg.model))
    fits_by_world, samples_by_world, timings = {}, {}, {}
    for n in calibration_worlds(nproc):
        t0 = time.perf_counter()
        if log:
            log(f"calibrate: microbenchmarks at {n} rank(s) ...")
        with activity(f"calibrate: microbenchmarks at {n} rank(s)"):
            samples = run_microbenchmarks(n, mlp_shapes=shapes, quick=cfg.quick)
        fits_by_world[n] = fit_samples(samples)
        for k, f in fits_by_world[n].items():
            problem = fit_problem(f.rate, f.rel_rms, f.rel_max)
            if problem and log:
                log(f"calibrate: warning: {k} at {n} rank(s): {problem}")
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
        "efficiency": dict(hw.efficiency),
        "launch_us": hw.gpu.launch_us,
        "intra_latency_us": hw.intra_latency_us,
        "fits": {str(n): {k: f.to_dict() for k, f in fits.items()} for n, fits in fits_by_world.items()},
        "residuals": {str(n): summarize(fits) for n, fits in fits_by_world.items()},
        "seconds": {str(n): round(t, 2) for n, t in timings.items()},
        "samples": {str(n): s for n, s in samples_by_world.items()},
        "machine": {"processor": platform.processor(), "cpus": os.cpu_count(), "platform": platform.platform()},
    }
    return hw, report
