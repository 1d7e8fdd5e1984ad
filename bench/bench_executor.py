"""Executor throughput: the planner's plan vs the naive baseline, measured in one run.

On this machine with 2 and 4 gloo ranks, synthetic Criteo data (traces.synth), DLRM
(Criteo Kaggle preset, tables row-capped): the planner's plan for `local-cpu` and the
naive baseline (one table per pack, table-wise round-robin, no hot rows, k=1) are both
run through `picasso run`'s launcher (torchrun workers, data preloaded so parsing is not
timed). Reports samples/s, the planned/naive ratio (goal >= 2x) and measured/predicted.

    python bench/bench_executor.py [--rows 100000] [--cap 100000] [--batch 256] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_path import results_path  # noqa: E402

from executor.process.launch import launch  # noqa: E402
from executor.run.config import RunConfig  # noqa: E402
from planner.access import table_access  # noqa: E402
from planner.builders import naive_plan  # noqa: E402
from planner.plan import Prediction, atomic_write_bytes  # noqa: E402
from planner.presets import get_model  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000, help="synthetic Criteo rows")
    ap.add_argument("--cap", type=int, default=100_000, help="row cap of every table")
    ap.add_argument("--batch", type=int, default=256, help="batch size per rank")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--out", default=str(results_path("executor")))
    args = ap.parse_args(argv)

    from planner.search import evaluate, search
    from traces.profile import profile_file
    from traces.synth import generate_criteo

    model = get_model("dlrm-criteo-kaggle").with_row_cap(args.cap)
    rows_out = []
    with tempfile.TemporaryDirectory(prefix="bench-executor-") as tmp:
        data = Path(tmp) / "criteo.tsv"
        generate_criteo(data, args.rows, seed=1)
        profile = profile_file(data, "criteo")
        access = table_access(model, profile)
        for world in (int(w) for w in args.worlds.split(",")):
            hw = load_hardware("local-cpu", [f"gpus_per_node={world}"])
            found = search(model, hw, profile, args.batch, time_budget_s=20)
            planned = found.plan
            planned.save(Path(tmp) / f"planned{world}.json", hot_ids=found.hot_ids)
            base = naive_plan(model, world, args.batch, hw.name)
            ev = evaluate(base, hw, access, "simpy")
            base.prediction = Prediction(iteration_us=ev.iteration_us)
            base.save(Path(tmp) / f"naive{world}.json")
            row = {"world_size": world, "batch_per_rank": args.batch,
                   "planned_plan": {"label": planned.provenance.label, "micro_batches": planned.micro_batches,
                                    "kernel_interleaving": planned.kernel_interleaving,
                                    "packs": [[p.sharding, len(p.tables)] for p in planned.packs],
                                    "hot_rows": sum(planned.hot_rows.values())}}
            # the planned plan once more with per-op timing on (what --trace and validate run): its
            # step must stay within 10% of the untimed one
            for name in ("naive", "planned", "planned_op_timing"):
                t = time.perf_counter()
                plan_file = Path(tmp) / f"{name.replace('_op_timing', '')}{world}.json"
                res = launch(RunConfig(plan=str(plan_file), data=str(data), format="criteo", steps=args.steps,
                                       preload=True, warmup=4, op_timing=name.endswith("op_timing")))
                row[name] = {
                    "samples_per_s": res.samples_per_s,
                    "iteration_ms_p50": res.iteration_ms["p50"],
                    "iteration_ms_p90": res.iteration_ms["p90"],
                    "predicted_samples_per_s": res.predicted_samples_per_s,
                    "measured_over_predicted_samples": res.measured_over_predicted_samples,
                    "wall_s": round(time.perf_counter() - t, 1),
                }
            row["planned_over_naive_samples"] = row["planned"]["samples_per_s"] / row["naive"]["samples_per_s"]
            row["op_timing_over_untimed_step"] = (row["planned_op_timing"]["iteration_ms_p50"]
                                                  / row["planned"]["iteration_ms_p50"])
            rows_out.append(row)
    print(f"{'ranks':>5} {'plan':>8} {'samples/s':>10} {'p50 ms':>8} {'predicted':>10} {'meas/pred':>9}")
    for r in rows_out:
        for name in ("naive", "planned", "planned_op_timing"):
            x = r[name]
            pred = x["predicted_samples_per_s"]
            print(f"{r['world_size']:>5} {name:>8} {x['samples_per_s']:>10.0f} {x['iteration_ms_p50']:>8.1f} "
                  f"{(pred or 0):>10.0f} {(x['measured_over_predicted_samples'] or 0):>9.2f}")
        print(f"{r['world_size']:>5} planned/naive samples/s ratio: {r['planned_over_naive_samples']:.2f}x (goal >= 2x)")
        print(f"{r['world_size']:>5} step with per-op timing / untimed: {r['op_timing_over_untimed_step']:.2f} "
              "(goal <= 1.10)")
    out = {
        "bench": "executor",
        "machine": {"processor": platform.processor(), "machine": platform.machine(), "cpus": os.cpu_count(),
                    "torch": torch.__version__, "python": platform.python_version(),
                    "load_average_1m_at_end": os.getloadavg()[0]},
        "config": {"model": model.name, "rows": args.rows, "cap": args.cap, "batch_per_rank": args.batch,
                   "steps": args.steps, "data": "traces.synth.generate_criteo", "hardware": "local-cpu"},
        "results": rows_out,
    }
    atomic_write_bytes(Path(args.out), (json.dumps(out, indent=2) + "\n").encode())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
