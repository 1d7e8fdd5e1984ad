import json

import numpy as np
import pytest

from planner.errors import PlanError
from planner.plan import PackPlan, Plan
from planner.presets import get_model


def small_plan(**kw) -> Plan:
    model = get_model("dlrm-criteo-kaggle").with_row_cap(1000)
    packs = [PackPlan("pack0", model.table_names, "row_wise")]
    return Plan(model=model, world_size=2, batch_size_per_rank=64, packs=packs, **kw)


def test_round_trip_with_hot_ids(tmp_path):
    plan = small_plan(hot_rows={"C1": 3})
    plan.save(tmp_path / "plan.json", hot_ids={"C1": np.array([5, 2, 9])})
    back = Plan.load(tmp_path / "plan.json")
    assert back.to_dict() == plan.to_dict() and back.path == tmp_path / "plan.json"
    assert back.load_hot_ids()["C1"].tolist() == [5, 2, 9]
    assert back.table_offsets(back.packs[0])["C3"] == 1000 + 583  # C1 capped at 1000 rows


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["packs"][0]["tables"].append("C99"), "unknown table 'C99'"),
        (lambda d: d["packs"].append({"name": "p1", "tables": ["C1"]}), "C1 is in two packs"),
        (lambda d: d["hot_rows"].update(C9=4), "outside [0, 3]"),
        (lambda d: d["packs"][0].update(sharding="diagonal"), "field packs[0].sharding: 'diagonal'"),
        (lambda d: d.pop("world_size"), "field world_size: missing"),
    ],
)
def test_invalid_plans_are_refused(tmp_path, mutate, message):
    d = small_plan().to_dict()
    mutate(d)
    (tmp_path / "p.json").write_text(json.dumps(d))
    with pytest.raises(PlanError, match=message.replace("[", r"\[").replace("(", r"\(")):
        Plan.load(tmp_path / "p.json")
