"""What-if questions about a saved plan: its prediction on a (changed) hardware spec, and a
sweep of one hardware key. The one owner of both; `picasso simulate` and `picasso.simulate`
call these."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from planner.access import TableAccess
from planner.errors import PlanError
from planner.explain import Explanation
from planner.plan import Plan
from planner.throughput import samples_per_s
from simulator.hardware import HardwareSpec, apply_overrides


@dataclass
class SweepPoint:
    """One value of a swept hardware key and what the plan is predicted to do there."""

    value: str
    iteration_us: float
    samples_per_s: float | None
    fits_in_memory: bool


def inputs_for(plan: Plan, hardware: str | None = None, overrides: Sequence[str] = (), profile: str | None = None,
               scale_to: int | None = None, dense_dtype: str | None = None,
               where: str = "plan") -> tuple[Plan, HardwareSpec, dict[str, TableAccess]]:
    """The plan (with `dense_dtype` set), the spec and per-table access statistics to predict it
    with: the plan's own hardware, overrides and profile unless others are given."""
    from planner.inputs import load_inputs

    if dense_dtype:
        plan.model = replace(plan.model, dense_dtype=dense_dtype)
    hw_name = hardware or plan.hardware
    if not hw_name:
        raise PlanError(f"{where}: the plan names no hardware; give --hardware")
    sets = ([] if hardware else list(plan.provenance.hardware_overrides)) + list(overrides)
    scale = scale_to or (plan.provenance.profile_scale_to if not profile else None)
    _, hw, _, access = load_inputs(plan.model, hw_name, sets, profile or plan.provenance.profile, scale, None)
    return plan, hw, access


def predict(plan: Plan, hw: HardwareSpec, access: dict[str, TableAccess], engine: str = "simpy") -> Explanation:
    """The plan's predicted iteration on `hw` (no baselines); refuses a plan it cannot simulate."""
    from planner.search import evaluate, full_symmetry

    ev = evaluate(plan, hw, access, engine, full_symmetry(plan), "plan", check_memory=False)
    if ev.lowered is None:
        raise PlanError(ev.problem or "the plan cannot be simulated on this hardware")
    return Explanation(plan, ev, {})


def sweep(plan: Plan, hw: HardwareSpec, access: dict[str, TableAccess], key: str, values: Sequence[str],
          engine: str = "simpy") -> list[SweepPoint]:
    """The plan predicted once per value of one hardware key (`gpu.hbm_bw`, `nic_bw`, ...)."""
    out = []
    for v in values:
        ex = predict(plan, apply_overrides(hw, [f"{key}={v}"]), access, engine)
        out.append(SweepPoint(str(v), float(ex.evaluation.iteration_us), samples_per_s(plan, ex.evaluation.iteration_us),
                              ex.evaluation.lowered.memory.fits()))
    return out


def parse_sweep(text: str) -> tuple[str, list[str]]:
    """`KEY=V1,V2,...` as (key, values)."""
    key, sep, vals = text.partition("=")
    values = [v.strip() for v in vals.split(",") if v.strip()]
    if not sep or not key.strip() or not values:
        raise PlanError(f"--sweep {text!r}: expected KEY=V1,V2,... e.g. nic_bw=25GB/s,50GB/s")
    return key.strip(), values
