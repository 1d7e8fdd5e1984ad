"""How far the executor's step is from the hardware floor of that step.

For each plan: the step's FLOPs (lowering's ops on rank 0, by dtype) at the device's GEMM rate
plus its bytes at the device's HBM rate, both from a hardware file (`picasso calibrate --device
cuda` writes the measured ones; without one the h200 preset's figures on CUDA, and on a CPU
`picasso calibrate --device cpu --quick` of this machine, run first), beside the measured step (`picasso run --preload`, whole steps timed) and, on CUDA, the
kernels a steady step launches (torch.profiler over eager steps of the same Trainer). The floor
adds compute and memory time instead of overlapping them; lowering's bytes are those of the torch
path's ops, so the floor of a fused step is, if anything, lower still.

    python bench/bench_step_floor.py                          # the GPU's plans (bench/gpu_session.sh floor)
    python bench/bench_step_floor.py --hardware hw_gpu.json   # rates from `picasso calibrate --device cuda`
    python bench/bench_step_floor.py --executor-json OUT/executor_gpu.json  # measured steps taken from that run
    python bench/bench_step_floor.py --quick                  # CPU: small tables and batches, local-cpu rates

Writes bench/results/step_floor/<machine>.json (or -o).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import torch
from bench_executor_gpu import make_plan, picasso, prepare_data, run_plan
from results_path import results_path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (model, dense dtype, batches) per device: the plans the GPU figures are reported for
GPU_CASES = [("dlrm-criteo-kaggle", "tf32", (4096, 16384, 65536)), ("dlrm-mlperf", "bf16", (65536,)),
             ("dcn-v2", "tf32", (16384,)), ("deepfm", "tf32", (16384,)), ("wide-deep", "tf32", (16384,))]
CPU_CASES = [("dlrm-criteo-kaggle", "fp32", (512, 2048)), ("dcn-v2", "fp32", (512,))]


def floor_of(plan_path: Path, profile: Path, hw) -> dict:
    """The step's FLOPs and HBM bytes on rank 0 as lowering has them, and the floor they set."""
    import numpy as np

    from planner.lowering import lower
    from planner.plan import Plan
    from traces.profile import AccessProfile

    plan = Plan.load(plan_path)
    low = lower(plan, hw, AccessProfile.load(profile), check_memory=False)
    flops: dict[str, float] = {}
    hbm = 0.0
    for op in low.ops:
        if op.kind == "collective" or (op.ranks is not None and 0 not in op.ranks):
            continue

        def at0(v) -> float:
            return float(np.asarray(v).reshape(-1)[0]) if np.ndim(v) else float(v)

        if f := at0(op.demand.get("flops", 0.0)):
            flops[op.dtype] = flops.get(op.dtype, 0.0) + f
        hbm += at0(op.demand.get("hbm_bytes", 0.0))
    compute_s = sum(f / gemm_rate(hw, dt) for dt, f in flops.items())
    memory_s = hbm / hbm_rate(hw)
    return {"flops": flops, "hbm_bytes": hbm, "compute_floor_ms": compute_s * 1e3,
            "memory_floor_ms": memory_s * 1e3, "floor_ms": (compute_s + memory_s) * 1e3}


def gemm_rate(hw, dtype: str) -> float:
    """The best GEMM rate the hardware file gives for `dtype` (its measured fraction of peak, of
    the shape classes it has, where calibrated)."""
    from simulator.device_perf import GemmShape

    return hw.flops_for(dtype) * hw.eff("compute") * max(hw.perf.gemm_fraction(dtype, s) for s in GemmShape)


def hbm_rate(hw) -> float:
    """Streaming device-memory bytes per second (measured where calibrated)."""
    return hw.gpu.hbm_bw * hw.eff("hbm") * hw.perf.hbm_fraction(None)


def measured_from(executor_json: Path | None, model: str, batch: int) -> float | None:
    """samples/s of the graph (else eager Triton) row of a bench_executor_gpu result, if present."""
    if executor_json is None or not executor_json.exists():
        return None
    rows = [r for r in json.loads(executor_json.read_text()).get("rows", [])
            if r.get("model") == model and r.get("batch") == batch and r.get("samples_per_s")]
    rows.sort(key=lambda r: {"graph": 0, "triton": 1}.get(r.get("kernels"), 2))
    return float(rows[0]["samples_per_s"]) if rows else None


def kernels_per_step(plan: Path, data: Path, steps: int) -> float | None:
    """Kernels one steady step launches (CUDA only: torch.profiler over eager Trainer steps)."""
    if not torch.cuda.is_available():
        return None
    from profile_gpu_step import profile

    return profile(plan, data, steps, triton=True, top=0)["launches_per_step"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", help="hardware file or preset for the rates (default: h200 on CUDA, local-cpu)")
    ap.add_argument("--executor-json", type=Path, help="take measured steps from this bench_executor_gpu result")
    ap.add_argument("--models", help="comma-separated subset of the models")
    ap.add_argument("--quick", action="store_true", help="CPU: row cap 20k, small batches")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--profile-steps", type=int, default=4)
    ap.add_argument("--mlperf-row-cap", type=int, default=0, help="rows per dlrm-mlperf table (0: full size)")
    ap.add_argument("--work", type=Path, help="data and plans folder (bench_executor_gpu.py --work's: reused)")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    plan_hw = ("h200" if "H200" in torch.cuda.get_device_name(0) else "dgx-h100") if cuda else "local-cpu"
    from simulator.hardware import load_hardware

    hw_name = args.hardware or plan_hw
    if not cuda and not args.hardware:  # a CPU's rates are this machine's: calibrated here, one worker
        hw_file = Path(tempfile.mkdtemp()) / "hw_cpu.json"
        picasso("calibrate", "--device", "cpu", "--base", "local-cpu", "--nproc", "1", "--quick", "-o", str(hw_file))
        hw_name = str(hw_file)
    hw = load_hardware(hw_name, ["gpus_per_node=1", "nodes=1"])
    cases = GPU_CASES if cuda else CPU_CASES
    if args.models:
        cases = [c for c in cases if c[0] in args.models.split(",")]
    steps = 4 if args.quick else args.steps
    out = {"hardware_rates": {"gemm_flops_per_s": {k: gemm_rate(hw, k) for k in ("fp32", "tf32", "bf16")},
                              "hbm_bytes_per_s": hbm_rate(hw)},
           "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
                       "device": torch.cuda.get_device_name(0) if cuda else "cpu"},
           "command": " ".join(["python", *sys.argv]),
           "hardware": "picasso calibrate --device cpu --quick" if hw_name.endswith("hw_cpu.json") else hw_name,
           "rows": []}
    output = args.output or results_path("step_floor")
    with tempfile.TemporaryDirectory() as tmp:
        d = args.work or Path(tmp)
        prepare_data(d, max(b for _, _, bs in cases for b in bs) * (steps + 4))
        for model, ddt, batches in cases:
            cap = 20_000 if args.quick or not cuda else (args.mlperf_row_cap or None if model == "dlrm-mlperf" else None)
            for b in batches:
                plan = make_plan(d, model, plan_hw, b, cap, ddt)
                row = {"model": model, "dense_dtype": ddt, "batch": b, "row_cap": cap,
                       **floor_of(plan, d / "profile.json", hw)}
                sps = measured_from(args.executor_json, model, b)
                if sps is None:
                    run = run_plan(d, plan, steps, "graph" if cuda else "triton")
                    sps = run["samples_per_s"]
                row["measured_samples_per_s"] = sps
                row["measured_ms"] = b / sps * 1e3 if sps else None
                row["measured_over_floor"] = row["measured_ms"] / row["floor_ms"] if sps and row["floor_ms"] else None
                row["floor_samples_per_s"] = b / row["floor_ms"] * 1e3 if row["floor_ms"] else None
                row["kernels_per_step"] = kernels_per_step(plan, d / "data.tsv", args.profile_steps)
                out["rows"].append(row)
                output.write_text(json.dumps(out, indent=2) + "\n")  # after every row: a cut run keeps its rows
                k = row["kernels_per_step"]
                print(f"{model:20s} {ddt:5s} batch {b:6d}  floor {row['floor_ms']:8.3f} ms "
                      f"(compute {row['compute_floor_ms']:.3f}, memory {row['memory_floor_ms']:.3f})  "
                      f"measured {row['measured_ms'] or 0:8.3f} ms  x{row['measured_over_floor'] or 0:5.2f}  "
                      f"kernels {k if k is not None else '-'}", flush=True)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
