"""`picasso demo`: the main job on built-in synthetic Criteo data, end to end."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("demo", parents=[common], help="run the whole workflow on built-in synthetic data")
    p.add_argument("-o", "--out", default="picasso-demo", help="output folder (default: picasso-demo)")
    p.add_argument("--rows", type=int, default=200_000, help="synthetic rows to generate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--row-cap", type=int, default=50_000, help="cap every table at N rows (CPU runs)")
    p.add_argument("--batch", type=int, default=512, help="batch size per rank of the planned run")
    p.add_argument("--steps", type=int, default=6, help="timed steps of each real run")
    p.add_argument("--run-repeats", type=int, default=3,
                   help="runs of the plan and of each baseline, taking turns: medians and their spread")
    p.add_argument("--plans", type=int, default=9, help="plans in the small validation sweep (a third of them fit)")
    p.add_argument("--repeats", type=int, default=2, help="passes over the validation sweep (picasso validate --repeats)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from validation.demo import DemoConfig, run_demo

    summary = run_demo(DemoConfig(out=args.out, rows=args.rows, seed=args.seed, row_cap=args.row_cap,
                                  batch=args.batch, steps=args.steps, plans=args.plans, repeats=args.repeats,
                                  run_repeats=args.run_repeats, quiet=args.json))
    if args.json:
        print(json.dumps(summary, indent=1, default=str))
        return 0
    print(f"picasso demo: done in {summary['seconds']:.0f} s; report: {summary['report']}")
    for k in ("predicted_speedup", "predicted_speedup_refit"):
        print(f"  {k.replace('_', ' ')}: " + ", ".join(f"{n} {v:.2f}x" for n, v in summary[k].items() if v))
    print(f"  {measured_line(summary)}")
    v = summary["validate"]
    print(f"  validation: {v['plans']} plans, MAPE {v['mape']:.1%}, Spearman {_three(v['spearman'])}")
    return 0


def measured_line(summary: dict) -> str:
    """The measured speedups with the runs' spread: a speedup within it, or over a plan whose runs
    disagree beyond the typical spread, says so."""
    spread, noisy = summary["measured_spread"], set(summary["noisy"])
    runs = len(summary["measured_runs_us"]["picasso"])
    parts = []
    for n, v in summary["measured_speedup"].items():
        note = [] if summary["measured_speedup_resolved"][n] else ["within noise"]
        note += [f"{x}'s runs disagree" for x in ("picasso", n) if x in noisy]
        parts.append(f"{n} {v:.2f}x (spread {spread[n]:.0%})" + (f" [{'; '.join(note)}]" if note else ""))
    return (f"measured speedup (median of {runs} runs; picasso's spread {spread['picasso']:.0%}, typical "
            f"{summary['typical_spread']:.0%}): " + ", ".join(parts))


def _three(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"
