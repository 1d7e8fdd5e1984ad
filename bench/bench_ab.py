"""This checkout's executor against another checkout's, on the same plans and data, in one
command: does a change to the executor make training faster here?

The model and data are bench_vs_torchrec's (DLRM, Criteo-like synthetic rows, 2 gloo ranks);
the plan is this checkout's planner's for each (dim, batch), saved once and run by both
checkouts' `picasso run --preload` (alternating which goes first; median of --repeats runs).
With --plan and --data (and --nproc) it runs that plan instead (e.g. bench_pooled_gloo's
4-rank DLRM-DCNv2 plan from its --work folder). Environment variants (--variant NAME=K=V) run
this checkout again with K=V set. Each run records samples/s, the CPU ms per step summed over
the ranks and the largest rank's peak RSS. `--name` names what is compared: the result goes
to bench/results/ab/<machine>-<name>.json.

    python bench/bench_ab.py --baseline /work/main [--dims 64] [--batches 2048] [--repeats 3]
    python bench/bench_ab.py --baseline /work/main --plan W/plan-picasso.json --data W/mh-ds --nproc 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_vs_torchrec import make_data, model_for, picasso_plan  # noqa: E402
from results_path import results_path  # noqa: E402
from torchrec_side import run_env  # noqa: E402


def run(root: Path, plan: Path, data: Path, steps: int, warmup: int, extra_env: dict[str, str],
        nproc: int = 2) -> dict:
    """One `picasso run` of `root`: samples/s, CPU ms per step summed over the ranks, peak RSS (MiB)."""
    cmd = [sys.executable, "-m", "picasso", "run", str(plan), "--data", str(data), "--nproc", str(nproc), "--steps",
           str(steps + warmup), "--warmup", str(warmup), "--json"]
    if data.is_file():  # a text file is parsed up front (a dataset folder is read as it goes)
        cmd.append("--preload")
    env = {**run_env(nproc), "PYTHONPATH": str(root), **extra_env}
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env=env)
    if p.returncode != 0:
        raise SystemExit(f"picasso run ({root}) failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
    res = json.loads(p.stdout[p.stdout.index("{"):])
    cpu = res.get("cpu_ms_per_step_per_rank")  # absent from checkouts before it was reported
    return {"samples_per_s": float(res["samples_per_s"]), "cpu_ms_per_step": sum(cpu) if cpu else None,
            "peak_mib": max(res["peak_memory"]["measured_bytes_per_rank"]) / 2**20}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=True, help="the other checkout (e.g. /work/main)")
    ap.add_argument("--dims", default="64")
    ap.add_argument("--batches", default="2048")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--variant", action="append", default=[], help="NAME=KEY=VALUE: this checkout with an env var")
    ap.add_argument("--plan", type=Path, help="run this plan (with --data) instead of bench_vs_torchrec's")
    ap.add_argument("--data", type=Path)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--name", help="what is compared (the result file's variant), e.g. grad-buckets")
    ap.add_argument("-o", "--output", help="result file (default: bench/results/ab/<machine>[-<name>].json)")
    args = ap.parse_args()
    if not (args.baseline / "executor").is_dir():
        raise SystemExit(f"--baseline {args.baseline}: not a picasso checkout (no executor/)")
    variants: dict[str, tuple[Path, dict[str, str]]] = {"before": (args.baseline, {}), "after": (ROOT, {})}
    for v in args.variant:
        name, _, kv = v.partition("=")
        key, _, value = kv.partition("=")
        if not name or not key:
            raise SystemExit(f"--variant {v!r}: expected NAME=KEY=VALUE")
        variants[name] = (ROOT, {key: value})
    if (args.plan is None) != (args.data is None):
        raise SystemExit("--plan and --data go together")
    from validation.validate import machine

    def compare(plan: Path, data: Path, nproc: int, key: dict) -> dict:
        runs: dict[str, list[dict]] = {n: [] for n in variants}
        for r in range(args.repeats):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for n in order:
                root, env = variants[n]
                runs[n].append(run(root, plan, data, args.steps, args.warmup, env, nproc))
            print(f"{key} run {r + 1}: " + "  ".join(
                f"{n} {runs[n][-1]['samples_per_s']:,.0f}"
                + (f" (cpu {runs[n][-1]['cpu_ms_per_step']:.1f} ms/step)" if runs[n][-1]["cpu_ms_per_step"] else "")
                for n in variants), flush=True)
        got = {n: [x["samples_per_s"] for x in v] for n, v in runs.items()}
        med = {n: statistics.median(v) for n, v in got.items()}
        # CPU per step (all ranks) where both sides report it: steadier than samples/s on shared cores
        cpu = {n: statistics.median([x["cpu_ms_per_step"] for x in v]) for n, v in runs.items()
               if all(x["cpu_ms_per_step"] for x in v)}
        peak = {n: max(x["peak_mib"] for x in v) for n, v in runs.items()}
        print(f"{key}: " + "  ".join(f"{n} {med[n]:,.0f}" for n in variants)
              + f"  after/before {med['after'] / med['before']:.3f}"
              + (f"  cpu after/before {cpu['after'] / cpu['before']:.3f}" if {"after", "before"} <= set(cpu) else "")
              + "  peak MiB " + " ".join(f"{n} {peak[n]:.0f}" for n in variants), flush=True)
        return {**key, "ranks": nproc, "samples_per_s": med, "runs": got, "after_over_before": med["after"] / med["before"],
                "cpu_ms_per_step": cpu, "cpu_runs": {n: [x["cpu_ms_per_step"] for x in v] for n, v in runs.items()},
                "peak_rss_mib": peak,
                **({"cpu_after_over_before": cpu["after"] / cpu["before"]} if {"after", "before"} <= set(cpu) else {}),
                **{f"{n}_over_before": med[n] / med["before"] for n in variants if n not in ("before", "after")}}

    rows = []
    if args.plan is not None:
        rows.append(compare(args.plan, args.data, args.nproc, {"plan_file": str(args.plan)}))
    else:
        with tempfile.TemporaryDirectory(prefix="bench-grad-overlap-") as tmp:
            batches = [int(b) for b in args.batches.split(",")]
            data = Path(tmp) / "data.tsv"
            make_data(data, 2 * max(batches) * (args.steps + args.warmup))
            for dim in (int(d) for d in args.dims.split(",")):
                for b in batches:
                    plan = Path(tmp) / f"plan-d{dim}-b{b}.json"
                    label = picasso_plan(model_for(dim), b, "local-cpu", plan)
                    rows.append(compare(plan, data, 2, {"dim": dim, "batch_per_rank": b, "plan": label}))
    out = {"bench": "ab", "name": args.name, "machine": machine(), "backend": "gloo", "steps": args.steps,
           "warmup": args.warmup, "repeats": args.repeats, "baseline": str(args.baseline),
           "note": "samples/s and CPU ms per step (summed over ranks), medians of runs; peak RSS the largest rank's "
                   "highest; timed runs alone on the machine (/work/bin/quiet-run)",
           "held_lock": os.environ.get("PICASSO_BENCH_LOCK_HELD") == "1", "results": rows}
    dest = Path(args.output) if args.output else results_path("ab", args.name)
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
