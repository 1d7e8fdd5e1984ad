"""`picasso simulate`: predict a plan's iteration on (what-if) hardware."""

from __future__ import annotations

import argparse

from foundation.flags import ROWS


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    from planner.modes import DenseDtype

    p = sub.add_parser("simulate", parents=[common], help="predict the timeline of a plan (what-if questions)")
    p.add_argument("plan", help="plan file from `picasso plan`")
    p.add_argument("--hardware", help="hardware preset or file (default: the one the plan was made for)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="hardware override, e.g. --set nic_bw=100Gbit/s (repeatable)")
    p.add_argument("--sweep", metavar="KEY=V1,V2,...", help="simulate once per value of one hardware key")
    p.add_argument("--profile", help="access profile (default: the plan's, else Zipf(1.05) per table)")
    p.add_argument("--scale-to", type=ROWS, metavar="ROWS", help="extrapolate the profile to this many rows first")
    p.add_argument("--dense-dtype", choices=DenseDtype.values(),
                   help="precision of the dense layers (default: the plan's model, else fp32)")
    p.add_argument("--engine", choices=("simpy", "fast"), default="simpy", help="simulation engine (default simpy)")
    p.add_argument("--trace", metavar="FILE", help="write the timeline as Chrome trace JSON (Perfetto)")
    p.add_argument("--html", metavar="FILE", help="write an HTML report with the timeline")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from foundation.outputs import Outputs
    from planner.errors import PlanError
    from planner.plan import Plan
    from planner.whatif import inputs_for, parse_sweep, predict, sweep, what_if
    from simulator.hardware import HardwareError

    Outputs().read("PLAN", args.plan, beside=(".hot.npz",)).read("--hardware", args.hardware).read(
        "--profile", args.profile, beside=(".npz",)).file("--trace", args.trace).file("--html", args.html).check()

    plan, hw, access = inputs_for(Plan.load(args.plan), args.hardware, args.set, args.profile, args.scale_to,
                                  args.dense_dtype, where=args.plan)
    if args.sweep:
        key, values = parse_sweep(args.sweep)
        points = sweep(plan, hw, access, key, values, args.engine)
        rows = [{key: p.value, **{k: v for k, v in asdict(p).items() if k != "value"}} for p in points]
        if args.html:
            from planner.report import write_sweep_html

            write_sweep_html(args.html, args.plan, key, rows)
        if args.json:
            print(json.dumps({"plan": args.plan, "sweep": key, "results": rows,
                              **({"html": args.html} if args.html else {})}, indent=1))
        else:
            print(f"{key:>16}  {'iteration (us)':>14}  {'samples/s':>12}  fits")
            for p in points:
                print(f"{p.value:>16}  {p.iteration_us:14.1f}  {p.samples_per_s:12.0f}  "
                      f"{'yes' if p.fits_in_memory else 'NO'}")
            if args.html:
                print(f"wrote {args.html} (report)")
        return 0

    ex = predict(plan, hw, access, args.engine)
    asked = [*([f"--hardware {args.hardware}"] if args.hardware else []), *args.set]
    change, no_change = None, None
    if asked:
        try:
            change = what_if(plan, ex, access, " ".join(asked), args.engine)
        except (HardwareError, PlanError) as exc:  # the plan names no hardware, or one this machine cannot load
            no_change = f"no what-if against the plan's own hardware: {exc}"
    d = ex.to_dict()
    d.pop("baselines_us"), d.pop("baseline_problems"), d.pop("speedups")
    d["fits_in_memory"] = ex.evaluation.lowered.memory.fits()
    d["memory_problem"] = ex.evaluation.lowered.memory.problem()
    d["hardware"] = hw.name
    if args.trace:
        ex.evaluation.result.timeline.save_chrome_trace(args.trace)
        d["trace"] = args.trace
    if args.html:
        from planner.report import write_plan_html

        write_plan_html(args.html, ex)
        d["html"] = args.html
    if change is not None:
        d["what_if"] = change.to_dict()
    elif no_change:
        d["what_if_note"] = no_change
    if args.json:
        print(json.dumps({"plan": args.plan, **d}, indent=1, default=float))
        return 0
    print(ex.text().split("\nspeedup over baselines")[0].rstrip("\n"))
    if change is not None:
        print(change.text())
    elif no_change:
        print(no_change)
    wrote = [f"{f} ({what})" for f, what in ((args.html, "report"), (args.trace, "trace")) if f]
    if wrote:
        print("wrote " + ", ".join(wrote))
    if d["memory_problem"]:
        print(f"warning: {d['memory_problem']}")
    return 0
