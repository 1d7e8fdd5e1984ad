"""`picasso validate`: run a sweep of plans for real and hold the simulator's predictions against them.

Per plan: the executor runs it (`picasso run`, a few steps after warm-up) and writes a
measured Timeline; lowering + the simulator predict it with the calibrated spec (the
factors of the plan's world size, `simulator.calibration.spec_for_world`). Compared:
iteration time (median measured step against the simulated iteration) and, for the ops
that dominate the measured step, per-op durations. Summary: MAPE and Spearman rank
correlation over the validated plans.

With `--fit-plans K`, K plans of the sweep (every n-th, so they span the knobs) form a
fit set: the simulator's coefficients are refined on what their timelines measure op by
op (`refit_on_runs`: per op class and world size, compute ops and collectives; the host
time outside the ops, per step and per op) and the others are validated with the refined
spec; the microbenchmark-only figures are reported beside them. Fit and validated plans
never overlap.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from executor.result import RunResult
from planner.builders import Case, build_sweep
from planner.op_names import op_class

# After the per-op fits (compute, collectives, host gaps: all measured per op), the
# iteration-level refit only corrects what ops alone do not show: its collective factors
# stay within e**REFINE_BOUND of the per-op fit.
REFINE_BOUND = 1.0
DOMINANT_SHARE = 0.8  # per-op errors for the ops making up this share of measured op time
MAX_DOMINANT = 6


class ValidateError(ValueError):
    """A stage of validation could not run; one line saying which and why."""


@dataclass
class Measured:
    iteration_us: float
    samples_per_s: float
    op_us: dict[str, float]  # mean duration per op name over ranks and timed steps
    timeline: Any  # simulator.timeline.Timeline (timed steps only)
    result: RunResult | None = None  # the executor's (first pass's when passes merge)
    wall_s: float = 0.0
    passes_iteration_us: list[float] = field(default_factory=list)
    timed_steps: int = 0


@dataclass
class Predicted:
    iteration_us: float
    op_us: dict[str, float]
    timeline: Any
    graph: Any = None


# ----------------------------------------------------------------------------- running


def run_measured(
    plan_path: Path, data: str, fmt: str, world: int, steps: int, warmup: int, out_dir: Path,
    timeout_s: float = 300.0, preload: bool = True, tag: str = "",
) -> Measured:
    """Run one saved plan through the executor (`executor.launch`) and read its measurements.

    The ranks run in their own processes; rank 0 writes the RunResult that launch returns.
    With `preload` every batch is read and prepared before the timed steps: the simulator
    predicts the training step, and a loader thread parsing the next batch meanwhile
    would add time it does not model (and more so at 4 ranks on 2 cores)."""
    from executor.launch import LaunchError, launch

    trace = out_dir / f"{plan_path.stem}.measured{tag}.json"
    extra = ["--warmup", str(warmup), "--timeline", str(trace), *(["--preload"] if preload else [])]
    t0 = time.perf_counter()
    try:
        res = launch(str(plan_path), data, fmt, nproc=world, steps=steps + warmup, extra=extra, timeout_s=timeout_s)
    except (LaunchError, ValueError, OSError) as exc:
        raise ValidateError(f"run of {plan_path.name} failed: {exc}") from None
    wall = time.perf_counter() - t0
    timeline = load_timeline(trace)
    timed = drop_warmup(timeline, warmup)
    it = res.iteration_us() if res.timed_steps else 0.0
    if it <= 0:  # no step timed by the executor: the spans of the timed steps in its trace
        spans = step_times_us(timed)
        if not spans:
            raise ValidateError(f"run of {plan_path.name}: no timed step")
        it = float(np.median(spans))
    return Measured(it, res.samples_per_s, mean_op_durations(timed), timed, res, wall, [it], res.timed_steps)


PASS_STEP_OFFSET = 1_000_000  # step numbers of pass r are shifted by r times this when passes merge
PASS_TIME_OFFSET_US = 1e12  # ... and their times, so that no two passes' events overlap


def merge_passes(ms: list[Measured]) -> Measured:
    """One measurement from runs of the same plan at different moments: the iteration is
    the mean of the runs' medians; op durations and host gaps come from all their timed
    steps together (steps and times of run r shifted apart, so no two runs' steps mix)."""
    from simulator.timeline import Event, Timeline

    if len(ms) == 1:
        return ms[0]
    events = []
    for r, m in enumerate(ms):
        for e in m.timeline.events:
            args = dict(e.args)
            args["step"] = int(args.get("step", 0)) + r * PASS_STEP_OFFSET
            events.append(Event(e.rank, e.lane, e.name, e.start_us + r * PASS_TIME_OFFSET_US, e.dur_us, args))
    tl = Timeline(events, dict(ms[0].timeline.meta))
    return Measured(float(np.mean([m.iteration_us for m in ms])), float(np.mean([m.samples_per_s for m in ms])),
                    mean_op_durations(tl), tl, ms[0].result, float(sum(m.wall_s for m in ms)),
                    [m.iteration_us for m in ms], sum(m.timed_steps for m in ms))


def timed_steps_for(predicted_us: float, min_steps: int, timed_s: float, max_steps: int) -> int:
    """Timed steps for a plan: at least `min_steps`, more until the (predicted) timed
    window reaches `timed_s` seconds, at most `max_steps`. A shared machine slows down in
    spells of a fraction of a second (steps of one run measured here: ten at 24 ms, then
    thirty at 18 ms), so a median over a few fast steps lands on whichever spell it met
    (run medians 17-21 ms over 5 steps, 19.0-20.0 ms over 40)."""
    if predicted_us <= 0 or timed_s <= 0:
        return min_steps
    want = int(np.ceil(timed_s * 1e6 / predicted_us))
    return int(max(min_steps, min(max_steps, want)))


def load_timeline(path: Path) -> Any:
    """A Timeline JSON, or a Chrome trace (traceEvents) turned back into a Timeline."""
    from simulator.timeline import Timeline

    if not path.is_file():
        raise ValidateError(f"{path}: the executor wrote no trace")
    d = json.loads(path.read_text())
    if "events" in d:
        return Timeline.from_dict(d)
    tl = Timeline(meta=dict(d.get("otherData", {})))
    lanes: dict[tuple[int, int], str] = {}
    for e in d.get("traceEvents", []):
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            lanes[(e["pid"], e["tid"])] = e["args"]["name"]
    for e in d.get("traceEvents", []):
        if e.get("ph") == "X":
            tl.add(int(e["pid"]), lanes.get((e["pid"], e["tid"]), str(e["tid"])), e["name"], float(e["ts"]),
                   float(e["dur"]), **dict(e.get("args", {})))
    return tl


def drop_warmup(tl: Any, warmup: int) -> Any:
    """Events of the timed steps only (events carry `step`; those without are kept)."""
    from simulator.timeline import Timeline

    keep = [e for e in tl.events if int(e.args.get("step", warmup)) >= warmup]
    return Timeline(keep, dict(tl.meta))


COMM_LANE = "comm"


def service_durations(tl: Any) -> list[tuple[Any, float]]:
    """(event, duration) with collectives counted from when their lane is free.

    A rank's collectives run one after another in launch order (gloo and NCCL queue them),
    so an exchange launched while another is in flight waits in the queue before it
    runs. Its span from launch to completion holds that wait; the simulator runs the comm
    lane in order too and starts an op when the previous one ends. On lane "comm" each
    event counts from max(its start, the end of the rank's previous comm event)."""
    out: list[tuple[Any, float]] = []
    comm: dict[int, list[Any]] = defaultdict(list)
    for e in tl.events:
        if e.lane == COMM_LANE:
            comm[e.rank].append(e)
        else:
            out.append((e, e.dur_us))
    for evs in comm.values():
        busy = float("-inf")
        for e in sorted(evs, key=lambda e: (e.start_us, e.end_us)):
            out.append((e, max(e.end_us - max(e.start_us, busy), 0.0)))
            busy = max(busy, e.end_us)
    return out


def mean_op_durations(tl: Any) -> dict[str, float]:
    """Per op name: the mean over ranks of the per-step duration (summed within a step);
    collectives by `service_durations`."""
    acc: dict[tuple[str, int, int], float] = defaultdict(float)
    for e, dur in service_durations(tl):
        acc[(e.name, e.rank, int(e.args.get("step", 0)))] += dur
    per: dict[str, list[float]] = defaultdict(list)
    for (name, _r, _s), v in acc.items():
        per[name].append(v)
    return {k: float(np.mean(v)) for k, v in per.items()}


def host_gap(tl: Any) -> tuple[float, float]:
    """(median untimed host time per rank and step in us, mean compute ops per rank and
    step): a step's span on a rank less the union of its timed ops and collectives, i.e. the
    Python between ops and whatever the step does outside them (simulator.calibration.
    fit_host_gaps models it)."""
    by: dict[tuple[int, int], list[Any]] = defaultdict(list)
    for e in tl.events:
        by[(e.rank, int(e.args.get("step", 0)))].append(e)
    gaps, ops = [], []
    for evs in by.values():
        evs.sort(key=lambda e: e.start_us)
        covered, cur_s, cur_e = 0.0, evs[0].start_us, evs[0].end_us
        for e in evs[1:]:
            if e.start_us > cur_e:
                covered += cur_e - cur_s
                cur_s, cur_e = e.start_us, e.end_us
            else:
                cur_e = max(cur_e, e.end_us)
        covered += cur_e - cur_s
        gaps.append(max(max(e.end_us for e in evs) - evs[0].start_us - covered, 0.0))
        ops.append(sum(1 for e in evs if e.lane != COMM_LANE))
    if not gaps:
        return 0.0, 0.0
    return float(np.median(gaps)), float(np.mean(ops))


def step_times_us(tl: Any) -> list[float]:
    """Per timed step: from the first op start to the last op end over all ranks."""
    lo: dict[int, float] = {}
    hi: dict[int, float] = {}
    for e in tl.events:
        s = int(e.args.get("step", 0))
        lo[s] = min(lo.get(s, e.start_us), e.start_us)
        hi[s] = max(hi.get(s, e.end_us), e.end_us)
    return [hi[s] - lo[s] for s in sorted(lo)]


def predict(plan: Any, hw: Any, profile: Any = None, access: Any = None, engine: str = "fast") -> Predicted:
    """Lower the plan on `hw` (already set to the plan's world size) and simulate one iteration."""
    from planner.lowering import lower
    from simulator.engine import simulate

    low = lower(plan, hw, profile=profile, access=access, check_memory=False)
    res = simulate(low.graph, hw, engine=engine)
    tl = res.timeline
    return Predicted(float(res.iteration_us), mean_op_durations(tl), tl, low.graph)


def predict_tagged(plan: Any, hw: Any, profile: Any = None, access: Any = None, engine: str = "fast") -> Predicted:
    """The calibrated prediction, through the one path `picasso plan` and `simulate` take."""
    from planner.access import table_access
    from planner.search import evaluate

    ev = evaluate(plan, hw, access if access is not None else table_access(plan.model, profile), engine,
                  symmetric=None, check_memory=False)
    if ev.iteration_us is None:
        raise ValidateError(f"plan {plan.notes.get('label', '')}: {ev.problem}")
    tl = ev.result.timeline
    return Predicted(float(ev.iteration_us), mean_op_durations(tl), tl, ev.graph)


def unfitted_classes(graph: Any, world: int, fitted: dict[str, Any]) -> list[str]:
    """The op classes of a lowered graph that the fit plans never ran at its world size
    (`fitted`: refit_on_runs' report of op classes, with the worlds each was fitted at):
    their coefficients there are extrapolated from other worlds or from the
    microbenchmarks, so a plan made of them is predicted with less behind it."""
    from simulator.calibration import class_key

    out = set()
    for _, a in graph.ops():
        cls = class_key(op_class(a["name"]), a.get("collective") is not None)
        if str(int(world)) not in (fitted.get(cls) or {}).get("worlds", {}):
            out.add(cls)
    return sorted(out)


def refit_on_runs(hw: Any, fit: list[tuple[Case, Measured]], profile: Any, access: Any,
                  fixed: bool = True, keys: tuple[str, ...] | None = None) -> tuple[Any, dict[str, Any]]:
    """Refine `hw` on the fit plans' measurements: per op class and world size, the fixed
    cost and rate of compute ops and of collectives from their op timings
    (simulator.calibration.fit_op_classes), the untimed host time per step and per op from
    their timelines (fit_host_gaps, host_gap), then multiplicative factors of `keys`
    (default: collective latency and bandwidths) from their iteration times
    (refine_iterations)."""
    from planner.lowering import lower
    from simulator.calibration import fit_host_gaps, fit_op_classes, refine_iterations, spec_for_world

    if not fit:
        raise ValidateError("--fit-plans: no fit plan could be run")

    def graph(c: Case) -> Any:
        return lower(c.plan, spec_for_world(hw, c.plan.world_size), profile=profile, access=access,
                     check_memory=False).graph

    spec1, classes = fit_op_classes(hw, [(graph(c), c.plan.world_size, m.op_us) for c, m in fit], op_class,
                                    fixed=fixed)
    spec1, gaps = fit_host_gaps(spec1, [(c.plan.world_size, *host_gap(m.timeline)[::-1]) for c, m in fit])
    # then the fit plans' iterations: what the ops alone do not show (ranks waiting for each
    # other at a collective, compute slowed by collectives in flight) as global collective
    # factors, bounded (REFINE_BOUND): a few single runs on a shared machine must not carry
    # the model after whichever plan another process slowed down
    kw = {} if keys is None else {"keys": keys}
    spec2, it = refine_iterations(spec1, [(graph(c), c.plan.world_size, m.iteration_us) for c, m in fit], op_class,
                                  fit_gap=False, bound=REFINE_BOUND, **kw)
    return spec2, {"fit_plans": [c.name for c, _ in fit], "op_classes": classes, "host_gaps": gaps,
                   "iterations": it}


# ----------------------------------------------------------------------------- comparing


def one_step(tl: Any) -> Any:
    """The median timed step of a measured timeline (the Gantt of one iteration)."""
    from simulator.timeline import Timeline

    steps = sorted({int(e.args.get("step", 0)) for e in tl.events})
    if not steps:
        return tl
    s = steps[len(steps) // 2]
    return Timeline([e for e in tl.events if int(e.args.get("step", 0)) == s], dict(tl.meta))


def dominant_ops(measured: dict[str, float], share: float = DOMINANT_SHARE, most: int = MAX_DOMINANT) -> list[str]:
    """The ops that make up `share` of the measured op time, largest first."""
    total = sum(measured.values()) or 1.0
    out, acc = [], 0.0
    for name, v in sorted(measured.items(), key=lambda kv: -kv[1]):
        if acc >= share * total or len(out) >= most:
            break
        out.append(name)
        acc += v
    return out


def by_base_name(op_us: dict[str, float]) -> dict[str, float]:
    """Per-step op time summed over micro-batches (`@mbK` dropped): the executor and lowering
    may split an op over micro-batches differently (the input copy), the sum compares."""
    from planner.op_names import base_name

    out: dict[str, float] = defaultdict(float)
    for k, v in op_us.items():
        out[base_name(k)] += v
    return dict(out)


def compare(case: Case, m: Measured, p: Predicted) -> dict[str, Any]:
    err = (p.iteration_us - m.iteration_us) / m.iteration_us
    ops = []
    mops, pops = by_base_name(m.op_us), by_base_name(p.op_us)
    for name in dominant_ops(mops):
        pred = pops.get(name)
        ops.append({
            "op": name, "measured_us": round(mops[name], 1),
            "predicted_us": None if pred is None else round(pred, 1),
            "error": None if pred is None else round((pred - mops[name]) / mops[name], 4),
        })
    return {
        "name": case.name, "role": case.role, "knobs": case.knobs,
        "measured_us": round(m.iteration_us, 1), "predicted_us": round(p.iteration_us, 1),
        "error": round(err, 4), "abs_error": round(abs(err), 4),
        "samples_per_s": round(m.samples_per_s, 1), "dominant_ops": ops,
        "run_wall_s": round(m.wall_s, 2),
    }


def summary(records: list[dict[str, Any]], key_pred: str = "predicted_us") -> dict[str, Any]:
    """MAPE, Spearman and Pearson over records (predicted vs measured iteration)."""
    from scipy.stats import pearsonr, spearmanr

    meas = np.array([r["measured_us"] for r in records], dtype=float)
    pred = np.array([r[key_pred] for r in records], dtype=float)
    if len(meas) == 0:
        return {"plans": 0, "mape": None, "spearman": None}
    ape = np.abs(pred - meas) / meas
    out: dict[str, Any] = {
        "plans": int(len(meas)),
        "mape": float(ape.mean()),
        "median_ape": float(np.median(ape)),
        "max_ape": float(ape.max()),
        "within_10pct": int((ape <= 0.10).sum()),
    }
    if len(meas) >= 3 and np.ptp(meas) > 0 and np.ptp(pred) > 0:
        out["spearman"] = float(spearmanr(pred, meas).statistic)
        out["pearson"] = float(pearsonr(pred, meas).statistic)
    else:
        out["spearman"] = None
    return out


def op_error_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per base op (micro-batch suffix dropped, pack names generalised): mean signed and
    absolute error over the plans where it dominated."""
    from planner.op_names import base_name, split_name

    acc: dict[str, list[float]] = defaultdict(list)
    for r in records:
        for o in r["dominant_ops"]:
            if o["error"] is None:
                continue
            phase, scope, op, _ = split_name(base_name(o["op"]))
            scope = scope if scope in ("dense", "input") else "pack"
            acc[f"{phase}/{scope}/{op}"].append(o["error"])
    return {k: {"n": len(v), "mean_error": round(float(np.mean(v)), 4),
                "mean_abs_error": round(float(np.mean(np.abs(v))), 4)} for k, v in sorted(acc.items())}


# ----------------------------------------------------------------------------- the workflow


def load_profile(data: str, fmt: str, out_dir: Path, log: Any = None) -> Any:
    """Profile the data with traces/ (cached as profile.json beside the results)."""
    from traces.profile import AccessProfile, profile_file

    path = out_dir / "profile.json"
    if path.exists() and path.stat().st_mtime >= Path(data).stat().st_mtime:
        return AccessProfile.load(path)
    if log:
        log(f"validate: profiling {data} ...")
    prof = profile_file(data, fmt)
    prof.save(path)
    return prof


def run_validate(args: Any) -> tuple[dict[str, Any], list[Any]]:
    """The sweep: build plans, run each, predict each, compare. Returns (result, cases)."""
    from planner.access import table_access
    from planner.presets import get_model
    from simulator.calibration import spec_for_world
    from simulator.hardware import load_hardware

    log = args.log if getattr(args, "log", None) else (lambda m: None)
    out_dir = Path(args.out_dir)
    (out_dir / "plans").mkdir(parents=True, exist_ok=True)
    if not Path(args.data).is_file():
        raise ValidateError(f"{args.data}: no such data file")
    hw = load_hardware(args.hardware)
    model = get_model(args.model)
    if args.row_cap:
        model = model.with_row_cap(args.row_cap)
    profile = load_profile(args.data, args.format, out_dir, log)
    access = table_access(model, profile)
    worlds = tuple(n for n in (1, 2, 4, 8) if n <= args.nproc_max)
    batches = tuple(int(b) for b in args.batch_sizes)
    cases = build_sweep(model, access, lambda w: spec_for_world(hw, w), n_plans=args.plans, worlds=worlds,
                        batches=batches, include_planner=not args.no_planner, fit_count=args.fit_plans)
    results, runs, failed = [], [], []
    t_start = time.perf_counter()
    passes = max(1, int(getattr(args, "repeats", 1)))
    measured: list[list[Measured]] = [[] for _ in cases]
    preds: list[Any] = [None] * len(cases)
    dead: set[int] = set()
    paths = [out_dir / "plans" / f"{i:02d}-{case.name}.json" for i, case in enumerate(cases)]
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
            log(f"validate: [{i + 1}/{len(cases)}]{f' pass {r + 1}/{passes}' if passes > 1 else ''} "
                f"{case.name} ({case.role}) ...")
            steps = timed_steps_for(p.iteration_us, args.steps, float(getattr(args, "timed_seconds", 0.0)),
                                    int(getattr(args, "max_steps", args.steps)))
            m = None
            for attempt in range(2):  # one retry: a rank can die on a loaded machine
                try:
                    m = run_measured(plan_path, args.data, args.format, case.plan.world_size, steps,
                                     args.warmup, out_dir / "plans", timeout_s=args.run_timeout,
                                     tag=f".{r + 1}" if r else "")
                    break
                except ValidateError as exc:
                    log(f"validate:   run failed{' (retrying)' if attempt == 0 else ''}: {exc}")
                    if attempt == 1:
                        failed.append({"name": case.name, "plan_file": str(plan_path), "error": str(exc)})
                        dead.add(i)
            if m is None:
                continue
            measured[i].append(m)
            log(f"validate:   measured {m.iteration_us / 1e3:8.2f} ms  predicted {p.iteration_us / 1e3:8.2f} ms  "
                f"error {(p.iteration_us - m.iteration_us) / m.iteration_us:+.1%}")
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
    result: dict[str, Any] = {"hardware": hw.name, "model": model.name, "data": str(args.data),
                              "steps": args.steps, "timed_seconds": getattr(args, "timed_seconds", 0.0),
                              "max_steps": getattr(args, "max_steps", args.steps), "warmup": args.warmup,
                              "repeats": passes,
                              "worlds": list(worlds)}
    validated = [r for r in results if r["role"] == "validate"]
    if not validated:
        raise ValidateError(f"no plan could be run and validated ({len(failed)} failed: {failed[0]['error'] if failed else '-'})")
    if args.fit_plans:
        refined, fit_report = refit_on_runs(hw, [(c, m) for c, m, _ in runs if c.role == "fit"], profile, access)
        for j, (rec, (c, m, _p)) in enumerate(zip(results, runs)):
            p2 = predict_tagged(c.plan, refined, profile, access)
            runs[j] = (c, m, p2)  # the report's simulated timelines are the refined predictions too
            rec["unfitted_classes"] = unfitted_classes(p2.graph, c.plan.world_size, fit_report["op_classes"])
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
        refined_path = Path(getattr(args, "save_refined", None) or out_dir / "hardware.refined.json")
        refined.save(refined_path)
        result["refined_hardware"] = str(refined_path)
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
    import platform

    import torch

    return {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "platform": platform.platform(), "torch": torch.__version__, "python": platform.python_version()}


def write_json(path: str | os.PathLike, obj: Any) -> None:
    from simulator.report import write_report

    write_report(path, json.dumps(obj, indent=1, default=_json_default))


# ----------------------------------------------------------------------------- report and command


def validation_sections(result: dict[str, Any], runs: list[Any]) -> list[Any]:
    """Report sections: summary, scatter, per-plan table, per-op errors, one timeline pair."""
    from simulator.export import timeline_figure
    from simulator.report import Section, bar_figure, scatter_figure, table_html

    s = result["summary"]
    met = result["goal"]["met"]
    lines = [
        f"<p>{s['plans']} validated plans ({result.get('plans_fit', 0)} more used to fit). "
        f"MAPE <b>{s['mape']:.1%}</b>, Spearman <b>{(s['spearman'] or float('nan')):.3f}</b>, "
        f"{s['within_10pct']} of {s['plans']} within 10%. Goal (MAPE &le; 10%, Spearman &ge; 0.9): "
        f"<span class='{'ok' if met else 'fail'}'>{'met' if met else 'not met'}</span>.</p>"
    ]
    if "microbench_only" in result:
        mb = result["microbench_only"]
        lines.append(f"<p>With microbenchmark calibration only: MAPE {mb['mape']:.1%}, Spearman "
                     f"{(mb['spearman'] or float('nan')):.3f}. Refit on the fit plans' op timings: "
                     f"coefficients per world size for {len(result['refit']['op_classes'])} op classes "
                     "(compute ops and collectives); untimed host time per step "
                     + ", ".join(f"{v['step_us'] / 1e3:.2f} ms at {w} rank(s)"
                                 for w, v in result['refit'].get('host_gaps', {}).get('worlds', {}).items())
                     + (", iteration factors " + ", ".join(
                         f"{k} x{v:.3g}" for k, v in result['refit']['iterations']['factors'].items())
                        if result['refit']['iterations']['factors'] else "")
                     + ".</p>")
    u = result.get("unfitted")
    if u and u["plans"]:
        those, others = (("-" if v is None else f"{v:.1%}") for v in (u["mape_those"], u["mape_others"]))
        lines.append(f"<p>{u['plans']} of {s['plans']} validated plans hold op classes that no fit plan ran at "
                     f"their world size (their coefficients there are extrapolated; listed per plan below): "
                     f"MAPE {those} on those, {others} on the others.</p>")
    rows = [{"plan": r["name"], "role": r["role"], "ranks": r["knobs"].get("world"),
             "batch/rank": r["knobs"].get("batch"), "measured ms": r["measured_us"] / 1e3,
             "predicted ms": r["predicted_us"] / 1e3, "error": f"{r['error']:+.1%}",
             "samples/s": r["samples_per_s"],
             "op classes not fitted at its world": ", ".join(r.get("unfitted_classes", [])) or "-"}
            for r in result["per_plan"]]
    ops = [{"op": k, **v} for k, v in result["op_errors"].items()]
    secs = [
        Section("Predicted against measured", "".join(lines),
                [scatter_figure([{"name": r["name"], "measured_us": r["measured_us"],
                                  "predicted_us": r["predicted_us"]} for r in result["per_plan"]
                                 if r["role"] == "validate"], "Iteration time, validated plans")]),
        Section("Per plan", table_html(rows)),
        Section("Per-op errors of the dominant ops (signed: predicted - measured, over measured)",
                table_html(ops),
                [bar_figure(list(result["op_errors"]),
                            {"mean abs error": [v["mean_abs_error"] for v in result["op_errors"].values()],
                             "mean error": [v["mean_error"] for v in result["op_errors"].values()]},
                            "Per-op error", "relative error")] if ops else []),
    ]
    if runs:
        # The plan with the median error: a typical case, not the best one.
        order = sorted(range(len(runs)), key=lambda i: abs(result["per_plan"][i]["error"]))
        c, m, p = runs[order[len(order) // 2]]
        secs.append(Section(f"Timelines of a typical plan: {c.name}", "",
                            [timeline_figure(p.timeline, "simulated"),
                             timeline_figure(one_step(m.timeline), "measured (median timed step)")]))
    return secs


def run_validate_command(args: Any) -> int:
    import sys

    from simulator.report import render, write_report

    args.log = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    result, runs = run_validate(args)
    out_dir = Path(args.out_dir)
    text = json.dumps(result, indent=1, default=_json_default)
    if args.results:
        write_report(args.results, text)
    if args.html:
        secs = validation_sections(result, runs)
        write_report(args.html, render("picasso validate", secs, side_by_side=[len(secs) - 1]))
    if args.json:
        print(text)
        return 1 if result["failed"] else 0
    s = result["summary"]
    print(f"{'plan':<34} {'role':<8} {'measured ms':>11} {'predicted ms':>12} {'error':>8}")
    for r in result["per_plan"]:
        print(f"{r['name']:<34} {r['role']:<8} {r['measured_us'] / 1e3:11.2f} {r['predicted_us'] / 1e3:12.2f} "
              f"{r['error']:+8.1%}")
    sp = s["spearman"]
    print(f"validated plans: {s['plans']}  MAPE {s['mape']:.1%}  Spearman {sp if sp is None else round(sp, 3)}  "
          f"goal {'met' if result['goal']['met'] else 'not met'} (MAPE <= 10%, Spearman >= 0.9)")
    if "microbench_only" in result:
        mb = result["microbench_only"]
        print(f"microbenchmark calibration only: MAPE {mb['mape']:.1%}  Spearman {mb['spearman']}")
    print(f"results in {out_dir / 'validate.json'}" + (f", report {args.html}" if args.html else ""))
    for f in result["failed"]:
        print(f"FAILED {f['name']}: {f['error']}", file=sys.stderr)
    return 1 if result["failed"] else 0


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)
