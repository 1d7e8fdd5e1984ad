"""The uncalibrated GPU presets against published training throughput (issue 38).

Each case is a published measurement of a known model, batch and GPU count; picasso plans it
on the matching preset (planner search, Zipf access where no profile of the data set is
here) and predicts its step time. The prediction needs no GPU: this script only simulates.
The goal is predicted / published throughput within 0.8-1.25 for every case.

Run: python bench/bench_presets_published.py [--out bench/results/presets_published/<machine>.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_path import results_path  # noqa: E402

from planner.access import table_access  # noqa: E402
from planner.model_spec import ModelSpec, TableSpec  # noqa: E402
from planner.presets import get_model  # noqa: E402
from planner.search import search  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402

# Criteo 1TB with frequency threshold 15 (NVIDIA DeepLearningExamples, DLRM "small" variant:
# TensorFlow2/Recommendation/DLRM_and_DCNv2/dataloading/generate_feature_spec.py, criteo_t15)
CRITEO_FL15 = (7912889, 33823, 17139, 7339, 20046, 4, 7105, 1382, 63, 5554114, 582469, 245828, 11, 2209,
               10667, 104, 4, 968, 15, 8165896, 2675940, 7156453, 302516, 12022, 97, 35)
NVIDIA_DLRM = ("NVIDIA DeepLearningExamples PyTorch/Recommendation/DLRM README, 'Training performance' "
               "tables (Criteo 1TB FL=15 'small' model, batch 64k per GPU, --cuda_graphs)")
MLPERF = ("MLPerf Training v3.0 closed, NVIDIA HugeCTR DLRM-DCNv2 on 8 x H100-SXM5-80GB (DGX H100), global "
          "batch 55,296: time per step between evaluations from the submission's log")


def dlrm_fl15(dense_dtype: str) -> ModelSpec:
    """NVIDIA's DLRM (dim 128, bottom 512-256-128, top 1024-1024-512-256-1, dot interaction,
    SGD) on the FL=15 tables, one-hot."""
    base = get_model("dlrm-mlperf")
    tables = tuple(TableSpec(name=f"C{i + 1}", num_rows=c, dim=128) for i, c in enumerate(CRITEO_FL15))
    return replace(base, name="dlrm-fl15", tables=tables, dense_dtype=dense_dtype)


def dcnv2(dense_dtype: str) -> ModelSpec:
    base = get_model("dlrm-dcnv2")
    return replace(base, dense_dtype=dense_dtype)


@dataclass
class Case:
    name: str
    model: ModelSpec
    hardware: str
    overrides: list[str]
    batch_per_rank: int
    published: float  # samples/s, or ms per step where `unit` says so
    unit: str  # "samples/s" | "ms/step"
    source: str
    notes: list[str] = field(default_factory=list)


def cases() -> list[Case]:
    one = ["nodes=1", "gpus_per_node=1"]
    # DGX-1 V100 32GB is the SXM2 part: 15.7 TFLOP/s fp32, 125 tensor (V100 datasheet); the
    # p2res-v100 preset is the PCIe part, its peaks set to the SXM2's for these two cases
    sxm2 = one + ["gpu.flops.fp32=15.7TFLOP/s", "gpu.flops.fp16=125TFLOP/s", "gpu.flops.bf16=125TFLOP/s"]
    return [
        Case("DLRM FL15, 1 x A100 80GB, 64k, AMP", dlrm_fl15("bf16"), "dgx-a100", one, 65536, 4.02e6,
             "samples/s", NVIDIA_DLRM, ["AMP is fp16 there; bf16 runs at the same tensor rate on A100"]),
        Case("DLRM FL15, 1 x A100 80GB, 64k, TF32", dlrm_fl15("tf32"), "dgx-a100", one, 65536, 2.88e6,
             "samples/s", NVIDIA_DLRM),
        Case("DLRM-DCNv2, 8 x H100, 55,296 global, MLPerf v3.0", dcnv2("bf16"), "dgx-h100", [], 55296 // 8, 3.81,
             "ms/step", MLPERF, ["fp16 AMP there; bf16 runs at the same tensor rate on H100"]),
        Case("DLRM FL15, 1 x V100 32GB (DGX-1), 64k, FP32", dlrm_fl15("fp32"), "p2res-v100", sxm2, 65536, 672e3,
             "samples/s", NVIDIA_DLRM),
        Case("DLRM FL15, 1 x V100 32GB (DGX-1), 64k, AMP", dlrm_fl15("bf16"), "p2res-v100", sxm2, 65536, 2.09e6,
             "samples/s", NVIDIA_DLRM, ["AMP is fp16: the V100's tensor rate, set as bf16 for the planner"]),
    ]


def predict(case: Case, budget: float) -> dict:
    hw = load_hardware(case.hardware, case.overrides)
    acc = table_access(case.model)
    res = search(case.model, hw, None, case.batch_per_rank, access=acc, time_budget_s=budget)
    step_us = res.best.iteration_us
    global_batch = case.batch_per_rank * hw.world_size
    pred_tput = global_batch / step_us * 1e6
    pub_tput = case.published if case.unit == "samples/s" else global_batch / (case.published * 1e-3)
    return {"case": case.name, "hardware": case.hardware, "overrides": case.overrides, "world": hw.world_size,
            "batch_per_rank": case.batch_per_rank, "dense_dtype": case.model.dense_dtype,
            "published": case.published, "unit": case.unit, "source": case.source, "notes": case.notes,
            "predicted_step_ms": step_us / 1e3, "published_step_ms": global_batch / pub_tput * 1e3,
            "predicted_samples_s": pred_tput, "published_samples_s": pub_tput,
            "ratio": pred_tput / pub_tput, "within_25pct": 0.8 <= pred_tput / pub_tput <= 1.25,
            "plan": res.best.label}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=5.0, help="planner search budget per case, seconds")
    ap.add_argument("--out", default=str(results_path("presets_published")))
    args = ap.parse_args()
    rows = []
    print(f"{'case':52s} {'published':>12s} {'predicted':>12s} {'pred/pub':>8s}  plan")
    for c in cases():
        r = predict(c, args.budget)
        rows.append(r)
        print(f"{r['case']:52s} {r['published_samples_s'] / 1e6:10.2f}M {r['predicted_samples_s'] / 1e6:10.2f}M "
              f"{r['ratio']:8.2f}  {r['plan']}", flush=True)
    doc = {"machine": {"node": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
           "goal": "predicted / published throughput in 0.8-1.25 for every case",
           "met": all(r["within_25pct"] for r in rows), "cases": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=float) + "\n")
    print(f"goal {'met' if doc['met'] else 'NOT met'}; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
