"""Measured peak memory per rank against the planner's prediction.

Runs the plans of a small `picasso validate` sweep (dlrm-criteo-kaggle capped at 50k rows,
1/2/4 ranks, per-rank batch 256-1024, --preload as validate runs them) and, with
--full-size, the planner's plan for the full-size model on 2 local-cpu ranks (20 steps),
each through `picasso run --json`, and prints measured / predicted per rank. The goal: every
ratio at most 1.15 (measured never more than 15% above the prediction).

    python bench/bench_memory.py [--plans 8] [--steps 4] [--full-size] [-o bench/results/memory/<machine>.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from results_path import results_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_plan(plan: Path, data: str, nproc: int, steps: int, preload: bool, extra: tuple[str, ...] = ()) -> dict:
    cmd = [sys.executable, "-m", "picasso", "run", str(plan), "--data", data, "--nproc", str(nproc),
           "--steps", str(steps), "--json", *(["--preload"] if preload else []), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["(no output)"])[-1]}
    pm = json.loads(proc.stdout[proc.stdout.index("{"):])["peak_memory"]
    if "predicted_bytes_per_rank_with_verify" in pm:  # rank 0 also holds --verify's reference
        pm["predicted_bytes_per_rank"] = pm["predicted_bytes_per_rank_with_verify"]
    return {k: pm[k] for k in ("measured_bytes_per_rank", "predicted_bytes_per_rank", "measured_over_predicted",
                               "by_component")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=int, default=8, help="plans of the validate sweep")
    ap.add_argument("--steps", type=int, default=4, help="steps per plan")
    ap.add_argument("--full-size", action="store_true", help="also the full-size plan on 2 ranks (20 steps, ~6 GB)")
    ap.add_argument("--work", help="folder for data and plans (default: a temporary one)")
    ap.add_argument("-o", "--output", default=str(results_path("memory")))
    args = ap.parse_args()

    from planner.access import table_access
    from planner.builders import build_sweep
    from planner.presets import get_model
    from simulator.calibration import spec_for_world
    from simulator.hardware import load_hardware
    from traces.synth import generate_criteo
    from validation.validate import machine

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "data.tsv"
    if not data.exists():
        generate_criteo(data, 200_000, seed=0)
    hw = load_hardware("local-cpu")
    model = get_model("dlrm-criteo-kaggle").with_row_cap(50_000)
    cases = build_sweep(model, table_access(model), lambda w: spec_for_world(hw, w), n_plans=args.plans)
    rows = []
    for i, case in enumerate(cases):
        path = work / f"{i:02d}-{case.name}.json"
        case.plan.save(path, hot_ids=case.hot_ids or None)
        r = run_plan(path, str(data), case.plan.world_size, args.steps, preload=True)
        rows.append({"plan": case.name, "world": case.plan.world_size, "batch": case.plan.batch_size_per_rank,
                     "steps": args.steps, **r})
        _print(rows[-1])
    if args.full_size:
        profile = work / "profile.json"
        subprocess.run([sys.executable, "-m", "picasso", "analyze", str(data), "--format", "criteo", "-o",
                        str(profile)], check=True, capture_output=True, cwd=ROOT)
        plan = work / "full.json"
        subprocess.run([sys.executable, "-m", "picasso", "plan", "--model", "dlrm-criteo-kaggle", "--hardware",
                        "local-cpu", "--set", "gpus_per_node=2", "--profile", str(profile), "-o", str(plan)],
                       check=True, capture_output=True, cwd=ROOT)
        r = run_plan(plan, str(data), 2, 20, preload=False)
        rows.append({"plan": "full-size dlrm-criteo-kaggle (planner)", "world": 2, "batch": 256, "steps": 20, **r})
        _print(rows[-1])
        # a checkpoint save, then a resume under --verify: neither may hold the whole model per rank
        ck = work / "ck"
        r = run_plan(plan, str(data), 2, 10, preload=False, extra=("--checkpoint", str(ck)))
        rows.append({"plan": "full-size, 10 steps + checkpoint save", "world": 2, "batch": 256, "steps": 10, **r})
        _print(rows[-1])
        r = run_plan(plan, str(data), 2, 10, preload=False, extra=("--resume", str(ck), "--verify"))
        rows.append({"plan": "full-size, resume + 10 steps --verify", "world": 2, "batch": 256, "steps": 10, **r})
        _print(rows[-1])
    ok = [x for x in rows if "error" not in x]
    worst = max((max(x["measured_over_predicted"]) for x in ok), default=None)
    result = {"bench": "memory", "machine": machine(), "goal": "measured / predicted <= 1.15 per rank",
              "worst_measured_over_predicted": worst, "plans": rows}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    print(f"worst measured/predicted {worst:.3f}; wrote {args.output}" if worst else f"wrote {args.output}")
    return 0


def _print(row: dict) -> None:
    if "error" in row:
        print(f"{row['plan']:<40} error: {row['error']}")
        return
    cells = ", ".join(f"{m / 2**20:.0f}/{p / 2**20:.0f} MiB ({r:.2f})" for m, p, r in
                      zip(row["measured_bytes_per_rank"], row["predicted_bytes_per_rank"], row["measured_over_predicted"]))
    print(f"{row['plan']:<40} measured/predicted per rank: {cells}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
