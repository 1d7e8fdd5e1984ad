"""Planner against TorchRec's own planner, scored by the same simulator.

For DLRM-DCNv2 (multi-hot) and DLRM Criteo Kaggle on three clusters -- the P2RES cluster
(p2res-v100), 4 x 8 H100 with 400 Gb/s per node, 16 x 8 H100 (dgx-h100, one 400 Gb/s NIC
per GPU) -- it records picasso's plan, TorchRec's plan (EmbeddingShardingPlanner on device
meta, scored as TorchRec runs it: fused per sharding type, owner-side pooling, pipelined
input exchange), torchrec-like, the embeddings-free bound, the planning times, each goal as an
iteration time, and the best plan's time if the GPUs computed for free (what the network
alone allows: when it is near the goal, no overlap of compute can reach it). Profile:
Zipf(1.05) per table (no measured profile of Criteo 1TB here). Needs TorchRec installed.

Run: python bench/bench_planner_torchrec.py [--out bench/results/planner_torchrec/<machine>.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_path import results_path  # noqa: E402

from planner.access import table_access  # noqa: E402
from planner.bounds import embedding_free_us  # noqa: E402
from planner.builders import baseline_plan  # noqa: E402
from planner.errors import PlanError  # noqa: E402
from planner.explain import Explanation  # noqa: E402
from planner.presets import get_model  # noqa: E402
from planner.search import evaluate, full_symmetry, search  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402

CLUSTERS = {
    "p2res": ("p2res-v100", []),
    "4x8-h100-400g-node": ("dgx-h100", ["nodes=4", "nic_per=node"]),
    "16x8-h100": ("dgx-h100", ["nodes=16"]),
}
GOALS = {"dlrm-dcnv2": {"p2res": 1.5, "4x8-h100-400g-node": 1.5, "16x8-h100": 1.5},
         "dlrm-criteo-kaggle": {"p2res": 1.5}}


def compute_free(hw):
    """`hw` with its GPUs' compute (FLOPs, HBM, kernel launches) made ~free: what the network
    alone allows."""
    gpu = replace(hw.gpu, flops={k: v * 1e4 for k, v in hw.gpu.flops.items()}, hbm_bw=hw.gpu.hbm_bw * 1e4,
                  launch_us=0.0)
    return replace(hw, gpu=gpu)


def case(model_name: str, cluster: str, batch: int, budget: float, plans_dir: str | None = None) -> dict:
    hw_name, over = CLUSTERS[cluster]
    model, hw = get_model(model_name), load_hardware(hw_name, over)
    acc = table_access(model)
    t0 = time.perf_counter()
    res = search(model, hw, None, batch, access=acc, time_budget_s=budget)
    ours_s = time.perf_counter() - t0
    try:
        tr = baseline_plan("torchrec", model, hw.world_size, batch, hw, acc)
        tr_ev = evaluate(tr, hw, acc, "simpy", full_symmetry(tr), "torchrec")
    except PlanError as exc:  # TorchRec not installed: its columns stay empty, the rest is scored
        if not str(exc).startswith("TorchRec is not installed"):
            raise
        tr, tr_ev = None, None
    like = baseline_plan("torchrec-like", model, hw.world_size, batch, hw, acc)
    like_ev = evaluate(like, hw, acc, "simpy", full_symmetry(like), "torchrec-like", fuse_table_wise=True)
    free = embedding_free_us(res.plan, hw, acc)
    ours = res.best.iteration_us
    # the best plan of picasso's space if the GPUs computed for free: the network's share of a goal
    net = search(model, compute_free(hw), None, batch, access=acc, time_budget_s=budget).best
    # why no plan of this shape is faster: the busiest resource and the ops that load it
    neck = Explanation(res.plan, res.best, hw=hw, access=acc).bottleneck()
    out = {
        "model": model_name, "cluster": cluster, "hardware": hw_name, "overrides": over, "world": hw.world_size,
        "batch_per_rank": batch, "ours_us": ours, "ours_label": res.best.label, "ours_planning_s": round(ours_s, 3),
        "torchrec_us": tr_ev.iteration_us if tr_ev else None, "torchrec_problem": tr_ev.problem if tr_ev else
        "TorchRec not installed",
        "torchrec_planning_s": tr.provenance.torchrec["planning_s"] if tr else None,
        "torchrec_sharding_types": tr.provenance.torchrec["sharding_types"] if tr else None,
        "torchrec_like_us": like_ev.iteration_us, "embedding_free_us": free,
        "compute_free_us": net.iteration_us, "compute_free_label": net.label,
        "ours_bottleneck": None if neck is None else {
            "resource": neck["resource"], "share_of_iteration": round(neck["share_of_iteration"], 3),
            "ops": {o["op"]: round(o["share"], 3) for o in neck["ops"]}},
    }
    for name in ("torchrec", "torchrec_like"):
        base = out[f"{name}_us"]
        out[f"speedup_{name}"] = base / ours if base else None
        out[f"bound_{name}"] = base / free if base else None
        # share of the way from 1x to the bound
        out[f"way_to_bound_{name}"] = ((base / ours - 1) / (base / free - 1)) if base and base > free else None
    if plans_dir is not None:  # the chosen plan, to score it again under another cost model
        res.plan.save(Path(plans_dir) / f"{model_name}-{cluster}.json")
    goal = GOALS.get(model_name, {}).get(cluster)
    if tr_ev is None:
        out["goal"], out["goal_us"], out["met"] = "needs TorchRec", None, None
    elif goal is None and model_name == "dlrm-criteo-kaggle":
        out["goal"] = "80% of the way to the bound over torchrec"
        out["goal_us"] = out["torchrec_us"] / (1 + 0.8 * (out["bound_torchrec"] - 1))
        out["met"] = bool(out["way_to_bound_torchrec"] is not None and out["way_to_bound_torchrec"] >= 0.8)
    else:
        out["goal"] = f">= {goal}x over torchrec"
        out["goal_us"] = out["torchrec_us"] / goal
        out["met"] = bool(out["speedup_torchrec"] and out["speedup_torchrec"] >= goal)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--budget", type=float, default=20.0)
    ap.add_argument("--out", default=str(results_path("planner_torchrec")))
    ap.add_argument("--plans-dir", help="also save each case's chosen plan (JSON) in this folder")
    args = ap.parse_args()
    if args.plans_dir:
        Path(args.plans_dir).mkdir(parents=True, exist_ok=True)
    rows = []
    for model_name in ("dlrm-dcnv2", "dlrm-criteo-kaggle"):
        for cluster in CLUSTERS:
            r = case(model_name, cluster, args.batch_size, args.budget, args.plans_dir)
            rows.append(r)
            print(f"{model_name:18s} {cluster:20s} ours {r['ours_us']:9.1f} us  torchrec {r['torchrec_us'] or 0:9.1f} us "
                  f"-> {r['speedup_torchrec'] or 0:.2f}x (bound {r['bound_torchrec'] or 0:.2f}x)  torchrec-like "
                  f"{r['speedup_torchrec_like'] or 0:.2f}x (bound {r['bound_torchrec_like'] or 0:.2f}x)  "
                  f"plan {r['ours_planning_s']:.2f} s vs TorchRec {r['torchrec_planning_s'] or 0:.2f} s  "
                  f"goal {r['goal']} ({r['goal_us'] or 0:.1f} us; compute free {r['compute_free_us']:.1f} us): "
                  f"{'n/a' if r['met'] is None else 'met' if r['met'] else 'NOT met'}  [{r['ours_label']}]", flush=True)
    doc = {"machine": {"node": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
           "lock": ("alone on the machine (exclusive lock held)" if os.environ.get("PICASSO_BENCH_LOCK_HELD")
                    else "not under the exclusive lock: other jobs may have run beside it"),
           "cases": rows}
    Path(args.out).write_text(json.dumps(doc, indent=1, default=float) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
