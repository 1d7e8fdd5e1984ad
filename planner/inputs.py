"""The one loader of planning inputs: model, hardware, access profile and per-table access.

`picasso plan`, `picasso simulate`, validate and the demo assemble their inputs here.
"""

from __future__ import annotations

from typing import Any

from planner.access import table_access
from planner.dense import with_dense_dtype
from planner.errors import PlanError
from planner.model_spec import ModelSpec
from planner.presets import get_model
from simulator.hardware import load_hardware
from traces.extrapolate import scale_profile
from traces.profile import AccessProfile


def load_inputs(model_name: str | ModelSpec, hw_name: str, overrides: list[str], profile_path: str | None,
                scale_to: int | None, row_cap: int | None,
                dense_dtype: str | None = None) -> tuple[Any, Any, Any, dict]:
    """(model, hardware, profile or None, per-table access statistics) from their names:
    a model preset or spec (or the spec itself), a hardware preset or file with --set
    overrides, an optional profile file extrapolated to `scale_to` rows, and a row cap. The
    model comes back with its dense precision set (`dense_dtype`, else its own, else the
    hardware's default: planner.dense.with_dense_dtype)."""
    model = get_model(model_name) if isinstance(model_name, str) else model_name
    caps = {t.name: t.num_rows for t in model.tables}  # known cardinalities, before any --row-cap
    if row_cap is not None:
        if row_cap < 1:
            raise PlanError(f"--row-cap must be at least 1, got {row_cap}")
        model = model.with_row_cap(row_cap)
    hw = load_hardware(hw_name, overrides)
    model = with_dense_dtype(model, hw, dense_dtype)
    profile = None
    if profile_path:
        profile = AccessProfile.load(profile_path)
        if scale_to:
            if scale_to < 1:
                raise PlanError(f"--scale-to must be at least 1, got {scale_to}")
            profile = scale_profile(profile, scale_to, cardinality={n: v for n, v in caps.items() if n in profile.features})
    return model, hw, profile, table_access(model, profile)
