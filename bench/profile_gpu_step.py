"""Where one steady training step of a plan spends its GPU time: torch.profiler over the real
Trainer on one device, the top kernels by CUDA time, launches per step, and the same with the
torch kernels in place of the Triton ones (PICASSO_TRITON=0 semantics) for comparison.

    python bench/profile_gpu_step.py PLAN --data DATA.tsv [--steps 6] [-o OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from results_path import results_path  # noqa: E402

from executor.comm import Comm  # noqa: E402
from executor.data.batches import RawBatch, feature_map, reader_chunks, to_batch  # noqa: E402
from executor.sparse import syncfree  # noqa: E402
from executor.step.trainer import Trainer  # noqa: E402
from planner.plan import Plan  # noqa: E402


def profile(plan_path: Path, data: Path, steps: int, triton: bool, top: int) -> dict:
    plan = Plan.load(plan_path)
    dev = torch.device("cuda")
    b = plan.batch_size_per_rank
    raw = next(iter(reader_chunks(str(data), "criteo")))
    while len(raw) < b:
        raw = RawBatch.concat([raw, raw])
    batch = to_batch(raw.slice(0, b), plan.model, feature_map(plan.model, raw.sparse)).to(dev)
    syncfree._tbe_tried, syncfree._tbe_reason = (False, None) if triton else (True, "off for the comparison")
    tr = Trainer(plan, plan.load_hot_ids(str(plan_path)), Comm(dev))
    for _ in range(5):
        tr.step(batch)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(steps):
            tr.step(batch)
        torch.cuda.synchronize()
    kernels = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    rows = {}
    for e in kernels:
        r = rows.setdefault(e.name[:90], [0, 0.0])
        r[0] += 1
        r[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    table = sorted(((n, c / steps, us / steps / 1e3) for n, (c, us) in rows.items()), key=lambda r: -r[2])
    total_ms = sum(r[2] for r in table)
    print(f"==== {'triton' if triton else 'torch'} kernels: {total_ms:.2f} ms of GPU kernels per step, "
          f"{len(kernels) / steps:.0f} launches per step (batch {b})")
    for name, calls, ms in table[:top]:
        print(f"{ms:9.3f} ms {calls:6.1f}x  {name}")
    return {"triton": triton, "batch": b, "kernel_ms_per_step": total_ms, "launches_per_step": len(kernels) / steps,
            "top": [{"kernel": n, "calls_per_step": c, "ms_per_step": ms} for n, c, ms in table[:top]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan", type=Path)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_gpu_step: needs a CUDA device")
    out = {"device": torch.cuda.get_device_name(0), "plan": str(args.plan),
           "runs": [profile(args.plan, args.data, args.steps, t, args.top) for t in (True, False)]}
    (args.output or results_path("profile_gpu_step")).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
