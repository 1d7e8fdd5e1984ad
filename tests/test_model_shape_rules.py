"""A model spec that cannot run is refused at load, in one line naming the field: a dlrm bottom MLP
that does not end in the tables' dim, a top MLP that does not end in 1, and the other shape rules."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from picasso.cli import main
from planner.errors import PlanError
from planner.model_spec import ModelSpec
from planner.presets import get_model


def _spec(**change) -> dict:
    d = get_model("dlrm-criteo-kaggle").with_row_cap(100).to_dict()
    return {**d, **change}


@pytest.mark.parametrize("change,field", [
    ({"bottom_mlp": [64, 32]}, "bottom_mlp"),
    ({"top_mlp": [64, 4]}, "top_mlp"),
    ({"arch": "din", "tables": [{"name": "C1", "num_rows": 10, "dim": 8},
                                {"name": "H", "num_rows": 10, "dim": 4, "pooling": "none", "max_len": 5}]}, "tables"),
    ({"arch": "wide_deep", "extra": {"wide_tables": ["nope"]}}, "extra.wide_tables"),
])
def test_plan_refuses_a_spec_that_cannot_run(tmp_path, capsys, change, field):
    (tmp_path / "m.json").write_text(json.dumps(_spec(**change)))
    rc = main(["plan", "--model", str(tmp_path / "m.json"), "--hardware", "local-cpu", "-o", str(tmp_path / "p.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and f"field {field}" in err[0], err
    assert not (tmp_path / "p.json").exists()


@settings(max_examples=40, deadline=None)
@given(dim=st.sampled_from([4, 8, 16]), bottom=st.lists(st.integers(1, 32), max_size=3),
       top=st.lists(st.integers(1, 4), max_size=3))
def test_dlrm_shapes_are_accepted_exactly_when_they_fit(dim, bottom, top):
    d = {"name": "m", "arch": "dlrm", "num_dense": 3, "bottom_mlp": bottom, "top_mlp": top,
         "tables": [{"name": "C1", "num_rows": 10, "dim": dim}, {"name": "C2", "num_rows": 10, "dim": dim}]}
    fits = (not bottom or bottom[-1] == dim) and (not top or top[-1] == 1)
    if fits:
        ModelSpec.from_dict(d)
    else:
        with pytest.raises(PlanError, match="field (bottom|top)_mlp"):
            ModelSpec.from_dict(d)
