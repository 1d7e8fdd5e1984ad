"""The Plan fields the executor does not run, each with the reason: the one list of them.

Every other field of the Plan schema (planner.plan: Plan, PackPlan, OptimizerPlan, and the
model's TableSpec, whose dtype the planner costs) changes what a run does: its weights, its
state, its timeline, or whether it starts. tests/test_plan_fields.py walks the schema and
holds each field to one or the other, so a new field is either run or listed here.
"""

from __future__ import annotations

PLANNING_ONLY: dict[str, str] = {
    "Plan.hardware": "the name of the hardware spec the plan was costed for; the executor runs on the "
                     "machine it is started on (validation compares measured with predicted times)",
    "Plan.provenance": "where the plan came from (search, baseline, profile, overrides), for reports and "
                       "`picasso simulate`'s defaults; training reads none of it",
    "Plan.prediction": "the planner's predicted times, set beside the measured ones in the run's result",
    "Plan.path": "the file the plan was loaded from (its hot IDs lie beside it), not part of the document",
    "Plan.hot_ids": "hot IDs of a plan not saved yet, written beside it by save; not part of the document",
    "TableSpec.pooling_factor": "mean IDs per sample the planner assumes without a profile; the executor "
                                "pools the bags the data holds (only the synthetic test data is drawn with it)",
}
