"""Errors the planner raises for bad user input (one clear line each)."""


class PlanError(ValueError):
    """A plan, model spec or planning request that is invalid or infeasible."""
