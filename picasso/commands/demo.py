"""`picasso demo`: the main job on built-in synthetic Criteo data, end to end."""

from __future__ import annotations

import argparse

from foundation.flags import BATCH, REPEATS, ROWS, SEED, STEPS


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("demo", parents=[common], help="run the whole workflow on built-in synthetic data")
    p.add_argument("-o", "--out", default="picasso-demo", help="output folder (default: picasso-demo)")
    p.add_argument("--rows", type=ROWS, default=200_000, help="synthetic rows to generate")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--row-cap", type=ROWS, default=50_000, help="cap every table at N rows (CPU runs)")
    p.add_argument("--batch", type=BATCH, default=512, help="batch size per rank of the planned run")
    p.add_argument("--steps", type=STEPS, default=6, help="timed steps of each real run")
    p.add_argument("--run-repeats", type=REPEATS, default=2,
                   help="runs of the plan and each baseline, taking turns, then more while a comparison stays "
                        "inside the runs' spread")
    p.add_argument("--max-run-repeats", type=REPEATS, default=4, help="most runs of each")
    p.add_argument("--cluster-rows", type=ROWS, default=100_000,
                   help="rows of the skewed log planned for simulated GPU clusters")
    p.add_argument("--plans", type=REPEATS, default=9, help="plans in the small validation sweep (a third of them fit)")
    p.add_argument("--repeats", type=REPEATS, default=1, help="passes over the validation sweep (picasso validate --repeats)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from validation.demo import DemoConfig, run_demo, summary_lines

    summary = run_demo(DemoConfig(out=args.out, rows=args.rows, seed=args.seed, row_cap=args.row_cap,
                                  batch=args.batch, steps=args.steps, plans=args.plans, repeats=args.repeats,
                                  run_repeats=args.run_repeats, max_run_repeats=args.max_run_repeats,
                                  cluster_rows=args.cluster_rows, quiet=args.json))
    if args.json:
        print(json.dumps(summary, indent=1, default=str))
        return 0
    for line in summary_lines(summary):
        print(line)
    return 0
