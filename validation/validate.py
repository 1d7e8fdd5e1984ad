"""`picasso validate`: run a sweep of plans for real and hold the simulator's predictions against them.

Per plan: the executor runs it (a few steps after warm-up, executor.process.launch) and writes a
measured Timeline; lowering + the simulator predict it with the calibrated spec (the
factors of the plan's world size, `simulator.calibration.spec_for_world`). Compared:
iteration time (median measured step against the simulated iteration) and, for the ops
that dominate the measured step, per-op durations. Summary: MAPE and Spearman rank
correlation over the validated plans.

With `fit_plans` K, K plans of the sweep (every n-th, so they span the knobs) form a fit
set: the simulator's coefficients are refined on what their timelines measure op by op
(`validation.refit.refit_on_runs`: per op class and world size, compute ops and
collectives; the host time outside the ops, per step and per op) and the others are
validated with the refined spec; the microbenchmark-only figures are reported beside
them. Fit and validated plans never overlap.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from foundation.files import atomic_write_text
from foundation.numbers import duration_us
from foundation.outputs import Outputs, holds_document, mark
from foundation.progress import Progress
from planner.access import table_access
from planner.builders import build_sweep
from planner.inputs import load_inputs
from simulator.calibration import spec_for_world
from traces.profile import AccessProfile, profile_file
from validation.compare import (
    by_base_name,
    compare,
    op_error_summary,
    predict,
    spearman_text,  # noqa: F401 - the command prints it beside the summary
    summary,
    unfitted_classes,
)
from validation.measure import Measured, ValidateError, merge_passes, run_measured, timed_steps_for
from validation.refit import Kept, choose_refit, refit_on_runs
from validation.variants import PlanVariants, apply_variants

WORLDS = (1, 2, 4, 8)
SWEEP_KIND = "validate"
# what a sweep writes in its -o folder; other outputs may sit beside these
SWEEP_NAMES = ("plans", "profile.json", "profile.npz", "validate.json", "hardware.refined.json")


def is_sweep_folder(path: Path) -> bool:
    """A sweep folder picasso wrote before folders carried a marker: its validate.json says so."""
    return holds_document(path, "validate.json", "validate result", lambda d: "per_plan" in d)


def sweep_outputs(cfg: ValidateConfig | None, replay: str | None, html: str | None, results: str | None,
                  hardware: str | None, save_refined: str | None) -> Outputs:
    """What `picasso validate` reads and writes: a sweep (`cfg`) or the replay of the sweep in `replay`."""
    outs = Outputs().read("--hardware", hardware).read("--replay", replay)
    if cfg is not None:
        outs.read("--data", cfg.data).read("--model", cfg.model)
        outs.folder("-o", cfg.out_dir, SWEEP_KIND, names=SWEEP_NAMES, legacy=is_sweep_folder)
    return outs.file("--html", html).file("--results", results).file("--save-refined", save_refined)


@dataclass
class ValidateConfig:
    """The parameters of a validation sweep (`picasso validate`'s flags)."""

    data: str
    format: str = "criteo"
    hardware: str = "local-cpu"
    model: str = "dlrm-criteo-kaggle"
    row_cap: int | None = 50_000
    plans: int = 28
    fit_plans: int = 8
    nproc_max: int = 4
    batch_sizes: tuple[int, ...] = (256, 512, 1024)
    steps: int = 8
    timed_seconds: float = 1.0
    max_steps: int = 40
    warmup: int = 2
    repeats: int = 2
    run_timeout: float = 300.0
    include_planner: bool = True
    out_dir: str = "picasso-validate"
    save_refined: str | None = None
    variants: PlanVariants = PlanVariants.NONE  # validation.variants: dtypes, 16-bit tables, host rows

    def check(self) -> None:
        """Refuse (ValueError, one line naming the flag) values the sweep cannot run with."""
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"--batch-sizes {list(self.batch_sizes)}: expected positive integers separated by commas")
        if not (math.isfinite(self.timed_seconds) and math.isfinite(self.run_timeout) and self.run_timeout > 0):
            raise ValueError("--timed-seconds and --run-timeout must be finite numbers (--run-timeout > 0)")
        for name in ("plans", "nproc_max", "steps", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.max_steps < self.steps or self.timed_seconds < 0:
            raise ValueError("--max-steps must be at least --steps and --timed-seconds non-negative")
        if self.warmup < 0 or self.fit_plans < 0 or self.fit_plans >= self.plans:
            raise ValueError("--warmup must be >= 0 and --fit-plans in [0, --plans)")


def load_profile(data: str, fmt: str, out_dir: Path, log: Callable[[str], None]) -> AccessProfile:
    """Profile the data with traces/ (cached as profile.json beside the results)."""
    path = out_dir / "profile.json"
    if path.exists() and path.stat().st_mtime >= Path(data).stat().st_mtime:
        return AccessProfile.load(path)
    log(f"validate: profiling {data} ...")
    prof = profile_file(data, fmt)
    prof.save(path)
    return prof


def run_validate(cfg: ValidateConfig, log: Callable[[str], None] | None = None) -> tuple[dict[str, Any], list[Any]]:
    """The sweep: build plans, run each, predict each, compare. Returns (result, runs):
    runs are (Case, Measured, Predicted) of every plan that ran. Writes validate.json."""
    cfg.check()
    log = log or (lambda m: None)
    out_dir = Path(cfg.out_dir)
    if not Path(cfg.data).is_file():
        raise ValidateError(f"{cfg.data}: no such data file")
    model, hw, _, _ = load_inputs(cfg.model, cfg.hardware, [], None, None, cfg.row_cap)
    (mark(out_dir, SWEEP_KIND) / "plans").mkdir(exist_ok=True)  # only once the inputs are read
    profile = load_profile(cfg.data, cfg.format, out_dir, log)
    access = table_access(model, profile)
    worlds = tuple(n for n in WORLDS if n <= cfg.nproc_max)
    batches = tuple(int(b) for b in cfg.batch_sizes)
    cases = build_sweep(model, access, lambda w: spec_for_world(hw, w), n_plans=cfg.plans, worlds=worlds,
                        batches=batches, include_planner=cfg.include_planner, fit_count=cfg.fit_plans)
    varied = apply_variants(cases, cfg.variants, hw)
    cases = varied.cases
    for why in varied.skipped.values():
        log(f"validate: variant left out: {why}")
    results, runs, failed = [], [], []
    t_start = time.perf_counter()
    passes = cfg.repeats
    measured: list[list[Measured]] = [[] for _ in cases]
    preds: list[Any] = [None] * len(cases)
    dead: set[int] = set()
    paths = [out_dir / "plans" / f"{i:02d}-{case.name}.json" for i, case in enumerate(cases)]
    n_fit = sum(1 for c in cases if c.role == "fit")
    log(f"validate: {len(cases)} plans, {len(cases) - n_fit} to validate" + (
        f" and {n_fit} to refit the simulator on" if n_fit else "") + (f", {passes} passes" if passes > 1 else ""))
    bar = Progress("validate runs", total=len(cases) * passes, unit="run")
    k = 0
    # every plan once per pass: a shared machine drifts over minutes, and runs of one plan
    # at two moments average that drift out where runs back to back would not
    for r in range(passes):
        for i, case in enumerate(cases):
            if i in dead:
                continue
            plan_path = paths[i]
            if r == 0:
                case.plan.save(plan_path, hot_ids=case.hot_ids or None)
                preds[i] = predict(case.plan, spec_for_world(hw, case.plan.world_size), profile=profile, access=access)
            p = preds[i]
            k += 1
            bar.note(case.name)
            steps = timed_steps_for(p.iteration_us, cfg.steps, cfg.timed_seconds, cfg.max_steps)
            m = None
            for attempt in range(2):  # one retry: a rank can die on a loaded machine
                try:
                    m = run_measured(plan_path, cfg.data, cfg.format, case.plan.world_size, steps,
                                     cfg.warmup, out_dir / "plans", timeout_s=cfg.run_timeout,
                                     tag=f".{r + 1}" if r else "")
                    break
                except ValidateError as exc:
                    log(f"validate:   run failed{' (retrying)' if attempt == 0 else ''}: {exc}")
                    if attempt == 1:
                        failed.append({"name": case.name, "plan_file": str(plan_path), "error": str(exc)})
                        dead.add(i)
            bar.update()
            if m is None:
                continue
            measured[i].append(m)
            # the error is known only after the refit (when there is one): here the measurement alone
            final = "" if cfg.fit_plans else (f", predicted {duration_us(p.iteration_us)}, error "
                                              f"{(p.iteration_us - m.iteration_us) / m.iteration_us:+.1%}")
            log(f"validate: [{k}/{len(cases) * passes}] {case.name} ({case.role}): measured "
                f"{duration_us(m.iteration_us)}{final}")
    bar.close()
    for i, case in enumerate(cases):
        if i in dead:
            continue
        m, p = merge_passes(measured[i]), preds[i]
        rec = compare(case, m, p)
        rec["plan_file"] = str(paths[i])
        rec["timed_steps"] = m.timed_steps
        if len(measured[i]) > 1:
            rec["passes_measured_us"] = [round(x.iteration_us, 1) for x in measured[i]]
        results.append(rec)
        runs.append((case, m, p))
    result: dict[str, Any] = {"hardware": hw.name, "model": model.name, "data": str(cfg.data),
                              "steps": cfg.steps, "timed_seconds": cfg.timed_seconds, "max_steps": cfg.max_steps,
                              "warmup": cfg.warmup, "repeats": passes, "worlds": list(worlds),
                              "variants": {"mode": cfg.variants.value, "skipped": varied.skipped}}
    validated = [r for r in results if r["role"] == "validate"]
    if not validated:
        raise ValidateError(f"no plan could be run and validated ({len(failed)} failed: {failed[0]['error'] if failed else '-'})")
    choice = None
    if cfg.fit_plans:
        fit_runs = [(c, m, p.iteration_us) for c, m, p in runs if c.role == "fit"]
        choice = choose_refit(hw, fit_runs, profile, access)
        log(f"validate: {choice['why']}")
    if choice is not None and choice["kept"] == Kept.MICROBENCH:
        fit_report = (refit_on_runs(hw, [(c, m) for c, m, _p in fit_runs], profile, access)[1] if fit_runs
                      else {"fit_plans": [], "op_classes": {}, "host_gaps": {}})
        result["refit"] = {**fit_report, "choice": choice}
        result["microbench_only"] = summary(validated)
        refined_path = Path(cfg.save_refined or out_dir / "hardware.refined.json")
        hw.save(refined_path)  # the kept rates: the measured ones
        result["refined_hardware"] = str(refined_path)
    elif choice is not None:
        refined, fit_report = refit_on_runs(hw, [(c, m) for c, m, _p in fit_runs], profile, access)
        fit_report["choice"] = choice
        for j, (rec, (c, m, _p)) in enumerate(zip(results, runs)):
            p2 = predict(c.plan, refined, profile, access)
            runs[j] = (c, m, p2)  # the report's simulated timelines are the refined predictions too
            rec["unfitted_classes"] = unfitted_classes(p2.graph, c.plan.world_size, fit_report["op_classes"], m.op_us)
            rec["predicted_us_microbench"] = rec["predicted_us"]
            rec["predicted_us"] = round(p2.iteration_us, 1)
            rec["error"] = round((p2.iteration_us - m.iteration_us) / m.iteration_us, 4)
            rec["abs_error"] = abs(rec["error"])
            pops = by_base_name(p2.op_us)
            for o in rec["dominant_ops"]:
                v = pops.get(o["op"])
                o["predicted_us"] = None if v is None else round(v, 1)
                o["error"] = None if v is None else round((v - o["measured_us"]) / o["measured_us"], 4)
        result["refit"] = fit_report
        fit_worlds = {c.plan.world_size for c, _m, _p in runs if c.role == "fit"}
        for w in sorted({c.plan.world_size for c, _m, _p in runs} - fit_worlds):
            log(f"validate: warning: no fit plan ran at {w} rank(s); plans there are predicted from other "
                "world sizes' coefficients (see 'op classes not fitted at its world' in the results)")
        # how much of the error sits in plans whose ops the fit never ran at their world size
        extrap = [r for r in validated if r.get("unfitted_classes")]
        result["unfitted"] = {"plans": len(extrap), "mape_those": summary(extrap)["mape"] if extrap else None,
                              "mape_others": summary([r for r in validated if not r.get("unfitted_classes")])["mape"]
                              if len(extrap) < len(validated) else None}
        result["microbench_only"] = summary(validated, "predicted_us_microbench")
        refined_path = Path(cfg.save_refined or out_dir / "hardware.refined.json")
        refined.save(refined_path)
        result["refined_hardware"] = str(refined_path)
    if choice is not None:  # the errors the results hold, now that the rates are chosen
        kept = "after the refit" if choice["kept"] != Kept.MICROBENCH else "with the measured rates"
        for rec in validated:
            log(f"validate: {rec['name']}: measured {duration_us(rec['measured_us'])}, predicted {kept} "
                f"{duration_us(rec['predicted_us'])}, error {rec['error']:+.1%}")
    s = summary(validated)
    result.update({
        "plans": len(validated), "plans_fit": len(results) - len(validated), "plans_total": len(results),
        "mape": s["mape"], "spearman": s["spearman"], "summary": s,
        "goal": {"mape_max": 0.10, "spearman_min": 0.9,
                 "met": bool(s["mape"] is not None and s["mape"] <= 0.10 and (s["spearman"] or 0) >= 0.9)},
        "summary_by_world": {str(w): summary([r for r in validated if r["knobs"].get("world") == w])
                             for w in worlds if any(r["knobs"].get("world") == w for r in validated)},
        "op_errors": op_error_summary(validated),
        "per_plan": results,
        "failed": failed,
        "wall_s": round(time.perf_counter() - t_start, 1),
        "machine": machine(),
    })
    write_json(out_dir / "validate.json", result)
    return result, runs


def machine() -> dict[str, Any]:
    """The machine a result was measured on (benchmarks record it too)."""
    import platform

    import torch

    return {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "platform": platform.platform(), "torch": torch.__version__, "python": platform.python_version()}


def write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, default=json_default))


def json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)
