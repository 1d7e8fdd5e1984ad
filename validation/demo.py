"""`picasso demo`: the whole workflow on built-in synthetic Criteo data, one HTML report.

Stages, in order: synth -> analyze -> native (the C++ kernels, built on first use) -> calibrate
-> plan -> simulate -> cluster (what-if: a Zipf-heavy log planned for simulated GPU clusters,
validation.demo_cluster) -> run (the plan and the baselines, repeated until each comparison is
decided or said to be undecided, validation.repeats) -> quality -> validate -> report. The terminal's
closing lines and the report are made from one summary. A stage that fails stops the demo with one
line naming the stage; nothing is skipped silently.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from foundation.files import atomic_write_text
from foundation.numbers import count, duration_us, percent, si
from foundation.outputs import Outputs, holds_document, mark
from foundation.progress import Progress, say
from planner.access import table_access
from planner.builders import BASELINES, baseline_plan
from planner.explain import explain
from planner.plan import Plan
from planner.presets import get_model
from planner.search import search
from simulator.calibration import POOR_FIT_RMS, fit_problem, spec_for_world
from simulator.export import shared_timelines
from simulator.hardware import load_hardware
from simulator.measured import one_step
from simulator.report import (
    Section,
    bar_figure,
    coverage_figure,
    line_figure,
    markup,
    padded_range,
    paragraph,
    table_html,
    tag,
    write_page,
)
from traces.profile import profile_file
from traces.synth import generate_criteo
from validation.calibrate import CalibrateConfig, calibrate
from validation.compare import predict
from validation.demo_cluster import cluster_lines, cluster_section, plan_clusters, skewed_log
from validation.measure import Measured, merge_passes, run_measured
from validation.repeats import (
    MachineLoad,
    Repeated,
    compare_to,
    measure_until_decided,
    noisy,
    speedup,
    typical_spread,
)
from validation.report import validation_sections
from validation.validate import ValidateConfig, json_default, run_validate

MODEL = "dlrm-criteo-kaggle"
WORLD = 2
COVERAGE_FEATURES = 8  # curves drawn: the largest tables
AUC_MIN_SPAN = 0.1  # the AUC axis spans at least this
STAGES = ("synth", "analyze", "native", "calibrate", "plan", "simulate", "cluster", "run", "quality", "validate",
          "report")
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
    # in the small validation sweep (a third of them fit); with the run stage's 4 plans x 2-4 runs the demo
    # launches 18-26 rank groups, each a few seconds of start-up on a CPU machine
    plans: int = 9
    repeats: int = 1  # passes over the validation sweep (the run stage repeats the comparison that concludes)
    # runs of the plan and of each baseline, taking turns (validation.repeats): at least run_repeats,
    # then more of those still inside the runs' spread, up to max_run_repeats
    run_repeats: int = 2
    max_run_repeats: int = 4
    cluster_rows: int = 100_000  # rows of the skewed log of the what-if part (validation.demo_cluster)
    quiet: bool = False  # no progress lines (--json)

    def check(self) -> None:
        for name in ("rows", "row_cap", "batch", "steps", "plans", "repeats", "cluster_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.run_repeats < 2 or self.max_run_repeats < self.run_repeats:
            raise ValueError("--run-repeats must be at least 2 (a spread needs two runs) and --max-run-repeats "
                             "at least --run-repeats")


DEMO_KIND = "demo"


def _is_demo_folder(path: Path) -> bool:
    """A demo folder picasso wrote before folders carried a marker: its demo.json says so."""
    return holds_document(path, "demo.json", "demo summary", lambda d: "stages" in d)


class DemoError(RuntimeError):
    """A demo stage failed; the message names the stage."""


class Stages:
    """Runs stages in order, timing each; a failure becomes one DemoError line."""

    def __init__(self, names: tuple[str, ...], quiet: bool = False) -> None:
        self.names = names
        self.times: list[dict[str, Any]] = []
        self.quiet = quiet
        self.t0 = time.perf_counter()

    def log(self, msg: str) -> None:
        if not self.quiet:
            say(msg)

    @contextmanager
    def stage(self, name: str, what: str) -> Iterator[None]:
        self.log(f"demo [{self.names.index(name) + 1}/{len(self.names)} {name}] {what} ...")
        t = time.perf_counter()
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - every failure stops the demo, named
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DemoError(f"stage {name} failed: {first}") from exc
        dt = time.perf_counter() - t
        self.times.append({"stage": name, "what": what, "seconds": round(dt, 2)})
        self.log(f"demo [{self.names.index(name) + 1}/{len(self.names)} {name}] done in {dt:.1f} s")


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    """Every stage (see the module docstring); returns the summary it also writes to demo.json."""
    cfg.check()
    Outputs().folder("-o", cfg.out, DEMO_KIND, legacy=_is_demo_folder).check()
    out = mark(cfg.out, DEMO_KIND)
    st = Stages(STAGES, cfg.quiet)
    rows, seed, row_cap, batch, steps, n_plans = cfg.rows, cfg.seed, cfg.row_cap, cfg.batch, cfg.steps, cfg.plans
    ctx: dict[str, Any] = {}

    data = out / "data.tsv"
    with st.stage("synth", f"{rows:,} synthetic Criteo rows"):
        generate_criteo(data, rows, seed=seed)

    with st.stage("analyze", "access profile of every feature"):
        profile = profile_file(data, "criteo", batch_size=batch * WORLD)
        profile.save(out / "profile.json")
        ctx["profile"] = profile

    with st.stage("native", "the C++ kernels of the CPU ranks (built on first use, about 40 s; cached after)"):
        from executor.sparse.kernels import load_native, native_status

        if not load_native(warn=False):  # no compiler, or it failed: the ranks run the pure-PyTorch path
            st.log(f"demo:   {native_status()['reason']}; the ranks use the pure-PyTorch kernels")

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

    with st.stage("cluster", f"what-if: a Zipf-heavy log of {cfg.cluster_rows:,} rows planned for simulated "
                             "GPU clusters"):
        _, skewed = skewed_log(out, cfg.cluster_rows, seed + 7)
        ctx["clusters"] = plan_clusters(out, skewed, st.log)

    with st.stage("run", f"the plan and the baselines for real on {WORLD} gloo ranks, {cfg.run_repeats} to "
                         f"{cfg.max_run_repeats} runs each, taking turns, until each comparison is decided"):
        paths = {"picasso": plan_path, **base_plans}
        runs: dict[str, list[Measured]] = {n: [] for n in paths}
        load = MachineLoad.now()
        bar = Progress("demo runs", total=len(paths) * cfg.run_repeats, unit="run")

        def measure(name: str, r: int) -> float:
            bar.note(f"{name}, round {r + 1}")
            m = run_measured(paths[name], str(data), "criteo", WORLD, steps, 3, out, tag=f".run{r}")
            runs[name].append(m)
            bar.update()
            return m.iteration_us

        def more(r: int, todo: list[str]) -> None:
            if r >= cfg.run_repeats:
                bar.extend(len(todo))
                st.log(f"demo:   round {r + 1}: {', '.join(todo[1:])} still inside the runs' spread, measured again")

        ctx["repeats"] = measure_until_decided(list(paths), cfg.run_repeats, cfg.max_run_repeats, measure,
                                               lambda n: Plan.load(paths[n]).global_batch, more)
        bar.close()
        ctx["load"] = load.ended()
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

    with st.stage("validate", f"a sweep of varied plans at 1-{WORLD} ranks, predicted against measured"):
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
        # one summary: the terminal prints it, the report shows it, demo.json keeps it
        summary = demo_summary(ctx, st.times, time.perf_counter() - st.t0, report_path)
        write_demo_report(report_path, ctx, summary)

    summary["stages"] = st.times
    atomic_write_text(out / "demo.json", json.dumps(summary, indent=1, default=json_default))
    return summary


def _speedups(times: dict[str, float]) -> dict[str, float | None]:
    mine = times.get("picasso")
    return {n: (t / mine if mine and t else None) for n, t in times.items() if n != "picasso"}


def measured_summary(reps: dict[str, Repeated], load: MachineLoad | None = None) -> dict[str, Any]:
    """The repeated runs as the summary shows them: medians, spreads, the typical spread, the plans
    whose runs disagree beyond it, each measured speedup with whether the runs resolve it, and the
    conclusion per baseline (decided, or undecided with the reason and what to do)."""
    typical = typical_spread(reps)
    mine = reps["picasso"]
    comparisons = [compare_to(mine, r) for n, r in reps.items() if n != "picasso"]
    return {
        "measured_iteration_us": {n: r.median_us for n, r in reps.items()},
        "measured_runs_us": {n: r.runs_us for n, r in reps.items()},
        "measured_spread": {n: r.spread for n, r in reps.items()},
        "typical_spread": typical,
        "noisy": [n for n, r in reps.items() if noisy(r, typical)],
        "measured_speedup": {n: speedup(mine, r).ratio for n, r in reps.items() if n != "picasso"},
        "measured_speedup_resolved": {n: speedup(mine, r).resolved for n, r in reps.items() if n != "picasso"},
        "samples_per_s": {n: r.samples_per_s for n, r in reps.items()},  # at the median: agrees with the ms
        "verdicts": {c.baseline: c.verdict.value for c in comparisons},
        "conclusion": [c.text(load) for c in comparisons],
        "load": None if load is None else {"start": load.load_start, "end": load.load_end, "cores": load.cores},
    }


def measured_line(summary: dict[str, Any]) -> str:
    """The measured speedups with the runs' spread: a speedup within it, or over a plan whose runs
    disagree beyond the typical spread, says so."""
    spread, noisy = summary["measured_spread"], set(summary["noisy"])
    runs = {n: len(r) for n, r in summary["measured_runs_us"].items()}
    parts = []
    for n, v in summary["measured_speedup"].items():
        note = [] if summary["measured_speedup_resolved"][n] else ["within noise"]
        note += [f"{x}'s runs disagree" for x in ("picasso", n) if x in noisy]
        parts.append(f"{n} {v:.2f}x (spread {spread[n]:.0%})" + (f" [{'; '.join(note)}]" if note else ""))
    return (f"measured speedup (median of {_runs_text(runs)} runs; picasso's spread {spread['picasso']:.0%}, "
            f"typical {summary['typical_spread']:.0%}): " + ", ".join(parts))


def _runs_text(runs: dict[str, int]) -> str:
    lo, hi = min(runs.values()), max(runs.values())
    return str(lo) if lo == hi else f"{lo}-{hi}"


def validation_line(v: dict[str, Any]) -> str:
    """The validation's accuracy with its plan counts (validated, fit, failed): the same words in the
    terminal and the report."""
    refit_kept = v.get("refit_kept", "refit")
    if not v.get("plans_fit"):
        fit = ""
    elif refit_kept == "refit":
        fit = f" after a refit on {v['plans_fit']} others"
    else:  # the refit did worse on held-out fit plans than the microbenchmarks' rates (validation.refit)
        fit = f" with the measured rates (a refit on {v['plans_fit']} others did worse, so it was not kept)"
    failed = f"; {v['failed']} failed to run" if v.get("failed") else ""
    before = v.get("microbench_only") or {}
    was = (f" (microbenchmarks alone: {percent(before['mape'])})"
           if before.get("mape") is not None and refit_kept == "refit" else "")
    return (f"validation: {v['plans']} plans validated{fit}{failed}, MAPE {percent(v['mape'])}{was}, "
            f"Spearman {_fmt(v['spearman'])}")


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """What `picasso demo` prints at the end (the report's summary says the same): the what-if on
    simulated clusters, the measured conclusion, the validation's accuracy."""
    lines = [f"picasso demo: done in {summary['seconds']:.0f} s; report: {summary['report']}"]
    if summary.get("clusters"):
        lines.append("  what-if, the skewed log planned for simulated clusters:")
        lines += [f"    {x}" for x in cluster_lines(summary["clusters"])]
    lines.append(f"  on this machine ({summary['world']} CPU ranks):")
    for k, words in (("predicted_speedup", "predicted speedup"), ("predicted_speedup_refit", "after the refit")):
        if summary[k]:
            lines.append(f"    {words}: " + ", ".join(f"{n} {v:.2f}x" for n, v in summary[k].items() if v))
    lines.append(f"    {measured_line(summary)}")
    lines += [f"    {c}" for c in summary["conclusion"]]
    return [*lines, f"  {validation_line(summary['validate'])}"]


def demo_summary(ctx: dict[str, Any], stages: list[dict[str, Any]], total: float, report: Path) -> dict[str, Any]:
    pred = {n: p.iteration_us for n, p in ctx["predicted"].items()}
    vres = ctx["validate"][0]
    refit = {n: p.iteration_us for n, p in ctx.get("refined", {}).items()}
    return {
        "report": str(report), "seconds": round(total, 1), "stages": stages, "world": WORLD,
        "predicted_iteration_us": pred, "predicted_iteration_us_refit": refit,
        "predicted_speedup": _speedups(pred), "predicted_speedup_refit": _speedups(refit),
        "clusters": [c.summary() for c in ctx.get("clusters", [])],
        **measured_summary(ctx["repeats"], ctx.get("load")),
        "eval": ctx.get("quality", []),
        "validate": {"plans": vres["plans"], "plans_fit": vres.get("plans_fit", 0), "mape": vres["mape"],
                     "refit_kept": _kept(vres),
                     "spearman": vres["spearman"], "microbench_only": vres.get("microbench_only"),
                     "failed": len(vres.get("failed", []))},
    }


def _kept(vres: dict[str, Any]) -> str:
    """Which rates the validation kept: "refit", or "microbench" where the refit did worse."""
    kept = ((vres.get("refit") or {}).get("choice") or {}).get("kept", "refit")
    return str(getattr(kept, "value", kept))


def write_demo_report(path: Path, ctx: dict[str, Any], ms: dict[str, Any]) -> None:
    """The report, its numbers read from the summary `ms` (what the terminal printed)."""
    profile, plan, expl = ctx["profile"], ctx["plan"], ctx["explanation"]
    pred, meas = ctx["predicted"], ctx["measured"]
    vres, vruns = ctx["validate"]
    secs: list[Section] = []

    names = list(pred)
    refit = ctx.get("refined", {})
    med = ms["measured_iteration_us"]
    pred_sp, refit_sp, meas_sp = ms["predicted_speedup"], ms["predicted_speedup_refit"], ms["measured_speedup"]
    runs = {n: len(r) for n, r in ms["measured_runs_us"].items()}
    flagged = ", ".join(ms["noisy"])
    intro = markup(
        paragraph(f"Synthetic Criteo data, model {plan.model.name}, {plan.world_size} gloo ranks on this "
                  f"machine, batch {plan.batch_size_per_rank}/rank. Whole demo: {ms['seconds']:.0f} s."),
        tag("h3", "What picasso demo printed: the what-if, the measured conclusion, the validation"),
        tag("pre", "\n".join(x.removeprefix("  ") for x in summary_lines(ms)[1:])),
        paragraph(f"Measured: the median of {_runs_text(runs)} runs of each plan, the plans taking turns, more runs "
                  f"while a comparison stays inside the spread; spread is (max - min) / median of its runs, "
                  f"typically {percent(ms['typical_spread'])} here. "
                  + (f"Runs disagreeing by more than twice the typical spread: {flagged}." if flagged else
                     "No plan's runs disagree by more than twice the typical spread.")),
        table_html([{"plan": n + (" (noisy)" if n in ms["noisy"] else ""),
                     "runs": runs[n],
                     "predicted": duration_us(pred[n].iteration_us),
                     "predicted (refit)": duration_us(refit[n].iteration_us) if n in refit else "",
                     "measured (median)": duration_us(med[n]),
                     "spread": percent(ms["measured_spread"][n]),
                     "error": percent((pred[n].iteration_us - med[n]) / med[n]),
                     "error (refit)": percent((refit[n].iteration_us - med[n]) / med[n]) if n in refit else "",
                     "measured samples/s": count(ms["samples_per_s"][n]),
                     "picasso speedup (pred.)": "" if n == "picasso" else _fmt_x(pred_sp.get(n)),
                     "picasso speedup (meas.)": "" if n == "picasso" else
                     _fmt_x(meas_sp.get(n)) + ("" if ms["measured_speedup_resolved"][n] else " (within noise)")}
                    for n in names]),
        paragraph(validation_line(ms["validate"]) + "."),
        tag("h3", "Stages"), table_html(ms["stages"]),
    )
    secs.append(Section("Summary", intro))
    if ctx.get("clusters"):
        secs.append(cluster_section(ctx["clusters"], ms["clusters"]))

    feats = sorted(profile.features.values(), key=lambda f: -f.distinct)[:COVERAGE_FEATURES]
    curves = {}
    for f in feats:
        x, y = f.coverage_curve()
        curves[f"{f.name} ({f.distinct:,} ids)"] = (list(map(float, x)), list(map(float, y)))
    cov_rows = [{"feature": f.name, "distinct": f.distinct, "accesses": f.accesses,
                 "top 1% covers": percent(float(f.coverage(0.01))), "top 10% covers": percent(float(f.coverage(0.1)))}
                for f in feats]
    secs.append(Section("Access profile: coverage curves", table_html(cov_rows),
                        [coverage_figure(curves, "Share of lookups served by the hottest IDs")]))

    secs.append(Section("The plan and why", tag("pre", expl.text())))

    measured_step = one_step(meas["picasso"].timeline)
    secs.append(Section("Simulated and measured timelines of the plan (one iteration / timed steps), one time axis",
                        "", shared_timelines({"simulated (calibrated spec)": pred["picasso"].timeline,
                                              "measured (median timed step)": measured_step})))
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
                                    "Iteration time", "iteration (ms)")]))
    speed_idx = len(secs) - 1
    if ctx.get("quality"):
        secs.append(auc_section(ctx["quality"]))

    vsecs = validation_sections(vres, vruns)
    for s in vsecs:
        s.title = "Validation: " + s.title
    start = len(secs)
    secs.extend(vsecs)
    secs.append(calibration_section(ctx["calibration"]))
    write_page(path, "picasso demo report", secs,
               subtitle="Plan, simulate and run hybrid-parallel training of a recommendation model; "
                        "predicted against measured.",
               side_by_side=[timelines_idx, speed_idx, start + len(vsecs) - 1])


def calibration_section(cal: dict[str, Any]) -> Section:
    """The microbenchmark fits, each flagged in words when its rate is not measured or its
    residuals are large (simulator.calibration.fit_problem)."""
    rows = [{"world": w, "kind": k, "fixed": duration_us(f["latency_us"]), "rate": si(f["rate"], f["unit"]),
             "residuals (rms)": percent(f["rel_rms"]), "samples": f["n"],
             "fit": fit_problem(f["rate"], f["rel_rms"], f["rel_max"]) or "good"}
            for w, fits in cal["fits"].items() for k, f in fits.items()]
    bad = [r for r in rows if r["fit"] != "good"]
    note = paragraph(f"{len(bad)} of {len(rows)} fits flagged: their rates are not to be read as this machine's; "
                     "the simulator still uses them, so predictions of those ops are the least certain."
                     if bad else f"All {len(rows)} fits describe their samples (residuals under "
                     f"{percent(POOR_FIT_RMS, 0)} rms).")
    return Section("Calibration (microbenchmarks, least squares)", markup(note, table_html(rows)))


def auc_section(evals: list[dict[str, Any]]) -> Any:
    """The AUC (and logloss) curve on held-out rows over the training steps."""

    steps = [e["step"] for e in evals]
    note = paragraph("AUC and logloss of the plan's model on held-out rows, exact across ranks. The demo's synthetic "
                     "labels are random clicks (rate 0.25), so the AUC stays near 0.5 here; on the real Criteo sample "
                     "see docs/benchmarks.md (bench_quality).")
    aucs = [e["auc"] for e in evals]
    # at least 0.1 of AUC and chance (0.5) on the axis: a change in the third decimal stays flat
    fig = line_figure({"AUC": (steps, aucs)}, "Held-out AUC during training", "step", "AUC",
                      y2={"logloss": (steps, [e["logloss"] for e in evals])}, y2axis="logloss",
                      yrange=padded_range(aucs, AUC_MIN_SPAN, include=(0.5,)))
    rows = [{"step": e["step"], "AUC": e["auc"], "logloss": e["logloss"], "rows": e["rows"]} for e in evals]
    return Section("Model quality: AUC curve on held-out data", markup(note, table_html(rows, fmt="{:.5g}")), [fig])


def _fmt(v: Any) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _fmt_x(v: Any) -> str:
    return "n/a" if v is None else f"{v:.2f}x"
