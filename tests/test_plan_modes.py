"""Plan modes as str enums (planner.modes): plan files keep the plain names, old files load, a bad
name gets one line listing the valid ones, and the old "fused" exchange is split into what runs
(Plan.exchange) and how the baseline is scored (Provenance.scoring)."""

from __future__ import annotations

import json

import pytest

from planner.errors import PlanError
from planner.modes import Exchange, HotSync, Placement, PlanExchange, Scoring
from planner.plan import Plan
from planner.sharding import Sharding

# a plan file as the planner wrote it before the modes were enums and before Scoring: the
# torchrec-like baseline, its exchange "fused" (scored as one exchange, run pack by pack)
OLD_PLAN = {
    "version": 1,
    "model": {"name": "u", "arch": "dlrm", "num_dense": 2,
              "tables": [{"name": "C1", "num_rows": 50, "dim": 4}, {"name": "C2", "num_rows": 30, "dim": 4},
                         {"name": "C3", "num_rows": 70, "dim": 4}],
              "bottom_mlp": [8, 4], "top_mlp": [8, 1]},
    "world_size": 2, "batch_size_per_rank": 16,
    "packs": [{"name": "g0_r0", "tables": ["C1", "C2"], "sharding": "table_wise", "ranks": [0], "placement": "host",
               "hot_sync": "dense", "exchange": "pooled"},
              {"name": "g0_r1", "tables": ["C3"], "sharding": "table_wise", "ranks": [1], "placement": "hbm",
               "hot_sync": "sparse", "exchange": "rows"}],
    "micro_batches": 1, "exchange": "fused", "provenance": {"baseline": "torchrec-like"},
}


def test_an_old_format_plan_loads_as_typed_modes_and_its_fused_exchange_splits(tmp_path):
    (tmp_path / "old.json").write_text(json.dumps(OLD_PLAN))
    plan = Plan.load(tmp_path / "old.json")
    a, b = plan.packs
    assert a.sharding is Sharding.TABLE_WISE and a.placement is Placement.HOST and a.exchange is Exchange.POOLED
    assert b.hot_sync is HotSync.SPARSE and b.placement is Placement.HBM and b.exchange is Exchange.ROWS
    # what the executor runs, and how explain scores it, each in a field of its own
    assert plan.exchange is PlanExchange.PER_PACK and plan.provenance.scoring is Scoring.FUSED_TABLE_WISE
    plan.save(tmp_path / "new.json")
    d = json.loads((tmp_path / "new.json").read_text())
    assert d["exchange"] == "per_pack" and d["provenance"] == {"baseline": "torchrec-like", "scoring": "fused_table_wise"}
    assert [(p["placement"], p["hot_sync"], p["exchange"]) for p in d["packs"]] == [("host", "dense", "pooled"),
                                                                                    ("hbm", "sparse", "rows")]
    assert Plan.load(tmp_path / "new.json").to_dict() == plan.to_dict()


def test_a_plan_writes_its_modes_as_the_plain_names():
    d = {**OLD_PLAN, "exchange": "torchrec", "provenance": {"baseline": "torchrec"}}
    plan = Plan.from_dict(d)
    assert plan.exchange is PlanExchange.TORCHREC
    out = json.loads(json.dumps(plan.to_dict()))
    assert out["packs"] == [{**p, "ranks": p["ranks"]} for p in OLD_PLAN["packs"]]
    assert out["exchange"] == "torchrec" and out["provenance"] == {"baseline": "torchrec"}


@pytest.mark.parametrize("path, value, valid", [
    (("packs", 0, "placement"), "device", "hbm, host"),
    (("packs", 1, "hot_sync"), "all", "dense, sparse"),
    (("packs", 0, "exchange"), "ids", "rows, pooled"),
    (("exchange",), "fused_rows", "per_pack, torchrec, fused_pooled"),
    (("provenance", "scoring"), "fast", "fused_table_wise"),
])
def test_a_bad_mode_is_one_line_listing_the_valid_values(tmp_path, path, value, valid):
    d = json.loads(json.dumps(OLD_PLAN))
    node = d
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    (tmp_path / "p.json").write_text(json.dumps(d))
    with pytest.raises(PlanError) as err:
        Plan.load(tmp_path / "p.json")
    msg = str(err.value)
    assert "\n" not in msg and repr(value) in msg and msg.endswith(f"is not one of {valid}"), msg
    assert str(path[-1]) in msg


def test_from_str_takes_members_and_names_and_refuses_the_rest():
    assert Placement.from_str("host") is Placement.HOST and Placement.from_str(Placement.HBM) is Placement.HBM
    assert f"{Exchange.POOLED}" == "pooled" and str(HotSync.SPARSE) == "sparse" and PlanExchange.TORCHREC == "torchrec"
    with pytest.raises(PlanError, match=r"^placement: 3 is not one of hbm, host$"):
        Placement.from_str(3, "placement")
    with pytest.raises(PlanError, match="is not one of row_wise, table_wise"):
        Sharding.from_str("rows")
    # a pack built in code with plain names holds the enums
    plan = Plan.from_dict(OLD_PLAN)
    plan.packs[0].placement = "hbm"  # set after construction: validate takes it as a mode too
    plan.validate()
    assert plan.packs[0].placement is Placement.HBM
