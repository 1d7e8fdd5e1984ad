"""`picasso simulate`: predict a plan's iteration on (what-if) hardware."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("simulate", parents=[common], help="predict the timeline of a plan (what-if questions)")
    p.add_argument("plan", help="plan file from `picasso plan`")
    p.add_argument("--hardware", help="hardware preset or file (default: the one the plan was made for)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="hardware override, e.g. --set nic_bw=100Gbit/s (repeatable)")
    p.add_argument("--sweep", metavar="KEY=V1,V2,...", help="simulate once per value of one hardware key")
    p.add_argument("--profile", help="access profile (default: the plan's, else Zipf(1.05) per table)")
    p.add_argument("--scale-to", type=int, metavar="ROWS", help="extrapolate the profile to this many rows first")
    p.add_argument("--dense-dtype", choices=("fp32", "tf32", "bf16"),
                   help="precision of the dense layers (default: the plan's model, else fp32)")
    p.add_argument("--engine", choices=("simpy", "fast"), default="simpy", help="simulation engine (default simpy)")
    p.add_argument("--trace", metavar="FILE", help="write the timeline as Chrome trace JSON (Perfetto)")
    p.add_argument("--html", metavar="FILE", help="write an HTML report with the timeline")
    p.set_defaults(func=run)


def _sweep_values(text: str) -> tuple[str, list[str]]:
    from planner.errors import PlanError

    key, sep, vals = text.partition("=")
    values = [v.strip() for v in vals.split(",") if v.strip()]
    if not sep or not key.strip() or not values:
        raise PlanError(f"--sweep {text!r}: expected KEY=V1,V2,... e.g. nic_bw=25GB/s,50GB/s")
    return key.strip(), values


def run(args: argparse.Namespace) -> int:
    import json

    from foundation.files import check_distinct
    from planner.errors import PlanError
    from planner.explain import Explanation
    from planner.inputs import load_inputs
    from planner.plan import Plan
    from planner.search import evaluate, full_symmetry
    from simulator.hardware import apply_overrides

    check_distinct({"PLAN": args.plan, "--hardware": args.hardware, "--profile": args.profile},
                   {"--trace": args.trace, "--html": args.html})
    plan = Plan.load(args.plan)
    if args.dense_dtype:
        from dataclasses import replace

        plan.model = replace(plan.model, extra={**plan.model.extra, "dense_dtype": args.dense_dtype})
    hw_name = args.hardware or plan.hardware
    if not hw_name:
        raise PlanError(f"{args.plan}: the plan names no hardware; give --hardware")
    overrides = ([] if args.hardware else list(plan.provenance.hardware_overrides)) + list(args.set)
    profile_path = args.profile or plan.provenance.profile
    scale_to = args.scale_to or (plan.provenance.profile_scale_to if not args.profile else None)
    _, hw, _, access = load_inputs(plan.model, hw_name, overrides, profile_path, scale_to, None)

    def one(hw_) -> tuple[Any, dict]:
        ev = evaluate(plan, hw_, access, args.engine, full_symmetry(plan), "plan", check_memory=False)
        if ev.lowered is None:
            raise PlanError(ev.problem or "the plan cannot be simulated on this hardware")
        ex = Explanation(plan, ev, {})
        d = ex.to_dict()
        d.pop("baselines_us"), d.pop("baseline_problems"), d.pop("speedups")
        d["fits_in_memory"] = ev.lowered.memory.fits()
        d["memory_problem"] = ev.lowered.memory.problem()
        d["hardware"] = hw_.name
        return ex, d

    if args.sweep:
        key, values = _sweep_values(args.sweep)
        rows = []
        for v in values:
            hv = apply_overrides(hw, [f"{key}={v}"])
            _, d = one(hv)
            rows.append({key: v, "iteration_us": d["predicted_iteration_us"], "samples_per_s": d["samples_per_s"],
                         "fits_in_memory": d["fits_in_memory"]})
        if args.html:
            from planner.report import write_sweep_html

            write_sweep_html(args.html, args.plan, key, rows)
        if args.json:
            print(json.dumps({"plan": args.plan, "sweep": key, "results": rows,
                              **({"html": args.html} if args.html else {})}, indent=1))
        else:
            print(f"{key:>16}  {'iteration (us)':>14}  {'samples/s':>12}  fits")
            for r in rows:
                print(f"{r[key]:>16}  {r['iteration_us']:14.1f}  {r['samples_per_s']:12.0f}  "
                      f"{'yes' if r['fits_in_memory'] else 'NO'}")
        return 0

    ex, d = one(hw)
    if args.trace:
        ex.evaluation.result.timeline.save_chrome_trace(args.trace)
        d["trace"] = args.trace
    if args.html:
        from planner.report import write_plan_html

        write_plan_html(args.html, ex)
        d["html"] = args.html
    if args.json:
        print(json.dumps({"plan": args.plan, **d}, indent=1, default=float))
        return 0
    text = ex.text().split("\nspeedup over baselines")[0]
    print(text)
    if d["memory_problem"]:
        print(f"warning: {d['memory_problem']}")
    return 0
