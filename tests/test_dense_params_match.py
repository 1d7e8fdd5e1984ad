"""The planner costs the dense layers the executor builds: the same parameters for every
architecture, with each architecture's settings left at their defaults (ModelSpec owns them)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from executor.dense.model import build_dense
from planner.dense import dense_cost
from planner.model_spec import ModelSpec, TableSpec
from planner.presets import get_model


def t(name: str, rows: int, dim: int = 8, **kw) -> TableSpec:
    return TableSpec(name, rows, dim, **kw)


MODELS = [
    ModelSpec("dlrm-bottom", "dlrm", 13, (t("C1", 50), t("C2", 90)), bottom_mlp=(16, 8), top_mlp=(16, 1)),
    ModelSpec("dlrm-no-bottom", "dlrm", 13, (t("C1", 50), t("C2", 90), t("C3", 9)), top_mlp=(16, 1)),
    ModelSpec("deepfm", "deepfm", 13, (t("C1", 50), t("C2", 40)), top_mlp=(16, 1), interaction="fm"),
    ModelSpec("dcn-default", "dcn", 13, (t("C1", 50, 4), t("C2", 400)), top_mlp=(16, 1)),
    ModelSpec("dcn-low-rank", "dcn", 13, (t("C1", 50), t("C2", 40)), bottom_mlp=(16, 8), top_mlp=(16, 1),
              extra={"cross_rank": 4}),
    ModelSpec("wd-default", "wide_deep", 13, (t("C1", 60), t("W1", 60, 1), t("W2", 30, 1)), top_mlp=(16, 1)),
    ModelSpec("din-default", "din", 0, (t("item", 500), t("hist_item", 500, pooling="none", max_len=6)),
              top_mlp=(16, 1)),
]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_planner_and_executor_count_the_same_dense_parameters(model):
    built = sum(p.numel() for p in build_dense(model, 0).parameters())
    costed = sum(op.params for op in dense_cost(model).ops.values())
    assert costed == built


def test_every_preset_costs_the_parameters_it_builds():
    for name in ("dlrm-criteo-kaggle", "dlrm-dcnv2"):
        m = get_model(name)
        m = replace(m, tables=tuple(replace(x, num_rows=min(x.num_rows, 10)) for x in m.tables))
        assert sum(op.params for op in dense_cost(m).ops.values()) == sum(
            p.numel() for p in build_dense(m, 0).parameters())
