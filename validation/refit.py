"""Refining the calibrated spec on the fit plans' measured runs (`picasso validate --fit-plans`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from planner.access import TableAccess
from planner.builders import Case
from planner.lowering import lower
from planner.op_names import op_class
from simulator.calibration import fit_host_gaps, fit_op_classes, spec_for_world
from simulator.hardware import HardwareSpec
from simulator.measured import host_gap, queue_delays
from validation.measure import Measured, ValidateError

if TYPE_CHECKING:  # types only: the seams' own classes, not loaded at import
    from traces.profile import AccessProfile



def refit_on_runs(hw: HardwareSpec, fit: list[tuple[Case, Measured]], profile: AccessProfile | None, access: dict[str, TableAccess] | None,
                  fixed: bool = True) -> tuple[HardwareSpec, dict[str, Any]]:
    """Refine `hw` on the fit plans' measurements: per op class and world size, the fixed
    cost and rate of compute ops and of collectives from their op timings
    (simulator.calibration.fit_op_classes), the untimed host time per step and per op from
    their timelines (fit_host_gaps, host_gap). Nothing is fitted on whole iterations: global
    collective factors fitted on the fit plans' lone collectives at 2 ranks stretched the
    queued collectives of 4-rank plans (replayed on two sweeps, held-out MAPE 11.9% and 11.4%
    with them, 8.4% and 8.3% without); the ranks' waits are per-op release delays instead."""
    if not fit:
        raise ValidateError("--fit-plans: no fit plan could be run")

    def graph(c: Case) -> Any:
        return lower(c.plan, spec_for_world(hw, c.plan.world_size), profile=profile, access=access,
                     check_memory=False).graph

    spec1, classes = fit_op_classes(hw, [(graph(c), c.plan.world_size, m.op_us, queue_delays(m.timeline))
                                          for c, m in fit], op_class, fixed=fixed)
    spec1, gaps = fit_host_gaps(spec1, [(c.plan.world_size, *host_gap(m.timeline)[::-1]) for c, m in fit])
    return spec1, {"fit_plans": [c.name for c, _ in fit], "op_classes": classes, "host_gaps": gaps}
