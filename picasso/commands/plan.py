"""`picasso plan`: choose a training plan (or write a baseline) and explain it."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, NamedTuple

from foundation.flags import BATCH, ROWS, SECONDS

if TYPE_CHECKING:
    from planner.explain import Explanation
    from planner.plan import Plan


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    from planner.modes import DenseDtype

    p = sub.add_parser("plan", parents=[common], help="search a training plan for a model on a cluster")
    p.add_argument("--model", required=True, help="model preset (dlrm-criteo-kaggle, meta-856, ...) or YAML file")
    p.add_argument("--hardware", help="hardware preset (dgx-h100, p2res-v100, local-cpu, ...) or file (required "
                                      "unless --print-spec)")
    p.add_argument("--print-spec", action="store_true",
                   help="print the model's spec as YAML (a starting point for your own) and exit")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="hardware override, e.g. --set nodes=1 --set gpus_per_node=2 (repeatable)")
    p.add_argument("--profile", help="access profile from `picasso analyze` (default: Zipf(1.05) per table)")
    p.add_argument("--assume-zipf", action="store_true",
                   help="plan tables the profile has no feature for from an assumed Zipf(1.05) instead of refusing")
    p.add_argument("--scale-to", type=ROWS, metavar="ROWS",
                   help="extrapolate the profile to this many rows first (each table capped at its num_rows)")
    p.add_argument("-o", "--output", default="plan.json", help="plan file to write (default: plan.json)")
    p.add_argument("--baseline", help="write this baseline instead of searching: naive, torchrec-like, dp-hot-only, "
                                      "nvidia-dlrm, hugectr (the plans those systems run, scored on their engines' "
                                      "traits), torchrec (TorchRec's own planner; needs picasso[torchrec])")
    p.add_argument("--batch-size", type=BATCH, help="samples per rank per step (default: 4096 on GPUs, 256 on CPUs)")
    p.add_argument("--row-cap", type=ROWS, metavar="N", help="cap every table at N rows (for CPU runs)")
    p.add_argument("--micro-batches", help="micro-batch counts the search may use, e.g. 1,2,4 (default 1,2,4,8)")
    p.add_argument("--time-budget", type=SECONDS, default=20.0, help="search time budget in seconds (default 20)")
    p.add_argument("--dense-dtype", choices=DenseDtype.values(),
                   help="precision of the dense layers (default: the model's dense_dtype, else tf32 on "
                        "GPUs with TF32 tensor cores, fp32 elsewhere; fp32 asks for full-precision matmuls)")
    p.add_argument("--explain", action="store_true", help="print the per-pack table, time, memory and speedups")
    p.add_argument("--html", metavar="FILE", help="write an HTML report with the simulated timeline")
    p.add_argument("--trace", metavar="FILE", help="write the simulated timeline as Chrome trace JSON")
    p.set_defaults(func=run)


class Planned(NamedTuple):
    """What `picasso plan` made: the saved plan, its explanation, the search's summary."""

    plan: Plan
    explanation: Explanation
    search: dict | None
    assumed_zipf: bool  # planned without a profile
    torchrec: bool  # TorchRec is installed (its plan is one of the baselines)


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from planner.torchrec_bridge import torchrec_problem

    if args.print_spec:
        from planner.model_spec import spec_yaml
        from planner.presets import get_model

        print(spec_yaml(get_model(args.model)), end="")
        return 0
    plan, ex, search_info, assumed_zipf, has_tr = execute(args)
    out = {"plan": str(args.output), **ex.to_dict()}
    if search_info:
        out["search"] = search_info
    if args.html:
        out["html"] = str(args.html)
    if args.trace:
        out["trace"] = str(args.trace)
    if args.json:
        print(json.dumps(out, indent=1, default=float))
        return 0
    also = "".join(f", {f} ({what})" for f, what in ((args.html, "report"), (args.trace, "trace")) if f)
    if args.explain:
        print(ex.text())
        if not has_tr:
            print(f"torchrec baseline: n/a ({torchrec_problem()})")
        print(f"wrote {args.output}{also}")
    else:
        d = ex.to_dict()
        sp = ", ".join(f"{k} {v:.2f}x" for k, v in d["speedups"].items() if v)
        print(f"wrote {args.output}{also}: {len(plan.packs)} pack(s), predicted "
              f"{d['predicted_iteration_us']:.1f} us/step" + (f"; speedup {sp}" if sp else ""))
    if assumed_zipf:
        print("note: no --profile: every table's accesses are an assumed Zipf(1.05), not data", file=sys.stderr)
    if search_info:
        print(f"searched {search_info['candidates']} candidates in {search_info['elapsed_s']:.2f} s", file=sys.stderr)
    return 0


def execute(args: argparse.Namespace) -> Planned:
    """Search (or build the baseline), explain, and save the plan: the work of `picasso plan`
    and `picasso.plan`."""
    from foundation.progress import Progress
    from planner.builders import BASELINES, PEER_BASELINES, TORCHREC, baseline_plan
    from planner.errors import PlanError
    from planner.explain import explain
    from planner.inputs import load_inputs
    from planner.search import search

    if not args.hardware:
        raise PlanError("--hardware is required (a preset such as dgx-h100 or local-cpu, or a file)")
    from foundation.outputs import Outputs

    Outputs().read("--model", args.model).read("--hardware", args.hardware).read("--profile", args.profile, beside=(
        ".npz",)).file("-o", args.output, beside=(".hot.npz",)).file("--html", args.html).file("--trace", args.trace).check()
    model, hw, profile, access = load_inputs(args.model, args.hardware, args.set, args.profile, args.scale_to,
                                             args.row_cap, args.dense_dtype)
    sources = _check_profile(model, profile, args)
    batch = args.batch_size if args.batch_size is not None else 4096 if hw.kind == "gpu" else 256
    hot_ids = None
    search_info = None
    if args.baseline:
        if args.baseline not in (known := BASELINES + PEER_BASELINES + (TORCHREC,)):
            raise PlanError(f"--baseline {args.baseline!r}: expected one of {', '.join(known)}")
        plan = baseline_plan(args.baseline, model, hw.world_size, batch, hw, access)
        hot_ids = {t: access[t].hot_rows(n) for t, n in sorted(plan.hot_rows.items()) if n > 0} or None  # hybrid's
        evaluation = None
    else:
        mbs = _int_list(args.micro_batches, "--micro-batches") if args.micro_batches else None
        progress = Progress("planning", enabled=None if not args.json else False, unit="")
        kw = {"micro_batch_options": tuple(mbs)} if mbs else {}
        res = search(model, hw, profile, batch, access=access, time_budget_s=args.time_budget,
                     progress=progress, **kw)
        progress.close()
        plan, hot_ids, evaluation = res.plan, res.hot_ids, res.best
        search_info = {"elapsed_s": res.elapsed_s, "candidates": len(res.candidates), "chosen": res.best.label}
    plan.hardware = hw.name
    prov = plan.provenance
    if args.profile:
        from pathlib import Path

        prov.profile = str(Path(args.profile).resolve())
        prov.profile_scale_to = int(args.scale_to) if args.scale_to else None
    prov.row_cap = int(args.row_cap) if args.row_cap else None
    prov.hardware_overrides = list(args.set)
    from planner.torchrec_bridge import torchrec_available

    # with TorchRec installed, its own plan is a baseline beside the others
    has_tr = torchrec_available()
    ex = explain(plan, hw, access=access, evaluation=evaluation, baselines=BASELINES + ((TORCHREC,) if has_tr else ()),
                 sources=sources, peers=PEER_BASELINES if getattr(args, "explain", False) or getattr(args, "json", False) else ())
    from planner.plan import Prediction
    from planner.throughput import samples_per_s

    it = ex.evaluation.iteration_us
    fast = plan.prediction.fast_iteration_us if plan.prediction else None
    plan.prediction = Prediction(it, samples_per_s(plan, it), ex.evaluation.engine, fast, ex.speedups(),
                                 ex.cold_per_mb())
    plan.hot_ids = hot_ids or None
    if args.output:  # the API writes only when asked
        plan.save(args.output)
    if args.trace:
        ex.evaluation.result.timeline.save_chrome_trace(args.trace)
    if args.html:
        from planner.report import write_plan_html

        write_plan_html(args.html, ex)
    return Planned(plan, ex, search_info, profile is None, has_tr)


def _check_profile(model, profile, args: argparse.Namespace) -> dict[str, str]:
    """Refuse a profile that does not describe the model's tables (unless --assume-zipf);
    per table, where its access statistics come from."""
    import sys

    from planner.access import access_sources, unmatched_tables
    from planner.errors import PlanError

    sources = access_sources(model, profile, args.profile)
    if profile is None:
        return sources
    missing = unmatched_tables(model, profile)
    if missing and not args.assume_zipf:
        have = list(profile.features)
        raise PlanError(
            f"{args.profile}: no feature for {len(missing)} of {len(model.tables)} tables of {model.name} "
            f"({', '.join(missing[:6])}{', ...' if len(missing) > 6 else ''}); the profile has "
            f"{', '.join(have[:6])}{', ...' if len(have) > 6 else ''}. Profile the data this model trains on, name "
            "the tables after its features, or give --assume-zipf to plan them from an assumed Zipf(1.05)")
    if missing:
        print(f"warning: {len(missing)} table(s) planned from an assumed Zipf(1.05): {', '.join(missing[:6])}",
              file=sys.stderr)
    for w in profile.meta.get("warnings", []) if args.scale_to else []:
        print(f"warning: {w}", file=sys.stderr)
    return sources


def _int_list(text: str, flag: str) -> list[int]:
    from planner.errors import PlanError

    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PlanError(f"{flag} {text!r}: expected comma-separated integers") from None
    if not vals or min(vals) < 1:
        raise PlanError(f"{flag} {text!r}: expected positive integers")
    return vals
