"""`picasso demo`: the whole workflow on built-in synthetic Criteo data, one HTML report.

Stages, in order: synth -> analyze -> calibrate -> plan -> simulate -> run -> validate ->
report. A stage that fails stops the demo with one line naming the stage; nothing is
skipped silently.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from foundation.files import atomic_write_text
from foundation.outputs import Outputs, holds_document, mark
from planner.access import table_access
from planner.builders import BASELINES, baseline_plan
from planner.explain import explain
from planner.plan import Plan
from planner.presets import get_model
from planner.search import search
from simulator.calibration import spec_for_world
from simulator.export import timeline_figure
from simulator.hardware import load_hardware
from simulator.measured import one_step
from simulator.report import (
    Section,
    bar_figure,
    bold,
    coverage_figure,
    markup,
    paragraph,
    table_html,
    tag,
    write_page,
)
from traces.profile import profile_file
from traces.synth import generate_criteo
from validation.calibrate import CalibrateConfig, calibrate
from validation.compare import predict
from validation.measure import Measured, merge_passes, run_measured
from validation.repeats import Repeated, measure_interleaved, noisy, speedup, typical_spread
from validation.report import validation_sections
from validation.validate import ValidateConfig, json_default, run_validate

MODEL = "dlrm-criteo-kaggle"
WORLD = 2
COVERAGE_FEATURES = 8  # curves drawn: the largest tables
QUALITY_STEPS, QUALITY_EVERY, QUALITY_ROWS = 40, 8, 20_000  # the quality stage: a short training run


@dataclass
class DemoConfig:
    """The parameters of the demo (`picasso demo`'s flags)."""

    out: str = "picasso-demo"
    rows: int = 200_000  # synthetic rows
    seed: int = 0
    row_cap: int = 50_000  # every table capped at this many rows (CPU runs)
    batch: int = 512  # per rank, of the planned run
    steps: int = 6  # timed steps of each real run
    # in the small validation sweep (a third of them fit); with the run stage's 4 plans x 3 runs the demo
    # launches about 30 rank groups, each a few seconds of start-up on a CPU machine
    plans: int = 9
    repeats: int = 2  # passes over the validation sweep
    run_repeats: int = 3  # runs of the plan and of each baseline, taking turns (validation.repeats)
    quiet: bool = False  # no progress lines (--json)

    def check(self) -> None:
        for name in ("rows", "row_cap", "batch", "steps", "plans", "repeats", "run_repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")


DEMO_KIND = "demo"


def _is_demo_folder(path: Path) -> bool:
    """A demo folder picasso wrote before folders carried a marker: its demo.json says so."""
    return holds_document(path, "demo.json", "demo summary", lambda d: "stages" in d)


class DemoError(RuntimeError):
    """A demo stage failed; the message names the stage."""


class Stages:
    """Runs stages in order, timing each; a failure becomes one DemoError line."""

    def __init__(self, quiet: bool = False) -> None:
        self.times: list[dict[str, Any]] = []
        self.quiet = quiet
        self.t0 = time.perf_counter()

    def log(self, msg: str) -> None:
        if not self.quiet:
            print(msg, file=sys.stderr, flush=True)

    @contextmanager
    def stage(self, name: str, what: str) -> Iterator[None]:
        self.log(f"demo [{name}] {what} ...")
        t = time.perf_counter()
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - every failure stops the demo, named
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DemoError(f"stage {name} failed: {first}") from exc
        dt = time.perf_counter() - t
        self.times.append({"stage": name, "what": what, "seconds": round(dt, 2)})
        self.log(f"demo [{name}] done in {dt:.1f} s")


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    """Every stage (see the module docstring); returns the summary it also writes to demo.json."""
    cfg.check()
    Outputs().folder("-o", cfg.out, DEMO_KIND, legacy=_is_demo_folder).check()
    out = mark(cfg.out, DEMO_KIND)
    st = Stages(cfg.quiet)
    rows, seed, row_cap, batch, steps, n_plans = cfg.rows, cfg.seed, cfg.row_cap, cfg.batch, cfg.steps, cfg.plans
    ctx: dict[str, Any] = {}

    data = out / "data.tsv"
    with st.stage("synth", f"{rows:,} synthetic Criteo rows"):
        generate_criteo(data, rows, seed=seed)

    with st.stage("analyze", "access profile of every feature"):
        profile = profile_file(data, "criteo", batch_size=batch * WORLD)
        profile.save(out / "profile.json")
        ctx["profile"] = profile

    with st.stage("calibrate", f"microbenchmarks at 1 and {WORLD} ranks, least-squares fit"):
        hw_cal, cal_report = calibrate(CalibrateConfig(nproc=WORLD, quick=True), st.log)
        hw_cal.save(out / "hardware.json")
        ctx["calibration"] = {k: v for k, v in cal_report.items() if k not in ("samples",)}

    with st.stage("plan", f"search on the calibrated machine, {WORLD} ranks, tables capped at {row_cap:,} rows"):
        model = get_model(MODEL).with_row_cap(row_cap)
        hw = spec_for_world(hw_cal, WORLD)
        access = table_access(model, profile)
        res = search(model, hw, access=access, batch_size_per_rank=batch, time_budget_s=15.0)
        plan = res.plan
        plan_path = out / "plan.json"
        plan.save(plan_path, hot_ids=res.hot_ids or None)
        expl = explain(plan, hw, access=access)
        ctx.update(plan=plan, hot_ids=res.hot_ids, explanation=expl, access=access, hw=hw, model=model)

    with st.stage("simulate", "the plan and the baselines, discrete-event engine"):
        predicted = {"picasso": predict(plan, hw, access=access, engine="simpy")}
        base_plans = {}
        for name in BASELINES:
            bp = baseline_plan(name, model, WORLD, batch, hw=hw, access=access)
            bpath = out / f"baseline-{name}.json"
            bp.save(bpath)
            base_plans[name] = bpath
            predicted[name] = predict(bp, hw, access=access, engine="simpy")
        predicted["picasso"].timeline.save_chrome_trace(out / "plan.simulated.trace.json")
        ctx["predicted"] = predicted

    with st.stage("run", f"the plan and the baselines for real on {WORLD} gloo ranks, "
                         f"{cfg.run_repeats} runs each, taking turns"):
        paths = {"picasso": plan_path, **base_plans}
        runs: dict[str, list[Measured]] = {n: [] for n in paths}

        def measure(name: str, r: int) -> float:
            m = run_measured(paths[name], str(data), "criteo", WORLD, steps, 3, out, tag=f".run{r}")
            runs[name].append(m)
            return m.iteration_us

        ctx["repeats"] = measure_interleaved(list(paths), cfg.run_repeats, measure,
                                             lambda n: Plan.load(paths[n]).global_batch)
        measured = {n: merge_passes(ms) for n, ms in runs.items()}
        measured["picasso"].timeline.save_chrome_trace(out / "plan.measured.trace.json")
        ctx["measured"] = measured

    with st.stage("quality", f"the plan trained {QUALITY_STEPS} steps, AUC on held-out rows every {QUALITY_EVERY}"):
        from executor.process.launch import launch
        from executor.run.config import RunConfig

        held_out = out / "held-out.tsv"
        generate_criteo(held_out, QUALITY_ROWS, seed=seed + 1)
        q = launch(RunConfig(plan=str(plan_path), data=str(data), format="criteo", nproc=WORLD, steps=QUALITY_STEPS,
                             eval_data=str(held_out), eval_every=QUALITY_EVERY,
                             trace=str(out / "plan.quality.trace.json")))
        ctx["quality"] = [asdict(e) for e in q.eval]

    with st.stage("validate", f"{n_plans} varied plans at 1-{WORLD} ranks, predicted against measured"):
        vcfg = ValidateConfig(
            data=str(data), format="criteo", hardware=str(out / "hardware.json"), model=MODEL, row_cap=row_cap,
            plans=n_plans, fit_plans=min(max(2, n_plans // 3), n_plans - 2) if n_plans >= 4 else 0,
            nproc_max=WORLD, batch_sizes=(256, 512), steps=6, warmup=2, timed_seconds=0.5, max_steps=24,
            repeats=cfg.repeats, run_timeout=300.0, out_dir=str(out / "validate"))
        vres, vruns = run_validate(vcfg, st.log)
        ctx["validate"] = (vres, vruns)
        # the plan and the baselines once more, with the spec refined on the fit plans
        if vres.get("refined_hardware"):
            refined = load_hardware(vres["refined_hardware"])
            ctx["refined"] = {n: predict(Plan.load(pth), refined, access=access)
                              for n, pth in [("picasso", plan_path), *base_plans.items()]}

    with st.stage("report", "one self-contained HTML page"):
        report_path = out / "report.html"
        write_demo_report(report_path, ctx, st.times, time.perf_counter() - st.t0)

    total = time.perf_counter() - st.t0
    summary = demo_summary(ctx, st.times, total, report_path)
    atomic_write_text(out / "demo.json", json.dumps(summary, indent=1, default=json_default))
    return summary


def _speedups(times: dict[str, float]) -> dict[str, float | None]:
    mine = times.get("picasso")
    return {n: (t / mine if mine and t else None) for n, t in times.items() if n != "picasso"}


def measured_summary(reps: dict[str, Repeated]) -> dict[str, Any]:
    """The repeated runs as the summary shows them: medians, spreads, the typical spread, the plans
    whose runs disagree beyond it, and each measured speedup with whether the runs resolve it."""
    typical = typical_spread(reps)
    mine = reps["picasso"]
    return {
        "measured_iteration_us": {n: r.median_us for n, r in reps.items()},
        "measured_runs_us": {n: r.runs_us for n, r in reps.items()},
        "measured_spread": {n: r.spread for n, r in reps.items()},
        "typical_spread": typical,
        "noisy": [n for n, r in reps.items() if noisy(r, typical)],
        "measured_speedup": {n: speedup(mine, r).ratio for n, r in reps.items() if n != "picasso"},
        "measured_speedup_resolved": {n: speedup(mine, r).resolved for n, r in reps.items() if n != "picasso"},
        "samples_per_s": {n: r.samples_per_s for n, r in reps.items()},  # at the median: agrees with the ms
    }


def measured_line(summary: dict[str, Any]) -> str:
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


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """What `picasso demo` prints at the end: the report, the speedups (measured ones with their
    spread) and the validation's accuracy."""
    lines = [f"picasso demo: done in {summary['seconds']:.0f} s; report: {summary['report']}"]
    for k in ("predicted_speedup", "predicted_speedup_refit"):
        lines.append(f"  {k.replace('_', ' ')}: " + ", ".join(f"{n} {v:.2f}x" for n, v in summary[k].items() if v))
    v = summary["validate"]
    return [*lines, f"  {measured_line(summary)}",
            f"  validation: {v['plans']} plans, MAPE {v['mape']:.1%}, Spearman {_fmt(v['spearman'])}"]


def demo_summary(ctx: dict[str, Any], stages: list[dict[str, Any]], total: float, report: Path) -> dict[str, Any]:
    pred = {n: p.iteration_us for n, p in ctx["predicted"].items()}
    vres = ctx["validate"][0]
    refit = {n: p.iteration_us for n, p in ctx.get("refined", {}).items()}
    return {
        "report": str(report), "seconds": round(total, 1), "stages": stages,
        "predicted_iteration_us": pred, "predicted_iteration_us_refit": refit,
        "predicted_speedup": _speedups(pred), "predicted_speedup_refit": _speedups(refit),
        **measured_summary(ctx["repeats"]),
        "eval": ctx.get("quality", []),
        "validate": {"plans": vres["plans"], "plans_fit": vres.get("plans_fit", 0), "mape": vres["mape"],
                     "spearman": vres["spearman"], "microbench_only": vres.get("microbench_only"),
                     "failed": len(vres.get("failed", []))},
    }


def write_demo_report(path: Path, ctx: dict[str, Any], stages: list[dict[str, Any]], total: float) -> None:
    profile, plan, expl = ctx["profile"], ctx["plan"], ctx["explanation"]
    pred, meas = ctx["predicted"], ctx["measured"]
    vres, vruns = ctx["validate"]
    secs: list[Section] = []

    names = list(pred)
    refit = ctx.get("refined", {})
    ms = measured_summary(ctx["repeats"])
    med = ms["measured_iteration_us"]
    pred_sp = _speedups({n: pred[n].iteration_us for n in names})
    refit_sp = _speedups({n: refit[n].iteration_us for n in names if n in refit})
    meas_sp = ms["measured_speedup"]
    runs = len(ms["measured_runs_us"]["picasso"])
    flagged = ", ".join(ms["noisy"])
    intro = markup(
        paragraph(f"Synthetic Criteo data, model {plan.model.name}, {plan.world_size} gloo ranks on this "
                  f"machine, batch {plan.batch_size_per_rank}/rank. Whole demo: {total:.0f} s."),
        paragraph(f"Measured: the median of {runs} runs of each plan, the plans taking turns; spread is (max - min) "
                  f"/ median of its runs, typically {ms['typical_spread']:.1%} here. A speedup within both plans' "
                  f"spreads is marked 'within noise'. "
                  + (f"Runs disagreeing by more than twice the typical spread: {flagged}." if flagged else
                     "No plan's runs disagree by more than twice the typical spread.")),
        table_html([{"plan": n + (" (noisy)" if n in ms["noisy"] else ""),
                       "predicted ms": pred[n].iteration_us / 1e3,
                       "predicted ms (refit)": refit[n].iteration_us / 1e3 if n in refit else "",
                       "measured ms": med[n] / 1e3,
                       "spread": f"{ms['measured_spread'][n]:.1%}",
                       "error": f"{(pred[n].iteration_us - med[n]) / med[n]:+.1%}",
                       "error (refit)": f"{(refit[n].iteration_us - med[n]) / med[n]:+.1%}" if n in refit else "",
                       "measured samples/s": ms["samples_per_s"][n],
                       "picasso speedup (pred.)": "" if n == "picasso" else _fmt_x(pred_sp.get(n)),
                       "picasso speedup (meas.)": "" if n == "picasso" else
                       _fmt_x(meas_sp.get(n)) + ("" if ms["measured_speedup_resolved"][n] else " (within noise)")}
                      for n in names]),
        paragraph(f"Validation over {vres['plans']} plans: MAPE ", bold(f"{vres['mape']:.1%}"), ", Spearman ",
                  bold(_fmt(vres["spearman"])), "."),
        tag("h3", "Stages"), table_html(stages),
    )
    secs.append(Section("Summary", intro))

    feats = sorted(profile.features.values(), key=lambda f: -f.distinct)[:COVERAGE_FEATURES]
    curves = {}
    for f in feats:
        x, y = f.coverage_curve()
        curves[f"{f.name} ({f.distinct:,} ids)"] = (list(map(float, x)), list(map(float, y)))
    cov_rows = [{"feature": f.name, "distinct": f.distinct, "accesses": f.accesses,
                 "top 1% covers": f"{float(f.coverage(0.01)):.1%}", "top 10% covers": f"{float(f.coverage(0.1)):.1%}"}
                for f in feats]
    secs.append(Section("Access profile: coverage curves", table_html(cov_rows),
                        [coverage_figure(curves, "Fraction of lookups covered by the hottest IDs")]))

    secs.append(Section("The plan and why", tag("pre", expl.text())))

    secs.append(Section("Simulated and measured timelines of the plan (one iteration / timed steps)", "",
                        [timeline_figure(pred["picasso"].timeline, "simulated (calibrated spec)"),
                         timeline_figure(one_step(meas["picasso"].timeline), "measured (median timed step)")]))
    timelines_idx = len(secs) - 1

    base = [n for n in names if n != "picasso"]
    secs.append(Section("Speedups over the baselines", "",
                        [bar_figure(base, {"predicted": [pred_sp.get(n) or 0 for n in base],
                                           "predicted (refit)": [refit_sp.get(n) or 0 for n in base],
                                           "measured (median)": [meas_sp.get(n) or 0 for n in base]},
                                    "picasso plan: speedup over each baseline", "speedup (x)"),
                         bar_figure(names, {"predicted": [pred[n].iteration_us / 1e3 for n in names],
                                            "predicted (refit)": [refit[n].iteration_us / 1e3 if n in refit else 0
                                                                  for n in names],
                                            "measured (median)": [med[n] / 1e3 for n in names]},
                                    "Iteration time", "ms")]))
    speed_idx = len(secs) - 1
    if ctx.get("quality"):
        secs.append(auc_section(ctx["quality"]))

    vsecs = validation_sections(vres, vruns)
    for s in vsecs:
        s.title = "Validation: " + s.title
    start = len(secs)
    secs.extend(vsecs)
    cal = ctx["calibration"]
    secs.append(Section("Calibration (microbenchmarks, least squares)",
                        table_html([{"world": w, "kind": k, "fixed us": f["latency_us"], "rate": f["rate"],
                                     "unit": f["unit"], "rel rms": f["rel_rms"], "n": f["n"]}
                                    for w, fits in cal["fits"].items() for k, f in fits.items()])))
    write_page(path, "picasso demo report", secs,
               subtitle="Plan, simulate and run hybrid-parallel training of a recommendation model; "
                        "predicted against measured.",
               side_by_side=[timelines_idx, speed_idx, start + len(vsecs) - 1])


def auc_section(evals: list[dict[str, Any]]) -> Any:
    """The AUC (and logloss) curve on held-out rows over the training steps."""
    from simulator.report import Section, line_figure, markup, paragraph, table_html

    steps = [e["step"] for e in evals]
    note = paragraph("AUC and logloss of the plan's model on held-out rows, exact across ranks. The demo's synthetic "
                     "labels are random clicks (rate 0.25), so the AUC stays near 0.5 here; on the real Criteo sample "
                     "see docs/benchmarks.md (bench_quality).")
    fig = line_figure({"AUC": (steps, [e["auc"] for e in evals])}, "Held-out AUC during training", "step", "AUC",
                      y2={"logloss": (steps, [e["logloss"] for e in evals])}, y2axis="logloss")
    rows = [{"step": e["step"], "AUC": e["auc"], "logloss": e["logloss"], "rows": e["rows"]} for e in evals]
    return Section("Model quality: AUC curve on held-out data", markup(note, table_html(rows, fmt="{:.5g}")), [fig])


def _fmt(v: Any) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _fmt_x(v: Any) -> str:
    return "n/a" if v is None else f"{v:.2f}x"
