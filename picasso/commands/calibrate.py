"""`picasso calibrate`: measure this machine and write a hardware spec for the simulator."""

from __future__ import annotations

import argparse

from foundation.flags import RANKS


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("calibrate", parents=[common],
                       help="microbenchmark this machine and fit the simulator's cost model")
    p.add_argument("-o", "--output", default="hardware.json", help="hardware spec to write (JSON or YAML)")
    p.add_argument("--nproc", type=RANKS, default=2, help="ranks (worker processes) to calibrate for")
    p.add_argument("--base", default="local-cpu", help="hardware preset or file to start from")
    p.add_argument("--model", default="dlrm-criteo-kaggle", help="model preset whose MLP shapes are timed")
    p.add_argument("--quick", action="store_true", help="fewer sizes (for tests)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where the microbenchmarks run (auto: the GPU when CUDA is there and --base is a GPU spec)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    import sys
    import time
    from pathlib import Path

    from foundation.outputs import Outputs
    from simulator.report import write_report
    from validation.calibrate import CalibrateConfig, CalibrationDevice, calibrate

    if args.nproc < 1:
        raise ValueError(f"--nproc must be at least 1, got {args.nproc}")
    Outputs().read("--base", args.base).read("--model", args.model).file(  # before minutes of microbenchmarks
        "-o", args.output, beside=(".fit.json",)).check()
    cfg = CalibrateConfig(nproc=args.nproc, base=args.base, model=args.model, quick=args.quick,
                          device=CalibrationDevice.from_str(args.device, "--device"))
    out = Path(args.output)
    t0 = time.perf_counter()
    hw, report = calibrate(cfg, None if args.json else (lambda m: print(m, file=sys.stderr)))
    hw.save(out)
    fit_path = out.with_name(out.stem + ".fit.json")
    write_report(fit_path, json.dumps(report, indent=1))
    report["seconds_total"] = round(time.perf_counter() - t0, 2)
    if args.json:
        slim = {k: v for k, v in report.items() if k not in ("samples", "fits")}
        print(json.dumps({**slim, "output": str(out), "fit_file": str(fit_path)}, indent=1))
        return 0
    print(f"wrote {out} (fit details in {fit_path}) in {report['seconds_total']:.1f} s")
    if "perf" in report:  # measured on the GPU
        perf = report["perf"]
        for dt, per in perf.get("gemm", {}).items():
            print(f"gemm {dt:5s} " + "  ".join(f"{s} {v:.3f}" for s, v in per.items()) + "  (achieved / peak)")
        print(f"hbm stream {perf['hbm_stream']:.3f}  random {perf['hbm_random']:.3f}  pcie {perf['pcie']:.3f}  "
              f"launch_us {report['launch_us']:.2f}  step_host_us {perf['step_host_us']:.1f}")
        return 0
    from foundation.numbers import si

    print(f"{'world':>5} {'kind':<12} {'fixed us':>9} {'rate':>16} {'rel rms':>8} {'rel max':>8}")
    for n, fits in report["fits"].items():
        for k, f in fits.items():
            print(f"{n:>5} {k:<12} {f['latency_us']:9.1f} {si(f['rate'], f['unit']):>16} "
                  f"{f['rel_rms']:8.3f} {f['rel_max']:8.3f}" + (f"  {f['problem']}" if f.get("problem") else ""))
    live = ", ".join(f"{k}={v:.3g}" for k, v in sorted(report["efficiency"].items()))
    print(f"efficiency (live, world {args.nproc}): {live}")
    print(f"launch_us={hw.gpu.launch_us:.1f} intra_latency_us={hw.intra_latency_us:.1f}")
    return 0
