"""picasso vs TorchRec on CPUs: samples/s of the same DLRM on 2 gloo ranks, each with its own plan.

TorchRec 1.8 DistributedModelParallel with its own planner (EmbeddingShardingPlanner; on
CPU it offers table-wise and data-parallel and chooses) against `picasso run --preload`
with picasso's planner's plan, for dim 16 and 64 and per-rank batch 2048 and 8192. Runs
alternate (picasso, TorchRec, picasso, ...) within one command so that drift of a shared
machine hits both alike; each figure is the median of --repeats runs.

How the two sides are matched:
- model: DLRM, 13 dense features, 26 Criteo tables capped at 200k rows (dim D), bottom
  MLP 512-256-D, dot interaction, top MLP 512-512-256-1 (TorchRec's DLRM; picasso's
  dlrm-criteo-kaggle with those sizes);
- data: one synthetic Criteo file (`traces.synth`, Zipf(1.05) per feature, no missing
  values: one ID per feature). picasso reads it with its reader; TorchRec gets exactly the
  rows that reader produced (IDs % rows, log1p dense) as an .npz, in the same order, each
  rank the same slice of every global batch; both prepare every batch before timing;
- optimizer: row-wise Adagrad (lr 0.01, eps 1e-8) for the embeddings (picasso's
  rowwise_adagrad; TorchRec's RowWiseAdagrad fused into the backward), Adagrad (lr 0.01,
  eps 1e-8) for the dense layers. picasso's loss is the mean over the global batch,
  TorchRec's the mean over each rank's batch: gradients differ by a constant factor, to
  which Adagrad's update is invariant (up to eps);
- threads: OMP_NUM_THREADS = cores / ranks for both, passive OpenMP waits;
- timing: samples/s over the timed steps after --warmup steps, from the slowest rank.

Each setting also reports the dense ceiling (bench/dense_floor.py): the samples/s of 2 ranks
that ran nothing but the bottom and top MLPs' fp32 forward and backward, timed on one core in
the same command. No fp32 executor, TorchRec's or picasso's, can pass it here.

With --bf16, a third side runs the same picasso plan with dense_dtype bf16 (mixed precision:
bf16 autocast for the dense layers on a CPU with bf16 instructions, fp32 master weights,
gradients, optimizer state and tables; executor.dense.precision). It is reported on its own line
and never as the fp32 comparison: TorchRec runs fp32.

TorchRec is a benchmark dependency only: it lives in its own virtual environment (--venv;
created with the three pip commands below when missing), and its side runs as a
subprocess there (bench/torchrec_worker.py).

    python bench/bench_vs_torchrec.py [--venv DIR] [--quick] [--repeats 3] [-o bench/results/vs_torchrec/<machine>.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from dense_floor import dense_floor  # noqa: E402
from results_path import results_path  # noqa: E402
from torchrec_side import default_venv, ensure_venv, run_dmp, run_env, torchrec_rows  # noqa: E402

ROW_CAP = 200_000
LR, EPS = 0.01, 1e-8
ZIPF = 1.05


def model_for(dim: int):
    from planner.presets import get_model

    m = get_model("dlrm-criteo-kaggle").with_row_cap(ROW_CAP)
    tables = tuple(replace(t, dim=dim, optimizer="rowwise_adagrad") for t in m.tables)
    return replace(m, name=f"dlrm-criteo-kaggle@cap{ROW_CAP}-d{dim}", tables=tables, bottom_mlp=(512, 256, dim),
                   top_mlp=(512, 512, 256, 1), extra={**m.extra, "zipf_alpha": ZIPF})


def make_data(path: Path, rows: int) -> None:
    from planner.presets import get_model
    from traces.synth import generate_criteo

    cards = [min(t.num_rows, ROW_CAP) for t in get_model("dlrm-criteo-kaggle").tables]
    generate_criteo(path, rows, seed=0, cardinalities=cards, zipf_s=ZIPF, missing=0.0)


def bf16_plan(plan: Path) -> Path:
    """The same plan with the dense layers at bf16 (the model's extra.dense_dtype)."""
    p = json.loads(plan.read_text())
    p["model"]["extra"]["dense_dtype"] = "bf16"
    out = plan.with_name(plan.stem + "-bf16.json")
    out.write_text(json.dumps(p))
    return out


def picasso_plan(model, batch: int, hardware: str, path: Path) -> str:
    from planner.plan import OptimizerPlan
    from planner.search import search
    from simulator.hardware import load_hardware

    hw = load_hardware(hardware, ["gpus_per_node=2"] if hardware == "local-cpu" else [])
    res = search(model, hw, None, batch, time_budget_s=10.0)
    plan = res.plan
    plan.optimizer = OptimizerPlan("rowwise_adagrad", LR, "adagrad", LR, EPS)
    plan.hardware = hw.name
    plan.save(path, hot_ids=res.hot_ids or None)
    return res.best.label


def run_picasso(plan: Path, data: Path, steps: int, warmup: int, dense_dtype: str = "fp32") -> float:
    cmd = [sys.executable, "-m", "picasso", "run", str(plan), "--data", str(data), "--nproc", "2", "--steps",
           str(steps + warmup), "--warmup", str(warmup), "--preload", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=run_env(2))
    if p.returncode != 0:
        raise SystemExit(f"picasso run failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
    res = json.loads(p.stdout[p.stdout.index("{"):])
    if res.get("dense_dtype", "fp32") != dense_dtype:
        raise SystemExit(f"picasso ran its dense layers at {res.get('dense_dtype')}, expected {dense_dtype}")
    return float(res["samples_per_s"])


def run_torchrec(py: Path, npz: Path, model, batch: int, steps: int, warmup: int) -> dict:
    return run_dmp(py, npz, model, 2, batch, steps, warmup, LR, LR, EPS)


def main() -> int:
    ap = argparse.ArgumentParser(description="picasso vs TorchRec samples/s on 2 gloo ranks")
    ap.add_argument("--venv", type=Path, default=default_venv(), help="TorchRec's virtual environment (created if missing)")
    ap.add_argument("--dims", default="16,64")
    ap.add_argument("--batches", default="2048,8192", help="per-rank batch sizes")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each side per setting (median)")
    ap.add_argument("--steps", type=int, default=12, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--hardware", default="local-cpu", help="picasso planner's hardware (e.g. a calibrated spec)")
    ap.add_argument("--quick", action="store_true", help="check the pipeline: dim 16, batch 256, 2 steps, 1 run each")
    ap.add_argument("--bf16", action="store_true", help="also run picasso with bf16 dense layers (a separate line)")
    ap.add_argument("--work", type=Path, help="folder for data and plans (default: a temporary one)")
    ap.add_argument("-o", "--output", default=str(results_path("vs_torchrec")))
    args = ap.parse_args()
    if args.quick:
        args.dims, args.batches, args.repeats, args.steps, args.warmup = "16", "256", 1, 2, 1
    dims = [int(x) for x in args.dims.split(",")]
    batches = [int(x) for x in args.batches.split(",")]
    if args.repeats < 1 or args.steps < 1:
        raise SystemExit("--repeats and --steps must be at least 1")

    from validation.validate import machine

    py = ensure_venv(args.venv)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-vs-torchrec-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "data.tsv"
    need = 2 * max(batches) * (args.steps + args.warmup)
    make_data(data, need)
    settings = []
    for dim in dims:
        model = model_for(dim)
        npz = work / f"rows-d{dim}.npz"
        torchrec_rows(str(data), "criteo", model, npz)
        for b in batches:
            plan = work / f"plan-d{dim}-b{b}.json"
            label = picasso_plan(model, b, args.hardware, plan)
            settings.append({"dim": dim, "batch_per_rank": b, "model": model, "npz": npz, "plan": plan,
                             "picasso_plan": label, "picasso": [], "torchrec": [], "picasso_bf16": [],
                             "floor": dense_floor(dim, b, reps=3 if args.quick else 10)})
    for r in range(args.repeats):
        for s in settings:  # alternate the sides, and which goes first
            sides = ("picasso", "torchrec") if r % 2 == 0 else ("torchrec", "picasso")
            for side in sides + (("picasso_bf16",) if args.bf16 else ()):
                if side == "picasso_bf16":
                    s[side].append(run_picasso(bf16_plan(s["plan"]), data, args.steps, args.warmup, "bf16"))
                elif side == "picasso":
                    s["picasso"].append(run_picasso(s["plan"], data, args.steps, args.warmup))
                else:
                    tr = run_torchrec(py, s["npz"], s["model"], s["batch_per_rank"], args.steps, args.warmup)
                    s["torchrec"].append(tr["samples_per_s"])
                    s["torchrec_sharding"] = tr["sharding_types"]
            print(f"dim {s['dim']:>3} batch {s['batch_per_rank']:>5} run {r + 1}: picasso {s['picasso'][-1]:,.0f}  "
                  f"TorchRec {s['torchrec'][-1]:,.0f} samples/s"
                  + (f"  (picasso bf16 dense {s['picasso_bf16'][-1]:,.0f})" if args.bf16 else ""), flush=True)
    rows = []
    print(f"\n{'dim':>4} {'batch/rank':>10} {'TorchRec':>12} {'picasso':>12} {'ratio':>6}")
    for s in settings:
        tr, pc = statistics.median(s["torchrec"]), statistics.median(s["picasso"])
        rows.append({"dim": s["dim"], "batch_per_rank": s["batch_per_rank"], "torchrec_samples_per_s": tr,
                     "picasso_samples_per_s": pc, "picasso_over_torchrec": pc / tr, "torchrec_runs": s["torchrec"],
                     "picasso_runs": s["picasso"], "picasso_plan": s["picasso_plan"],
                     "torchrec_sharding": s.get("torchrec_sharding")})
        # the samples/s no fp32 executor can pass here: 2 ranks running only their MLPs' GEMMs
        ceiling = 2 * s["batch_per_rank"] / s["floor"]["floor_s"]
        rows[-1].update({"dense_floor": s["floor"], "dense_ceiling_samples_per_s": ceiling,
                         "dense_ceiling_over_torchrec": ceiling / tr, "goal_1_5x_below_ceiling": 1.5 * tr <= ceiling})
        print(f"{s['dim']:>4} {s['batch_per_rank']:>10} {tr:>12,.0f} {pc:>12,.0f} {pc / tr:>6.2f}"
              f"   MLPs alone {ceiling:,.0f} ({ceiling / tr:.2f}x TorchRec)")
        if args.bf16:  # its own line: picasso with bf16 dense layers against fp32 TorchRec
            bf = statistics.median(s["picasso_bf16"])
            rows[-1].update({"picasso_bf16_dense_samples_per_s": bf, "picasso_bf16_dense_over_torchrec_fp32": bf / tr,
                             "picasso_bf16_dense_runs": s["picasso_bf16"]})
            print(f"{'':>4} {'':>10} {'':>12} {bf:>12,.0f} {bf / tr:>6.2f}  picasso with bf16 dense layers (not fp32)")
    result = {"bench": "vs_torchrec", "machine": machine(), "quick": args.quick, "ranks": 2, "backend": "gloo",
              "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats, "row_cap": ROW_CAP,
              "zipf": ZIPF, "optimizer": {"embeddings": "rowwise adagrad", "dense": "adagrad", "lr": LR, "eps": EPS},
              "note": "timed runs alone on the machine (/work/bin/quiet-run); picasso_bf16_dense_* is picasso with "
                      "dense_dtype bf16 (mixed precision), not the fp32 comparison",
              "results": rows}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
