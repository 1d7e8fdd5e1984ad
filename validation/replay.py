"""Re-run the refit and the predictions of a finished validate sweep from what it saved.

A sweep takes minutes of real runs; its folder keeps everything the fitting needs: the plans
(`plans/NN-name.json`), their measured traces (`plans/NN-name.measured[.R].json`, warm-up
steps included), the profile, and `validate.json` (roles, measured iterations, warm-up). So a
change of the calibration's fitting (or a different starting spec) can be judged on the same
measurements in seconds, with no run repeated: `picasso validate --replay DIR --hardware H`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from foundation import fields
from foundation.documents import read_json
from planner.access import table_access
from planner.builders import Case
from planner.plan import Plan
from simulator.calibration import spec_for_world
from simulator.hardware import HardwareSpec
from simulator.measured import drop_warmup, load_timeline, mean_op_durations, merge_runs
from traces.profile import AccessProfile
from validation.compare import predict, summary
from validation.measure import Measured, ValidateError
from validation.refit import Kept, choose_refit, refit_on_runs


def load_sweep(out_dir: str | Path) -> tuple[dict[str, Any], list[tuple[Case, Measured]], AccessProfile | None]:
    """(validate.json, [(Case, Measured)] of every plan that ran, the profile) of a finished sweep."""
    out = Path(out_dir)
    try:
        result = read_json(out / "validate.json", "validate result")  # bounded in size, nesting and numbers
        warmup, records = _sweep_records(result)
        # a sweep without a profile planned from the model's assumptions (table_access)
        profile = AccessProfile.load(out / "profile.json") if (out / "profile.json").exists() else None
    except fields.FieldError as exc:
        raise ValidateError(f"{out / 'validate.json'}: {exc}") from None
    except (OSError, ValueError) as exc:
        raise ValidateError(f"{out}: not a finished validate sweep ({exc})") from None
    runs = []
    for rec in records:
        plan_path = out / "plans" / Path(rec["plan_file"]).name  # only its name: inside the sweep's plans/
        plan = Plan.load(plan_path)
        traces = sorted(plan_path.parent.glob(plan_path.stem + ".measured*.json"))
        if not traces:
            raise ValidateError(f"{plan_path}: no measured trace beside it")
        timed = [drop_warmup(load_timeline(t), warmup) for t in traces]
        tl = timed[0] if len(timed) == 1 else merge_runs(timed)
        passes = [float(x) for x in rec.get("passes_measured_us") or [rec["measured_us"]]]
        m = Measured(float(rec["measured_us"]), float(rec.get("samples_per_s", 0.0)), mean_op_durations(tl), tl,
                     None, 0.0, passes, int(rec.get("timed_steps", 0)))
        case = Case(rec["name"], plan, plan.load_hot_ids(plan_path), dict(rec.get("knobs") or {}), rec["role"])
        runs.append((case, m))
    return result, runs, profile


def _sweep_records(result: object) -> tuple[int, list[dict]]:
    """validate.json's warm-up and per-plan records, every field the replay reads checked
    (FieldError names it)."""
    fields.mapping(result, "(top level)")
    warmup = fields.integer(result.get("warmup", 0), "warmup", 0)
    records = fields.sequence(result.get("per_plan"), "per_plan")
    for i, rec in enumerate(records):
        w = f"per_plan[{i}]"
        fields.mapping(rec, w)
        for key in ("name", "role", "plan_file"):
            fields.text(rec.get(key), f"{w}.{key}")
        fields.real(rec.get("measured_us"), f"{w}.measured_us", 0.0, lo_open=True)
        fields.real(rec.get("samples_per_s", 0.0), f"{w}.samples_per_s", 0.0)
        fields.integer(rec.get("timed_steps", 0), f"{w}.timed_steps", 0)
        for j, x in enumerate(fields.sequence(rec.get("passes_measured_us") or [], f"{w}.passes_measured_us")):
            fields.real(x, f"{w}.passes_measured_us[{j}]", 0.0, lo_open=True)
        fields.mapping(rec.get("knobs") or {}, f"{w}.knobs")
    return warmup, records


def replay(out_dir: str | Path, hw: HardwareSpec,
           refit: Callable[..., tuple[HardwareSpec, dict[str, Any]]] = refit_on_runs) -> dict[str, Any]:
    """Refit `hw` on the sweep's fit plans and predict its validated plans: per plan the
    measured and predicted iteration, and the summary (MAPE, Spearman) as validate reports it."""
    _, runs, profile = load_sweep(out_dir)
    fit = [(c, m) for c, m in runs if c.role == "fit"]
    if not fit:
        raise ValidateError(f"{out_dir}: the sweep had no fit plans to refit on")
    model = runs[0][0].plan.model
    access = table_access(model, profile)
    refined, report = refit(hw, fit, profile, access)
    # kept only where it predicts held-out fit plans better than the measured rates (choose_refit)
    micro = [predict(c.plan, spec_for_world(hw, c.plan.world_size), profile, access).iteration_us for c, _ in fit]
    report["choice"] = choose_refit(hw, [(c, m, us) for (c, m), us in zip(fit, micro)], profile, access, refit)
    keep_measured = report["choice"]["kept"] == Kept.MICROBENCH
    if keep_measured:
        refined = hw
    records = []
    for c, m in runs:
        p = predict(c.plan, spec_for_world(hw, c.plan.world_size) if keep_measured else refined, profile, access)
        err = (p.iteration_us - m.iteration_us) / m.iteration_us
        records.append({"name": c.name, "role": c.role, "world": c.plan.world_size,
                         "measured_us": round(m.iteration_us, 1), "predicted_us": round(p.iteration_us, 1),
                         "error": round(err, 4)})
    validated = [r for r in records if r["role"] == "validate"]
    return {"summary": summary(validated), "per_plan": records, "refit": report, "refined": refined,
            "summary_by_world": {str(w): summary([r for r in validated if r["world"] == w])
                                 for w in sorted({r["world"] for r in validated})}}
