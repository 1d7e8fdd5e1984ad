"""`picasso export --torchrec`: a picasso plan as TorchRec sharding choices."""

from __future__ import annotations

import argparse

from foundation.flags import Whole


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("export", parents=[common], help="write a plan's sharding in TorchRec's terms")
    p.add_argument("plan", help="plan JSON (from `picasso plan`)")
    p.add_argument("--torchrec", action="store_true", required=True,
                   help="per table: sharding type, compute kernel, ranks and shards (ParameterConstraints / "
                        "ShardingPlan), and what TorchRec cannot express")
    p.add_argument("-o", "--output", required=True, help="JSON file to write")
    p.add_argument("--gpus-per-node", type=Whole(1, 1 << 10, "a GPU count"), default=8, help="local world size for the shard devices (default 8)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from foundation.outputs import Outputs
    from planner.plan import Plan, atomic_write_bytes
    from planner.torchrec_bridge import torchrec_available, torchrec_sharding

    Outputs().read("PLAN", args.plan, beside=(".hot.npz",)).file("-o", args.output).check()
    plan = Plan.load(args.plan)
    neutral, lost = torchrec_sharding(plan)
    doc = {
        "format": "picasso-torchrec-export/1",
        "world_size": plan.world_size,
        "batch_size_per_rank": plan.batch_size_per_rank,
        # ParameterConstraints(sharding_types=[...], compute_kernels=[...]) per table: TorchRec's
        # planner then places the tables itself; sharding_plan fixes ranks and shards as well
        "parameter_constraints": {t: {"sharding_types": [d["sharding_type"]], "compute_kernels": [d["compute_kernel"]]}
                                  for t, d in neutral.items()},
        "sharding_plan": neutral,
        "not_expressed": lost,
    }
    if torchrec_available():  # check that TorchRec accepts what was written
        from planner.torchrec_bridge import to_torchrec_objects

        to_torchrec_objects(neutral, args.gpus_per_node)
    atomic_write_bytes(args.output, (json.dumps(doc, indent=1) + "\n").encode())
    if args.json:
        print(json.dumps({"output": args.output, "tables": len(neutral), "not_expressed": lost}))
        return 0
    print(f"wrote {args.output}: {len(neutral)} table(s) as TorchRec sharding"
          + ("" if torchrec_available() else " (TorchRec not installed: not checked by TorchRec)"))
    for line in lost:
        print(f"  not expressed: {line}")
    return 0
