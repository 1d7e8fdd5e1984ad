"""`picasso compare`: a finished run against its plan's prediction, step and largest ops."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from executor.run.result import RunResult
    from validation.compare import RunComparison


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("compare", parents=[common], help="compare a run's measured step with the plan's prediction")
    p.add_argument("plan", help="plan file the run trained")
    p.add_argument("result", help="the run's result: `picasso run ... --op-timing --json > FILE`")
    p.add_argument("--hardware", help="hardware preset or file (default: the one the plan was made for)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="hardware override (repeatable)")
    p.add_argument("--profile", help="access profile (default: the plan's)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    c = execute(args)
    print(json.dumps(c.to_dict(), indent=1) if args.json else c.text())
    return 0


def execute(args: argparse.Namespace) -> RunComparison:
    from executor.run.result import RunResult

    result = RunResult.load(args.result)
    return compare(args.plan, result, args.hardware, args.set, args.profile)


def compare(plan_path: str, result: RunResult, hardware: str | None = None, overrides: list[str] | tuple = (),
            profile: str | None = None) -> RunComparison:
    """The run against the plan predicted on its spec: `picasso compare` and `picasso.compare`."""
    from planner.plan import Plan
    from planner.whatif import inputs_for, predict
    from validation.compare import compare_run

    plan, hw, access = inputs_for(Plan.load(plan_path), hardware, overrides, profile, where=str(plan_path))
    ev = predict(plan, hw, access).evaluation
    return compare_run(result, ev.result.timeline, float(ev.iteration_us))
