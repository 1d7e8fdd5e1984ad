"""Host time against GPU time of one rank's training step, eager and as a replayed CUDA graph.

For a plan on one GPU: the Trainer's step called back to back (no synchronisation between
steps), timed per step on the host (perf_counter around the call) and on the GPU (events
around it); then the same steps through executor.run.cuda_graph's GraphStep. A step whose host
time exceeds its GPU time is bound by launches and Python; the graph removes that.

    python bench/step_overhead_gpu.py PLAN --data DATA.tsv [--steps 20] [-o OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from results_path import results_path  # noqa: E402

from executor.comm import Comm  # noqa: E402
from executor.data.batches import RawBatch, feature_map, reader_chunks, to_batch  # noqa: E402
from executor.run.cuda_graph import GraphStep  # noqa: E402
from executor.step.trainer import Trainer  # noqa: E402
from planner.plan import Plan  # noqa: E402


def measure(step, batch, steps: int) -> dict:
    for _ in range(5):
        step(batch)
    torch.cuda.synchronize()
    host, spans = [], []
    for _ in range(steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        t = time.perf_counter()
        step(batch)
        host.append((time.perf_counter() - t) * 1e3)
        b.record()
        spans.append((a, b))
    torch.cuda.synchronize()
    gpu = [a.elapsed_time(b) for a, b in spans]
    return {"host_ms_p50": statistics.median(host), "gpu_ms_p50": statistics.median(gpu),
            "samples_per_s": len(batch) * steps / (sum(gpu) * 1e-3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan", type=Path)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    plan = Plan.load(args.plan)
    dev = torch.device("cuda")
    raw = next(iter(reader_chunks(str(args.data), "criteo")))
    while len(raw) < plan.batch_size_per_rank:
        raw = RawBatch.concat([raw, raw])
    batch = to_batch(raw.slice(0, plan.batch_size_per_rank), plan.model, feature_map(plan.model, raw.sparse)).to(dev)
    out = {"device": torch.cuda.get_device_name(0), "batch": plan.batch_size_per_rank}
    tr = Trainer(plan, plan.load_hot_ids(args.plan), Comm(dev))
    out["eager"] = measure(tr.step, batch, args.steps)
    said: list[str] = []
    g = GraphStep(Trainer(plan, plan.load_hot_ids(args.plan), Comm(dev)), say=said.append)
    out["graph"] = measure(g.step, batch, args.steps)
    out["graph"]["captured"] = g.graph is not None
    out["graph"]["said"] = said
    print(json.dumps(out, indent=1))
    (args.output or results_path("step_overhead_gpu", f"b{plan.batch_size_per_rank}")).write_text(
        json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
