"""Hot-row gradient sync: sparse all-gather of the touched hot rows vs the dense all-reduce.

Where few hot rows are touched per step (large hot sets, small batches), the goal is
the sparse sync at least 2x cheaper than the dense one, at 2 and 4 gloo ranks. Both plans
(identical but for PackPlan.hot_sync) run in one process group, steps alternating, through
the real Trainer with op timing. The sync cost of a step is the sum of its ops that exist
for the hot rows' gradients and updates:
  dense:  bwd/dense/allreduce (dense + whole hot set) + opt/<pack>/hot_update (every hot row)
  sparse: bwd/dense/allreduce (dense only) + opt/<pack>/hot_sync (all-gather) + opt/<pack>/hot_update
The input copy (fwd/input/h2d) also zeroes the dense hot-gradient buffer; it is added for
both. Medians over the timed steps; the planner's choice (planner.lowering.hot_sync_costs
on the `local-cpu` hardware) is printed beside each measurement.

    python bench/bench_hot_sync.py [--steps 10] [--configs BATCH:HOT,...]

The last default config (a small hot set, a large batch: most hot rows touched each step)
is where the dense all-reduce should win, and the planner should pick it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from planner.sharding import Sharding

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_path import results_path  # noqa: E402

from executor.process.spawn import run_ranks  # noqa: E402
from planner.model_spec import ModelSpec, TableSpec  # noqa: E402
from planner.plan import OptimizerPlan, PackPlan, Plan  # noqa: E402

DIM = 32
SYNC_OPS = ("bwd/dense/allreduce", "hot_sync", "hot_update", "fwd/input/h2d")


def make_plan(world: int, batch: int, hot: int, hot_sync: str) -> tuple[dict, dict]:
    rows = max(hot, 1000)
    tables = (TableSpec("big", rows, DIM), TableSpec("small", 1000, DIM))
    model = ModelSpec("hot-sync-bench", "dlrm", 13, tables, bottom_mlp=(64, DIM), top_mlp=(64, 1))
    plan = Plan(model, world, batch, [PackPlan("pack0", ["big", "small"], Sharding.ROW_WISE, hot_sync=hot_sync)],
                hot_rows={"big": hot}, hot_ids_file="hot.npz", optimizer=OptimizerPlan("sgd", 0.05, "sgd", 0.05))
    return plan.to_dict(), {"big": np.arange(hot, dtype=np.int64)}


def worker(rank: int, world: int, configs: list[tuple[int, int]], steps: int) -> list[dict]:
    from executor.comm import Comm
    from executor.run.verify import local_rows, synthetic_global_batches
    from executor.step.timing import OpTimer
    from executor.step.trainer import Trainer

    torch.set_num_threads(1)
    comm = Comm()
    out = []
    for batch, hot in configs:
        runs = {}
        for mode in ("dense", "sparse"):
            d, ids = make_plan(world, batch, hot, mode)
            plan = Plan.from_dict(d)
            timer = OpTimer(rank, comm.device, enabled=True)
            runs[mode] = (plan, Trainer(plan, ids, comm, timer), timer)
        batches = synthetic_global_batches(runs["dense"][0], 4, seed=1)
        sync = {m: [] for m in runs}
        wall = {m: [] for m in runs}
        for s in range(steps + 2):
            for mode, (plan, tr, timer) in runs.items():  # alternate: the machine's load hits both
                comm.barrier()
                t0 = time.perf_counter()
                tr.step(local_rows(batches[s % 4], plan, rank))
                wall[mode].append(time.perf_counter() - t0)
                timer.flush(s)
                ev = [e for e in timer.timeline.events if e.args.get("step") == s]
                sync[mode].append(sum(e.dur_us for e in ev if any(k in e.name for k in SYNC_OPS)))
        out.append({"batch": batch, "hot": hot,
                    **{f"{m}_sync_us": statistics.median(v[2:]) for m, v in sync.items()},
                    **{f"{m}_step_ms": statistics.median(v[2:]) * 1e3 for m, v in wall.items()}})
        del runs
    return out


def predicted(world: int, batch: int, hot: int) -> dict[str, float]:
    from planner.lowering import hot_sync_costs, lower
    from simulator.hardware import load_hardware

    hw = load_hardware("local-cpu", [f"gpus_per_node={world}"])
    plan = Plan.from_dict(make_plan(world, batch, hot, "dense")[0])
    return hot_sync_costs(plan, lower(plan, hw, check_memory=False).packs[0], hw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--configs", default="32:200000,512:200000,32:1000000,512:1000000,4096:2000",
                    help="batch per rank : hot rows, comma-separated")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("-o", default=str(results_path("hot_sync")))
    a = ap.parse_args()
    configs = [(int(c.split(":")[0]), int(c.split(":")[1])) for c in a.configs.split(",")]
    rows = []
    print(f"{'ranks':>5} {'batch':>6} {'hot rows':>9} {'dense ms':>9} {'sparse ms':>10} {'ratio':>6} "
          f"{'step d/s ms':>13} {'planner picks':>13}")
    for world in (int(w) for w in a.worlds.split(",")):
        res = run_ranks(worker, world, configs, a.steps)
        for i, r0 in enumerate(res[0]):
            # a collective costs what its slowest rank waits: the max over ranks of each median
            d = max(r[i]["dense_sync_us"] for r in res) / 1e3
            s = max(r[i]["sparse_sync_us"] for r in res) / 1e3
            pred = predicted(world, r0["batch"], r0["hot"])
            pick = "sparse" if pred["sparse"] < pred["dense"] else "dense"
            row = {"ranks": world, "batch_per_rank": r0["batch"], "hot_rows": r0["hot"], "dim": DIM,
                   "dense_sync_ms": d, "sparse_sync_ms": s, "dense_over_sparse": d / s,
                   "dense_step_ms": r0["dense_step_ms"], "sparse_step_ms": r0["sparse_step_ms"],
                   "predicted_us": pred, "planner_picks": pick}
            rows.append(row)
            print(f"{world:>5} {r0['batch']:>6} {r0['hot']:>9} {d:>9.2f} {s:>10.2f} {d / s:>6.1f} "
                  f"{r0['dense_step_ms']:>6.1f}/{r0['sparse_step_ms']:<6.1f} {pick:>13}")
    result = {
        "bench": "hot_sync", "steps": a.steps, "results": rows,
        "machine": {"processor": platform.processor(), "machine": platform.machine(), "cpus": os.cpu_count(),
                    "torch": torch.__version__, "python": platform.python_version(),
                    "note": "shared machine under load from other work: absolute times are noisy; "
                            "dense and sparse alternate step by step in one process group, so ratios "
                            "are measured in one command"},
    }
    Path(a.o).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {a.o}")


if __name__ == "__main__":
    main()
