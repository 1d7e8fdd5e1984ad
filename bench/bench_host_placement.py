"""Host placement: a plan with a host-placed pack and a device hot cache against its twin with
every pack in device memory, each beside its prediction (speed and host memory).

On CPU ranks (the default) the prediction is calibrated here; the goal is the host plan within 15%
of it at 1 and 2 ranks. With `--device cuda` (one GPU) the plans are the planner's own for
dlrm-mlperf on the h200 preset, row-capped, once with the device shrunk so the largest pack goes
to host memory and once with every table in HBM, run by `picasso run` with its defaults; the goal
is the host plan at >= 0.7x the all-HBM plan's samples/s, within 25% of its own prediction, and its
host RSS within +15% of the plan's host estimate. Both write, per plan, `samples_per_s`,
`predicted_samples_per_s`, `host_rss_bytes` and `predicted_host_bytes`.

Stages, in one command:
1. calibration, as `picasso calibrate` then `picasso validate --fit-plans` do it: the
   microbenchmarks at every world size (validation.calibrate), then the fit plans of the
   validation sweep (planner.builders.build_sweep, none host-placed) run through the
   executor and the spec refined on their op timings (validation.refit.refit_on_runs: per
   world and op class). Nothing of the plans measured in stage 3 enters the fit. With `--work DIR` these
   measurements are kept and reused: the refit runs with the code under test, so two
   versions of the cost model meet the same measurements.
2. the plan: DLRM (Criteo Kaggle preset, row-capped), the packed row-wise layout with the
   hottest `--hot` fraction of each table's rows replicated as a hot cache, and the pack
   holding the largest tables placed in host memory (`placement: host`); the same plan
   with every pack in device memory is its twin.
3. both plans at each world size: predicted through the one prediction path
   (planner.search.evaluate with the calibrated spec, validation.compare.predict) and
   run with `--timeline` (per-op timing on, batches preloaded; validation.measure.run_measured); measured/predicted per step and per op class,
   then the host plan once more under `--verify`.

    flock -x /work/bench.lock python bench/bench_host_placement.py [--worlds 1,2] [--batch 512]
        [--work DIR] [--save-spec FILE] [--out bench/results/host_placement/<machine>.json]
    python bench/bench_host_placement.py --device cuda [--rows 300000] [--cap 8000000] [--batch 65536]
        [--hbm 16GB] [--steps 24] [--out bench/results/host_placement/h200.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

from planner.sharding import Sharding

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from results_path import results_path  # noqa: E402

from executor.process.process_tree import run_tree  # noqa: E402
from executor.process.threads import rank_env  # noqa: E402
from executor.run.memory import predicted_peaks  # noqa: E402
from executor.run.result import RunResult  # noqa: E402
from foundation.files import atomic_write_bytes, check_output_path  # noqa: E402
from planner.op_names import op_class  # noqa: E402
from simulator.measured import drop_warmup, host_gap, load_timeline  # noqa: E402
from validation.compare import predict  # noqa: E402
from validation.measure import measured_from, merge_passes, run_measured, timed_steps_for  # noqa: E402
from validation.refit import refit_on_runs  # noqa: E402

GOAL = 0.15  # |measured / predicted - 1| at most this, per world size
WARMUP = 2  # untimed steps of every run


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- stage 1: the calibrated spec --------------------------------------------------------------


def calibrated(model: Any, profile: Any, access: dict, data: Path, worlds: tuple[int, ...], work: Path,
               fit_count: int, timed_s: float, quick: bool = False) -> tuple[Any, dict[str, Any]]:
    """Microbenchmarks at every world size, then the sweep's fit plans run and refitted on.

    The measurements (the microbenchmarked spec, each fit plan's timeline and run report)
    are kept in `work` and reused when present: the refit itself always runs with the code
    under test, so two versions of the cost model are compared on the same measurements."""
    from planner.builders import build_sweep
    from simulator.calibration import spec_for_world
    from simulator.hardware import load_hardware
    from validation.calibrate import CalibrateConfig, calibrate

    t0 = time.perf_counter()
    micro = work / "microbench.json"
    if micro.is_file():
        hw = load_hardware(str(micro))
    else:
        hw, _ = calibrate(CalibrateConfig(nproc=max(worlds), quick=quick), log=log)
        hw.save(micro)
    t_micro = time.perf_counter() - t0
    cases = build_sweep(model, access, lambda w: spec_for_world(hw, w), n_plans=4 * fit_count, worlds=worlds,
                        batches=(256, 512, 1024))
    fit = fit_cases(cases, worlds, fit_count)
    assert not any(p.placement == "host" for c in fit for p in c.plan.packs), "a fit plan is host-placed"
    (work / "fit").mkdir(exist_ok=True)
    runs = []
    for i, c in enumerate(fit):
        path = work / "fit" / f"{i:02d}-{c.name}.json"
        raw = path.with_suffix(".run.json")
        if raw.is_file():
            runs.append((c, load_measured(path, raw)))
            continue
        c.plan.save(path, hot_ids=c.hot_ids or None)
        pred = predict(c.plan, spec_for_world(hw, c.plan.world_size), profile=profile, access=access)
        steps = timed_steps_for(pred.iteration_us, 8, timed_s, 40)
        log(f"calibrate: fit plan [{i + 1}/{len(fit)}] {c.name} ({steps} timed steps) ...")
        m = run_measured(path, str(data), "criteo", c.plan.world_size, steps, WARMUP, work / "fit")
        raw.write_text(m.result.to_json())
        runs.append((c, m))
    refined, report = refit_on_runs(hw, runs, profile, access)
    return refined, {"fit_plans": [c.name for c in fit], "seconds": round(time.perf_counter() - t0, 1),
                     "microbench_cached": t_micro < 1.0, "work": str(work),
                     "fit_iterations_ms": {c.name: round(m.iteration_us / 1e3, 2) for c, m in runs}}


def fit_cases(cases: list[Any], worlds: tuple[int, ...], count: int) -> list[Any]:
    """`count` fit plans shared out over the world sizes, each world's taken in turn from its
    batch sizes (calibration is per world and op class, and a class's fixed cost and rate
    need sizes apart: a world without fit plans is predicted from another's)."""
    per = -(-count // len(worlds))
    out = []
    for w in worlds:
        by_batch: dict[int, list[Any]] = defaultdict(list)
        for c in cases:
            if c.plan.world_size == w:
                by_batch[c.plan.batch_size_per_rank].append(c)
        queues = [by_batch[b] for b in sorted(by_batch)]
        picked = 0
        while picked < per and any(queues):
            for q in queues:
                if q and picked < per:
                    out.append(q.pop(0))
                    picked += 1
    for c in out:
        c.role = "fit"
    return out


def load_measured(plan_path: Path, raw_path: Path) -> Any:
    """A fit plan's measurement read back from its trace and run report, as run_measured
    reads a fresh run: the executor's median step (RunResult.iteration_us) when it timed
    steps, else the median span of the timed steps in its trace."""
    timed = drop_warmup(load_timeline(plan_path.with_name(f"{plan_path.stem}.measured.json")), WARMUP)
    return measured_from(RunResult.from_json(raw_path.read_text()), timed, f"kept run {raw_path}")


# ---- stage 2: the plans ------------------------------------------------------------------------


def host_plan(model: Any, access: dict, world: int, batch: int, hot: float) -> tuple[Any, dict, str]:
    """The packed row-wise plan with a hot cache; the pack of the largest tables on the host."""
    from planner.builders import r_packed

    plan, ids, _ = r_packed(Sharding.ROW_WISE, hot=hot)(model, world, batch, access, None)
    big = max(plan.packs, key=lambda p: (plan.pack_rows(p) * model.table(p.tables[0]).bytes_per_row, p.name))
    big.placement = "host"
    plan.validate()
    return plan, ids, big.name


def device_twin(plan: Any) -> Any:
    from planner.plan import Plan

    d = plan.to_dict()
    for p in d["packs"]:
        p["placement"] = "hbm"
    return Plan.from_dict(d)


# ---- stage 3: predicted against measured --------------------------------------------------------


def by_class(op_us: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for name, v in op_us.items():
        out[op_class(name)] += v
    return dict(out)


def speed_and_memory(samples: float, predicted_us: float, result: Any) -> dict[str, Any]:
    """The four figures every variant reports: samples/s measured and predicted, host RSS
    measured and the plan's host estimate (a CPU rank's host memory is its only memory)."""
    pm = result.peak_memory if result is not None else None
    if pm is None:
        return {"samples_per_s": None, "predicted_samples_per_s": samples / predicted_us * 1e6,
                "host_rss_bytes": None, "predicted_host_bytes": None}
    predicted_host = pm.predicted_host_bytes_per_rank or pm.predicted_bytes_per_rank
    return {"samples_per_s": result.samples_per_s, "predicted_samples_per_s": samples / predicted_us * 1e6,
            "host_rss_bytes": max(pm.host_rss_bytes_per_rank),
            "predicted_host_bytes": max(predicted_host) if predicted_host else None}


def compare(pred: Any, meas: Any) -> dict[str, Any]:
    pc, mc = by_class(pred.op_us), by_class(meas.op_us)
    classes = {}
    for k in sorted(set(pc) | set(mc), key=lambda k: -mc.get(k, 0.0)):
        p, m = pc.get(k), mc.get(k)
        classes[k] = {"measured_us": None if m is None else round(m, 1), "predicted_us": None if p is None else round(p, 1),
                      "measured_over_predicted": round(m / p, 3) if m and p else None}
    return {"measured_ms": round(meas.iteration_us / 1e3, 3), "predicted_ms": round(pred.iteration_us / 1e3, 3),
            "measured_over_predicted": round(meas.iteration_us / pred.iteration_us, 3),
            "host_gap_ms_per_step": round(host_gap(meas.timeline)[0] / 1e3, 3),
            "passes_ms": [round(x / 1e3, 2) for x in meas.passes_iteration_us or [meas.iteration_us]],
            "op_classes": classes}


def verify(path: Path, data: Path, world: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "picasso", "run", str(path), "--data", str(data), "--format", "criteo",
           "--nproc", str(world), "--steps", "6", "--verify", "--json"]
    env = {**rank_env(world), **os.environ, "PYTHONUNBUFFERED": "1"}  # executor.process.threads' policy; the user's wins
    rc, out, err = run_tree(cmd, env=env, timeout_s=300)
    tail = (err.strip().splitlines() or [""])[-1]
    try:
        res = RunResult.from_json(out[out.index("{"):])
    except ValueError:  # no JSON printed (the run failed: its exit and stderr say why)
        res = None
    ver = asdict(res.verify) if res is not None and res.verify is not None else None
    return {"exit": rc, "verify": ver, "stderr_tail": tail if rc else ""}


# ---- on one GPU: the planner's host plan against its all-HBM twin ------------------------------


def picasso(args: list[str], timeout_s: float) -> tuple[int, dict[str, Any] | None, str]:
    """`picasso ARGS --json`: exit code, the printed JSON (None when the command failed), stderr's last line."""
    env = {**rank_env(1), **os.environ, "PYTHONUNBUFFERED": "1"}
    rc, out, err = run_tree([sys.executable, "-m", "picasso", *args, "--json"], env=env, timeout_s=timeout_s)
    tail = (err.strip().splitlines() or [""])[-1]
    try:
        return rc, json.loads(out[out.index("{"):]), tail
    except ValueError:
        return rc, None, tail


def gpu_main(args: argparse.Namespace) -> int:
    from traces.profile import profile_file
    from traces.synth import generate_criteo

    t_start = time.perf_counter()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-host-gpu-") as t:
        tmp = Path(t)
        data, prof = tmp / "criteo.tsv", tmp / "p.json"
        generate_criteo(data, args.rows, seed=1)
        profile_file(data, "criteo").save(prof)
        base = ["plan", "--model", "dlrm-mlperf", "--hardware", "h200", "--set", "gpus_per_node=1",
                "--row-cap", str(args.cap), "--profile", str(prof), "--batch-size", str(args.batch),
                "--dense-dtype", "bf16"]
        for name, extra in (("host", ["--set", f"gpu.hbm_bytes={args.hbm}"]), ("device", [])):
            path = tmp / f"{name}.json"
            rc, _, tail = picasso([*base, *extra, "-o", str(path)], 300)
            if rc:
                results[name] = {"error": f"plan: exit {rc}: {tail}"}
                continue
            plan = json.loads(path.read_text())
            log(f"run: {name} ({args.steps} steps) ...")
            rc, res, tail = picasso(["run", str(path), "--data", str(data), "--format", "criteo", "--nproc", "1",
                                     "--steps", str(args.steps), "--preload"], 900)
            row: dict[str, Any] = {"placements": [[p["name"], p["placement"]] for p in plan["packs"]]}
            if res is None:
                row["error"] = f"run: exit {rc}: {tail}"
            else:
                result = RunResult.from_dict(res)
                pred_us = args.batch / result.predicted_samples_per_s * 1e6 if result.predicted_samples_per_s else 0
                row.update(speed_and_memory(args.batch, pred_us, result) if pred_us else
                           {"samples_per_s": result.samples_per_s})
                row["peak_device_bytes"] = max(result.peak_memory.measured_bytes_per_rank)
                row["predicted_device_bytes"] = max(result.peak_memory.predicted_bytes_per_rank or [0])
            results[name] = row
        host, dev = results.get("host", {}), results.get("device", {})
        if host.get("samples_per_s"):
            rc, res, tail = picasso(["run", str(tmp / "host.json"), "--data", str(data), "--format", "criteo",
                                     "--nproc", "1", "--steps", "6", "--preload", "--verify"], 900)
            ver = (res or {}).get("verify")
            results["host_verify"] = {"exit": rc, "verify": ver, "stderr_tail": tail if rc else ""}
    goals = {}
    if host.get("samples_per_s") and dev.get("samples_per_s"):
        goals = {
            "host_over_device": host["samples_per_s"] / dev["samples_per_s"],
            "host_over_its_prediction": host["samples_per_s"] / host["predicted_samples_per_s"],
            "host_rss_over_estimate": host["host_rss_bytes"] / host["predicted_host_bytes"],
            "device_memory_over_prediction": host["peak_device_bytes"] / max(host["predicted_device_bytes"], 1),
        }
        goals["met"] = (goals["host_over_device"] >= 0.7 and abs(goals["host_over_its_prediction"] - 1) <= 0.25
                        and goals["host_rss_over_estimate"] <= 1.15 and goals["device_memory_over_prediction"] <= 1.15)
    for name in ("host", "device"):
        r = results.get(name, {})
        print(f"{name:>6}: " + (r.get("error") or f"{r['samples_per_s']:,.0f} samples/s (predicted "
                                f"{r.get('predicted_samples_per_s') or 0:,.0f}), host RSS "
                                f"{(r.get('host_rss_bytes') or 0) / 2**30:.2f} GiB (estimate "
                                f"{(r.get('predicted_host_bytes') or 0) / 2**30:.2f} GiB)"))
    print(f"goals: {goals or 'not measured'}")
    import torch

    out = {"bench": "host_placement", "device": "cuda",
           "machine": {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                       "torch": torch.__version__},
           "config": {"model": "dlrm-mlperf", "row_cap": args.cap, "batch": args.batch, "hbm": args.hbm,
                      "rows": args.rows, "steps": args.steps, "dense_dtype": "bf16",
                      "data": "traces.synth.generate_criteo(seed=1)"},
           "goals": goals, "results": results, "wall_s": round(time.perf_counter() - t_start, 1)}
    atomic_write_bytes(Path(args.out), (json.dumps(out, indent=1, default=float) + "\n").encode())
    print(f"wrote {args.out}")
    return 0 if goals.get("met") else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, help="synthetic Criteo rows (cpu 50,000; cuda 300,000)")
    ap.add_argument("--cap", type=int, help="row cap of every table (cpu 50,000; cuda 8,000,000)")
    ap.add_argument("--batch", type=int, help="batch size per rank (cpu 512; cuda 65,536)")
    ap.add_argument("--hot", type=float, default=0.05, help="hot fraction of each table's rows")
    ap.add_argument("--worlds", default="1,2")
    ap.add_argument("--fit-plans", type=int, default=8, help="sweep plans run to refine the calibration")
    ap.add_argument("--timed-seconds", type=float, default=1.5, help="timed window per run (more steps, steadier)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each plan (alternating), medians averaged")
    ap.add_argument("--work", help="folder keeping the calibration's measurements (reused when present)")
    ap.add_argument("--save-spec", help="write the calibrated spec here")
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer microbenchmark sizes (a smoke test)")
    ap.add_argument("--lock", default="flock -x /work/bench.lock", help="how the run was serialised (recorded)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: the planner's dlrm-mlperf plans on one GPU, host-placed against all-HBM")
    ap.add_argument("--hbm", default="16GB", help="(cuda) the device memory the host plan is made for")
    ap.add_argument("--steps", type=int, default=24, help="(cuda) steps of each run")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    sizes = (300_000, 8_000_000, 65_536) if args.device == "cuda" else (50_000, 50_000, 512)
    args.rows, args.cap, args.batch = (given or default for given, default in
                                       zip((args.rows, args.cap, args.batch), sizes))
    args.out = args.out or str(results_path("host_placement"))
    try:  # a bad --out fails now, not after minutes of measuring
        check_output_path(args.out)
    except OSError as exc:
        print(f"error: --out {exc}", file=sys.stderr)
        return 2
    if args.device == "cuda":
        return gpu_main(args)

    from planner.access import table_access
    from planner.presets import get_model
    from traces.profile import profile_file
    from traces.synth import generate_criteo

    worlds = tuple(int(w) for w in args.worlds.split(","))
    model = get_model("dlrm-criteo-kaggle").with_row_cap(args.cap)
    t_start = time.perf_counter()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-host-") as t:
        tmp = Path(t)
        data = tmp / "criteo.tsv"
        generate_criteo(data, args.rows, seed=1)
        profile = profile_file(data, "criteo")
        access = table_access(model, profile)
        work = Path(args.work) if args.work else tmp / "calibration"
        work.mkdir(parents=True, exist_ok=True)
        hw, cal = calibrated(model, profile, access, data, worlds, work, args.fit_plans, args.timed_seconds,
                             args.quick)
        if args.save_spec:
            hw.save(args.save_spec)
        for world in worlds:
            plan, ids, big = host_plan(model, access, world, args.batch, args.hot)
            twin = device_twin(plan)
            row: dict[str, Any] = {"host_pack": big, "packs": [[p.name, len(p.tables), p.placement, p.hot_sync]
                                                                for p in plan.packs],
                                   "hot_rows": int(sum(plan.hot_rows.values()))}
            paths, preds = {}, {}
            for name, p in (("host", plan), ("device", twin)):
                paths[name] = tmp / f"{name}-w{world}.json"
                p.save(paths[name], hot_ids=ids)
                preds[name] = predict(p, hw, profile, access)
            steps = timed_steps_for(preds["host"].iteration_us, 10, args.timed_seconds, 60)
            runs: dict[str, list[Any]] = {"host": [], "device": []}
            for r in range(args.repeats):  # alternating: the machine's drift hits both alike
                for name in ("host", "device"):
                    log(f"run: {name} placement at {world} rank(s), pass {r + 1} ({steps} timed steps) ...")
                    runs[name].append(run_measured(paths[name], str(data), "criteo", world, steps, WARMUP + 1, tmp,
                                                     tag=f".{r}"))
            for name in ("host", "device"):
                merged = merge_passes(runs[name])
                row[name] = compare(preds[name], merged)
                row[name].update(speed_and_memory(args.batch * world, preds[name].iteration_us, merged.result))
                if row[name]["predicted_host_bytes"] is None:  # the launch here attaches no memory prediction
                    peaks = predicted_peaks(plan if name == "host" else twin, "cpu", str(data), "criteo", True,
                                            steps + WARMUP + 1, False)
                    row[name]["predicted_host_bytes"] = max(peaks["predicted_bytes_per_rank"])
            if not args.no_verify:
                row["verify"] = verify(paths["host"], data, world)
            results[str(world)] = row
    print(f"{'ranks':>5} {'placement':>9} {'measured ms':>11} {'predicted ms':>12} {'meas/pred':>9}")
    for w, row in results.items():
        for name in ("host", "device"):
            x = row[name]
            print(f"{w:>5} {name:>9} {x['measured_ms']:>11.2f} {x['predicted_ms']:>12.2f} "
                  f"{x['measured_over_predicted']:>9.3f}")
        for k, c in row["host"]["op_classes"].items():
            if (c["measured_us"] or 0) > 200 or (c["predicted_us"] or 0) > 200:
                print(f"{'':>5} {'':>9}   {k:<28} {c['measured_us'] or 0:>9.0f} us {c['predicted_us'] or 0:>9.0f} us"
                      f" {c['measured_over_predicted'] or 0:>6.2f}")
        if "verify" in row:
            print(f"{w:>5} --verify: exit {row['verify']['exit']} {row['verify']['verify']}")
    met = all(abs(r["host"]["measured_over_predicted"] - 1) <= GOAL for r in results.values())
    print(f"goal (host plan within {GOAL:.0%} of its calibrated prediction at {args.worlds} ranks): "
          f"{'met' if met else 'not met'}")
    import torch

    out = {"bench": "host_placement", "goal": {"max_rel_error": GOAL, "met": met},
           "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                       "torch": torch.__version__, "python": platform.python_version(),
                       "load_average_1m_at_end": os.getloadavg()[0]},
           "lock": args.lock,
           "config": {"model": model.name, "rows": args.rows, "batch_per_rank": args.batch, "hot": args.hot,
                      "worlds": list(worlds), "repeats": args.repeats, "timed_seconds": args.timed_seconds,
                      "data": "traces.synth.generate_criteo(seed=1)", "hardware": hw.name},
           "calibration": cal, "results": results, "wall_s": round(time.perf_counter() - t_start, 1)}
    atomic_write_bytes(Path(args.out), (json.dumps(out, indent=1, default=float) + "\n").encode())
    print(f"wrote {args.out}")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
