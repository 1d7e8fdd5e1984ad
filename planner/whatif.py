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
    return Explanation(plan, ev, {}, hw=hw)  # no per-table statistics: the what-if is about the hardware


@dataclass(frozen=True)
class WhatIf:
    """A plan predicted on changed hardware beside its prediction on its own hardware."""

    change: str  # the changes asked, as the user wrote them
    base_us: float
    new_us: float
    base_busiest: dict | None  # Explanation.bottleneck of each
    new_busiest: dict | None
    base_fits: bool
    new_fits: bool

    def text(self) -> str:
        pct = (self.new_us / self.base_us - 1) * 100 if self.base_us else 0.0
        delta = f"{pct:+.0f}%" if abs(pct) >= 0.5 else "unchanged"
        line = f"what-if {self.change}: iteration {self.base_us:,.0f} us -> {self.new_us:,.0f} us ({delta})"
        if self.new_busiest:
            b = self.new_busiest
            line += f"; busiest resource {b['resource']} ({b['share_of_iteration']:.0%} of the iteration)"
            was = self.base_busiest
            if was and was["resource"] != b["resource"]:
                line += f", was {was['resource']} ({was['share_of_iteration']:.0%})"
        if self.base_fits and not self.new_fits:
            line += "; no longer fits in memory"
        return line

    def to_dict(self) -> dict:
        return {"change": self.change, "base_iteration_us": self.base_us, "iteration_us": self.new_us,
                "change_ratio": self.new_us / self.base_us if self.base_us else None,
                "busiest": self.new_busiest and self.new_busiest["resource"],
                "base_busiest": self.base_busiest and self.base_busiest["resource"],
                "fits_in_memory": self.new_fits, "base_fits_in_memory": self.base_fits}


def what_if(plan: Plan, changed: Explanation, access: dict[str, TableAccess], change: str,
            engine: str = "simpy") -> WhatIf:
    """`changed` (the plan predicted on other hardware) against the plan on its own hardware and
    overrides, simulated by the same engine, so the difference is the change alone."""
    _, own, _ = inputs_for(plan)
    base = predict(plan, own, access, engine)
    return WhatIf(change, float(base.evaluation.iteration_us), float(changed.evaluation.iteration_us),
                  _named(base), _named(changed), base.evaluation.lowered.memory.fits(),
                  changed.evaluation.lowered.memory.fits())


def _named(ex: Explanation) -> dict | None:
    """The busiest resource of a prediction, named as its hardware calls it."""
    b = ex.bottleneck()
    return b and {**b, "resource": ex.hw.resource_name(b["resource"])}


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
