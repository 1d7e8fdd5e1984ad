"""`picasso validate`: run a sweep of plans for real and compare with the simulator's predictions."""

from __future__ import annotations

import argparse

from foundation.flags import RANKS, REPEATS, ROWS, SECONDS, STEPS, Real, Whole


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("validate", parents=[common],
                       help="run varied plans for real and measure the simulator's error")
    p.add_argument("--data", help="click log to train on (and to profile); required unless --replay")
    p.add_argument("--format", default="criteo", help="data format (default: criteo)")
    p.add_argument("--hardware", default="local-cpu",
                   help="hardware spec: `picasso calibrate` output, a preset or a file")
    p.add_argument("--model", default="dlrm-criteo-kaggle", help="model preset")
    p.add_argument("--row-cap", type=ROWS, default=50_000, help="cap every table at N rows (CPU runs)")
    p.add_argument("--plans", type=REPEATS, default=28, help="plans in the sweep (validated plus fit)")
    p.add_argument("--fit-plans", type=Whole(0, 1 << 16, "a plan count"), default=8,
                   help="of the plans, K (every n-th) form a disjoint fit set: per-op-class coefficients "
                        "are fitted on them before the others are validated (0: microbenchmarks only); where "
                        "a world size lacks a batch size among them, a plan of that pair joins the fit set "
                        "and one more plan joins the sweep")
    p.add_argument("--nproc-max", type=RANKS, default=4, help="largest world size in the sweep")
    p.add_argument("--batch-sizes", default="256,512,1024", help="batch sizes per rank, comma-separated")
    p.add_argument("--steps", type=STEPS, default=8, help="timed steps per plan, at least")
    p.add_argument("--timed-seconds", type=Real(0.0, 7 * 86400.0, what="seconds"), default=1.0,
                   help="more timed steps, up to --max-steps, until a plan's predicted timed window is this long "
                        "(0: --steps exactly)")
    p.add_argument("--max-steps", type=STEPS, default=40, help="timed steps per plan, at most")
    p.add_argument("--warmup", type=Whole(0, 1 << 40, "a step count"), default=2, help="warm-up steps per plan (not timed)")
    p.add_argument("--repeats", type=REPEATS, default=2,
                   help="passes over the sweep: each plan runs once per pass, its iteration is the passes' mean")
    p.add_argument("--run-timeout", type=SECONDS, default=300.0, help="seconds one run may take")
    p.add_argument("--no-planner", action="store_true", help="leave the planner's own plan out of the sweep")
    p.add_argument("--variants", default="none", choices=("none", "gpu"),
                   help="gpu: cycle the plans through fp32/tf32/bf16 dense layers, 16-bit tables and host rows")
    p.add_argument("-o", "--out-dir", default="picasso-validate", help="folder for plans, traces and results")
    p.add_argument("--html", help="write an HTML report here")
    p.add_argument("--save-refined", help="with --fit-plans: write the refined hardware spec here")
    p.add_argument("--results", help="also write the JSON result here (e.g. bench/results/validate_local_cpu.json)")
    p.add_argument("--replay", metavar="DIR",
                   help="run nothing: refit --hardware on the fit plans a finished sweep saved in DIR (its -o) "
                        "and predict its validated plans from their saved measurements")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from simulator.report import write_page, write_report
    from validation.report import validation_sections
    from validation.validate import ValidateConfig, json_default, run_validate, spearman_text, sweep_outputs
    from validation.variants import PlanVariants

    if args.replay:
        return _replay(args)
    if not args.data:
        raise ValueError("--data is required (unless --replay DIR)")
    try:
        batches = tuple(int(b) for b in str(args.batch_sizes).split(",") if b.strip())
    except ValueError:
        raise ValueError(f"--batch-sizes {args.batch_sizes!r}: expected integers separated by commas") from None
    cfg = ValidateConfig(
        data=args.data, format=args.format, hardware=args.hardware, model=args.model, row_cap=args.row_cap or None,
        plans=args.plans, fit_plans=args.fit_plans, nproc_max=args.nproc_max, batch_sizes=batches, steps=args.steps,
        timed_seconds=args.timed_seconds, max_steps=args.max_steps, warmup=args.warmup, repeats=args.repeats,
        run_timeout=args.run_timeout, include_planner=not args.no_planner, out_dir=args.out_dir,
        save_refined=args.save_refined, variants=PlanVariants.from_str(args.variants, "--variants"))
    cfg.check()  # flags, then outputs, before any run
    sweep_outputs(cfg, None, args.html, args.results, args.hardware, args.save_refined).check()
    log = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    result, runs = run_validate(cfg, log)
    text = json.dumps(result, indent=1, default=json_default)
    if args.results:
        write_report(args.results, text)
    if args.html:
        secs = validation_sections(result, runs)
        write_page(args.html, "picasso validate", secs, side_by_side=[len(secs) - 1])
    if args.json:
        print(text)
        return 1 if result["failed"] else 0
    s = result["summary"]
    print(f"{'plan':<34} {'role':<8} {'measured ms':>11} {'predicted ms':>12} {'error':>8}")
    for r in result["per_plan"]:
        print(f"{r['name']:<34} {r['role']:<8} {r['measured_us'] / 1e3:11.2f} {r['predicted_us'] / 1e3:12.2f} "
              f"{r['error']:+8.1%}")
    print(f"validated plans: {s['plans']}  MAPE {s['mape']:.1%}  Spearman {spearman_text(s)}  "
          f"goal {'met' if result['goal']['met'] else 'not met'} (MAPE <= 10%, Spearman >= 0.9)")
    if "microbench_only" in result:
        mb = result["microbench_only"]
        print(f"microbenchmark calibration only: MAPE {mb['mape']:.1%}  Spearman {spearman_text(mb)}")
    if (choice := result.get("refit", {}).get("choice")) is not None:
        print(f"rates kept: {choice['kept']} ({choice['why']})")
    print(f"results in {cfg.out_dir}/validate.json" + "".join(
        f", {what} {f}" for f, what in ((args.results, "copy"), (args.html, "report"),
                                         (args.save_refined, "refined hardware spec")) if f))
    for f in result["failed"]:
        print(f"FAILED {f['name']}: {f['error']}", file=sys.stderr)
    return 1 if result["failed"] else 0


def _replay(args: argparse.Namespace) -> int:
    """`--replay DIR`: the refit and the predictions again, from a finished sweep's saved runs."""
    import json

    from simulator.hardware import load_hardware
    from simulator.report import write_page, write_report
    from validation.replay import replay as replay_sweep
    from validation.report import replay_sections
    from validation.validate import json_default, spearman_text, sweep_outputs

    sweep_outputs(None, args.replay, args.html, args.results, args.hardware, args.save_refined).check()
    out = replay_sweep(args.replay, load_hardware(args.hardware))
    refined = out.pop("refined")
    if args.save_refined:
        refined.save(args.save_refined)
    if args.results:
        write_report(args.results, json.dumps(out, indent=1, default=json_default))
    if args.html:
        write_page(args.html, "picasso validate --replay", replay_sections(out, args.replay))
    if args.json:
        print(json.dumps(out, indent=1, default=json_default))
        return 0
    print(f"{'plan':<34} {'role':<8} {'measured ms':>11} {'predicted ms':>12} {'error':>8}")
    for r in out["per_plan"]:
        print(f"{r['name']:<34} {r['role']:<8} {r['measured_us'] / 1e3:11.2f} {r['predicted_us'] / 1e3:12.2f} "
              f"{r['error']:+8.1%}")
    s = out["summary"]
    by_world = ", ".join(f"{w} rank(s) {v['mape']:.1%}" for w, v in out["summary_by_world"].items())
    print(f"validated plans: {s['plans']}  MAPE {s['mape']:.1%}  Spearman {spearman_text(s)}  "
          f"({by_world}; replayed from {args.replay}, nothing run)")
    if args.save_refined:
        print(f"wrote {args.save_refined} (refined hardware spec)")
    return 0
