"""`picasso calibrate`: measure this machine and write a hardware spec for the simulator."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("calibrate", parents=[common],
                       help="microbenchmark this machine and fit the simulator's cost model")
    p.add_argument("-o", "--output", default="hardware.json", help="hardware spec to write (JSON or YAML)")
    p.add_argument("--nproc", type=int, default=2, help="ranks (worker processes) to calibrate for")
    p.add_argument("--base", default="local-cpu", help="hardware preset or file to start from")
    p.add_argument("--model", default="dlrm-criteo-kaggle", help="model preset whose MLP shapes are timed")
    p.add_argument("--quick", action="store_true", help="fewer sizes (for tests)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from foundation.files import check_output_path
    from picasso.workflows.calibrate import run_calibrate

    if args.nproc < 1:
        raise ValueError(f"--nproc must be at least 1, got {args.nproc}")
    check_output_path(args.output)  # before minutes of microbenchmarks, not after
    return run_calibrate(args)
