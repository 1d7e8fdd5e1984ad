"""The one Sharding type: plans carry it, files keep the plain names, and no module outside
planner/sharding.py matches a sharding by its bare name."""

from __future__ import annotations

import io
import json
import tokenize
from pathlib import Path

import pytest

from planner.errors import PlanError
from planner.plan import PackPlan, Plan
from planner.presets import get_model
from planner.sharding import POOLED_SHARDINGS, Sharding

ROOT = Path(__file__).resolve().parents[1]
NAMES = {s.value for s in Sharding}


def test_a_loaded_plan_carries_sharding_members_and_saves_plain_names(tmp_path):
    m = get_model("dlrm-criteo-kaggle")
    names = m.table_names
    plan = Plan(m, 2, 64, [PackPlan("a", names[:10], "table_row_wise", [0, 1]), PackPlan("b", names[10:], "replicated")])
    assert plan.packs[0].sharding is Sharding.TABLE_ROW_WISE  # a plain name becomes the member
    plan.save(tmp_path / "p.json")
    doc = json.loads((tmp_path / "p.json").read_text())
    assert [p["sharding"] for p in doc["packs"]] == ["table_row_wise", "replicated"]
    back = Plan.load(tmp_path / "p.json")
    assert [p.sharding for p in back.packs] == [Sharding.TABLE_ROW_WISE, Sharding.REPLICATED]
    assert f"{back.packs[1].sharding}" == "replicated" == str(back.packs[1].sharding)


def test_an_unknown_sharding_is_still_one_line():
    m = get_model("dlrm-criteo-kaggle")
    with pytest.raises(PlanError, match="sharding 'diagonal' is not one of"):
        Plan(m, 2, 64, [PackPlan("a", m.table_names, "diagonal")]).validate()


def test_the_rules_of_each_sharding():
    assert [s for s in Sharding if not s.exchanges] == [Sharding.REPLICATED]
    assert POOLED_SHARDINGS == ("row_wise", "table_wise", "table_row_wise")


def test_no_module_matches_a_sharding_by_its_bare_name():
    found = []
    for folder in ("foundation", "traces", "simulator", "planner", "executor", "validation", "picasso"):
        for f in sorted((ROOT / folder).rglob("*.py")):
            if f.name == "sharding.py":
                continue
            for t in tokenize.generate_tokens(io.StringIO(f.read_text()).readline):
                if t.type == tokenize.STRING and t.string[:1] in "\"'" and t.string[1:-1] in NAMES:
                    found.append(f"{f.relative_to(ROOT)}:{t.start[0]} {t.string}")
    assert not found, found
