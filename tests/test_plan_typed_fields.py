"""Plan provenance, prediction and exchange as typed fields (old plan files with `notes` still load)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from planner.builders import baseline_plan
from planner.errors import PlanError
from planner.model_spec import ModelSpec, TableSpec
from planner.plan import Plan, Prediction


def model() -> ModelSpec:
    return ModelSpec("u", "dlrm", 2, (TableSpec("C1", 50, 4), TableSpec("C2", 30, 4)), bottom_mlp=(8, 4),
                     top_mlp=(8, 1))


def test_an_old_plan_with_notes_loads_into_the_typed_fields(tmp_path):
    d = baseline_plan("naive", model(), 2, 16).to_dict()
    for k in ("exchange", "provenance", "prediction"):
        d.pop(k, None)
    d["notes"] = {"baseline": "torchrec-like", "fused_exchange": True, "label": "rw-hot", "_path": "/elsewhere/p.json",
                  "predicted_iteration_us": 123.0, "predicted_engine": "simpy", "speedups": {"naive": 2.0},
                  "profile": "/data/profile.json", "profile_scale_to": 1000, "hardware_overrides": ["nodes=2"]}
    (tmp_path / "old.json").write_text(json.dumps(d))
    plan = Plan.load(tmp_path / "old.json")
    # run pack by pack, scored fused: the two halves of the old "fused" apart
    assert plan.exchange == "per_pack" and plan.provenance.scoring == "fused_table_wise"
    assert plan.provenance.baseline == "torchrec-like" and plan.provenance.label == "rw-hot"
    assert plan.provenance.hardware_overrides == ["nodes=2"]
    assert plan.provenance.profile == "/data/profile.json" and plan.provenance.profile_scale_to == 1000
    assert plan.prediction == Prediction(iteration_us=123.0, engine="simpy", speedups={"naive": 2.0})
    plan.save(tmp_path / "new.json")
    text = (tmp_path / "new.json").read_text()
    assert '"notes"' not in text and "_path" not in text and "elsewhere" not in text
    again = Plan.load(tmp_path / "new.json")
    assert again.to_dict() == plan.to_dict() and json.loads(text)["exchange"] == "per_pack"


def test_the_loaded_path_does_not_survive_a_resave(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plan = Plan(model(), 1, 8, baseline_plan("naive", model(), 1, 8).packs, hot_rows={"C1": 3})
    plan.save(tmp_path / "a" / "p.json", hot_ids={"C1": np.array([4, 1, 2])})
    back = Plan.load(tmp_path / "a" / "p.json")
    assert back.path == tmp_path / "a" / "p.json" and back.load_hot_ids()["C1"].tolist() == [4, 1, 2]
    back.save(tmp_path / "b" / "p.json", hot_ids={"C1": np.array([7, 8, 9])})
    assert "a/p.json" not in (tmp_path / "b" / "p.json").read_text()
    assert Plan.load(tmp_path / "b" / "p.json").load_hot_ids()["C1"].tolist() == [7, 8, 9]


def test_fused_exchange_is_a_plan_field_and_bad_values_are_refused(tmp_path):
    tl = baseline_plan("torchrec-like", model(), 2, 16)
    assert tl.exchange == "per_pack" and tl.provenance.scoring == "fused_table_wise"
    assert tl.provenance.baseline == "torchrec-like"
    d = tl.to_dict()
    (tmp_path / "p.json").write_text(json.dumps({**d, "exchange": "magic"}))
    with pytest.raises(PlanError, match="exchange"):
        Plan.load(tmp_path / "p.json")
    (tmp_path / "q.json").write_text(json.dumps({**d, "provenance": {"planer": "x"}}))
    with pytest.raises(PlanError, match="provenance.planer"):
        Plan.load(tmp_path / "q.json")
    (tmp_path / "r.json").write_text(json.dumps({**d, "notes": {"baseline": "naive"}}))
    with pytest.raises(PlanError, match="notes"):
        Plan.load(tmp_path / "r.json")
