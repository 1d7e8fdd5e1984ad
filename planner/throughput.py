"""Samples per second from a step time: the one place it is computed (the planner's
prediction, its explanation, a what-if sweep and the run's predicted figure read it)."""

from __future__ import annotations

from planner.plan import Plan


def samples_per_s(plan: Plan, iteration_us: float | None) -> float | None:
    """The plan's global batch per second at `iteration_us` per step (None without one)."""
    return plan.global_batch / iteration_us * 1e6 if iteration_us else None
