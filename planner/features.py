"""Which data feature each table of a model reads: the one rule the planner (access
statistics from a profile) and the executor (batches from the data) share.

A table reads the feature `extra["features"][table]` names, else the feature of its own
name, else the categorical feature with its number (`W7` -> `C7`: Wide&Deep's wide tables
beside the deep ones read the same Criteo columns)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from planner.model_spec import ModelSpec


def candidates(model: ModelSpec, table: str) -> list[str]:
    """The features `table` may read, the first the data has winning."""
    explicit = dict(model.extra.get("features", {}))
    if table in explicit:
        return [explicit[table]]
    m = re.fullmatch(r"[A-Za-z_]+?(\d+)", table)
    numbered = f"C{m.group(1)}" if m else None
    return [table] + ([numbered] if numbered and numbered != table else [])


def data_feature(model: ModelSpec, table: str, features: Iterable[str]) -> str | None:
    """The feature of `features` that `table` reads, or None when there is none."""
    feats = set(features)
    return next((f for f in candidates(model, table) if f in feats), None)


def feature_map(model: ModelSpec, features: Iterable[str]) -> dict[str, str | None]:
    """Every table's feature (None where the data has none)."""
    feats = set(features)
    return {t: data_feature(model, t, feats) for t in model.table_names}
