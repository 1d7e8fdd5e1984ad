"""Refining the calibrated spec on the fit plans' measured runs (`picasso validate --fit-plans`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from planner.access import TableAccess
from planner.builders import Case
from planner.lowering import lower
from planner.op_names import op_class
from simulator.calibration import fit_host_gaps, fit_op_classes, refine_iterations, spec_for_world
from simulator.hardware import HardwareSpec
from simulator.measured import host_gap, queue_delays
from validation.measure import Measured, ValidateError

if TYPE_CHECKING:  # types only: the seams' own classes, not loaded at import
    from traces.profile import AccessProfile


# After the per-op fits (compute, collectives, host gaps: all measured per op), the
# iteration-level refit only corrects what ops alone do not show: its collective factors
# stay within e**REFINE_BOUND of the per-op fit.
REFINE_BOUND = 1.0
# Which factors it fits by default: none. It stood for the ranks' waits at collectives
# before the per-op fit modelled them as release delays (hidden behind a busy comm lane):
# fitted on the fit plans' lone collectives at 2 ranks, its one factor per key for every
# world then stretched the queued collectives of 4-rank plans (replayed on two sweeps,
# held-out MAPE 11.9% and 11.4% with it, 8.4% and 8.3% without).
ITERATION_KEYS: tuple[str, ...] = ()


def refit_on_runs(hw: HardwareSpec, fit: list[tuple[Case, Measured]], profile: AccessProfile | None, access: dict[str, TableAccess] | None,
                  fixed: bool = True, keys: tuple[str, ...] | None = None) -> tuple[HardwareSpec, dict[str, Any]]:
    """Refine `hw` on the fit plans' measurements: per op class and world size, the fixed
    cost and rate of compute ops and of collectives from their op timings
    (simulator.calibration.fit_op_classes), the untimed host time per step and per op from
    their timelines (fit_host_gaps, host_gap), then multiplicative factors of `keys`
    (default ITERATION_KEYS: none; e.g. collective latency and bandwidths) from their
    iteration times (refine_iterations)."""
    if not fit:
        raise ValidateError("--fit-plans: no fit plan could be run")

    def graph(c: Case) -> Any:
        return lower(c.plan, spec_for_world(hw, c.plan.world_size), profile=profile, access=access,
                     check_memory=False).graph

    spec1, classes = fit_op_classes(hw, [(graph(c), c.plan.world_size, m.op_us, queue_delays(m.timeline))
                                          for c, m in fit], op_class, fixed=fixed)
    spec1, gaps = fit_host_gaps(spec1, [(c.plan.world_size, *host_gap(m.timeline)[::-1]) for c, m in fit])
    # then the fit plans' iterations: what the ops alone do not show (ranks waiting for each
    # other at a collective, compute slowed by collectives in flight) as global collective
    # factors, bounded (REFINE_BOUND): a few single runs on a shared machine must not carry
    # the model after whichever plan another process slowed down
    spec2, it = refine_iterations(spec1, [(graph(c), c.plan.world_size, m.iteration_us) for c, m in fit],
                                  keys=ITERATION_KEYS if keys is None else keys, fit_gap=False, bound=REFINE_BOUND)
    return spec2, {"fit_plans": [c.name for c, _ in fit], "op_classes": classes, "host_gaps": gaps,
                   "iterations": it}
