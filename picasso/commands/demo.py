"""`picasso demo`: the main job on built-in synthetic Criteo data, end to end."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("demo", parents=[common], help="run the whole workflow on built-in synthetic data")
    p.add_argument("-o", "--out", default="picasso-demo", help="output folder (default: picasso-demo)")
    p.add_argument("--rows", type=int, default=200_000, help="synthetic rows to generate")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from picasso.workflows.demo import run_demo

    return run_demo(args)
