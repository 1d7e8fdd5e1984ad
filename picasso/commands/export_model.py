"""`picasso export-model`: a checkpoint's trained model as one safetensors file (executor.run.model_file)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("export-model", parents=[common],
                       help="write a checkpoint's trained model as one file of whole tables and dense weights")
    p.add_argument("checkpoint", help="checkpoint folder (from `picasso run --checkpoint`), or one of its versions")
    p.add_argument("-o", "--output", required=True,
                   help="model file to write (safetensors: `embedding_bags.<table>.weight` and `dense.*`)")
    p.add_argument("--plan", help="the plan the checkpoint was trained with: needed only for a checkpoint whose "
                                  "manifest does not carry its model spec")
    p.set_defaults(func=run)


def execute(args: argparse.Namespace):
    from executor.run.model_file import export
    from foundation.outputs import Outputs
    from planner.plan import Plan

    Outputs().read("CHECKPOINT", args.checkpoint).read("--plan", args.plan, beside=(".hot.npz",)).file("-o", args.output).check()
    return export(args.checkpoint, args.output, Plan.load(args.plan) if args.plan else None)


def run(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    done = execute(args)
    if args.json:
        print(json.dumps(asdict(done)))
        return 0
    e = done.last_eval
    trained = f"trained {done.steps:,} steps" + (
        f"; last evaluation AUC {e['auc']:.4f}, logloss {e['logloss']:.4f}" if e and e.get("auc") is not None else "")
    print(f"wrote {done.path}: model {done.model}, {done.tables} tables, {done.parameters:,} parameters, "
          f"{done.bytes / 2**20:,.1f} MiB ({trained})")
    return 0
