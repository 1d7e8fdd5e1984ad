"""The exchange of a pack's cold lookups chosen by cost: rows (deduplicated, pooled by the
requester) or pooled vectors (every ID to its owner, one partial sum per bag back)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from planner import op_names as on
from planner.access import table_access
from planner.exchange import choose_exchange, exchange_costs
from planner.lowering import lower
from planner.model_spec import ModelSpec, TableSpec
from planner.plan import PackPlan, Plan
from planner.presets import get_model
from simulator.hardware import load_hardware


def bags_model(pooling: float, rows: int = 1_000_000, dim: int = 64) -> ModelSpec:
    t = (TableSpec("A", rows, dim, pooling_factor=pooling), TableSpec("B", 1000, dim))
    return ModelSpec("m", "dlrm", 13, t, bottom_mlp=(32, dim), top_mlp=(32, 1))


def plan(model: ModelSpec, exchange: str = "rows", sharding: str = "row_wise", world: int = 4) -> Plan:
    ranks = [1] if sharding == "table_wise" else None
    return Plan(model, world, 512, [PackPlan("p", ["A"], sharding, ranks=ranks, exchange=exchange),
                                    PackPlan("q", ["B"], "replicated")])


def hw(world: int = 4):
    return load_hardware("dgx-h100", [f"gpus_per_node={world}"])


def test_costs_favour_pooled_for_long_bags_and_rows_for_one_hot():
    long, one = bags_model(100.0), bags_model(1.0)
    for m, want in ((long, "pooled"), (one, "rows")):
        p = plan(m)
        c = exchange_costs(p, p.packs[0], hw(), table_access(m), 512)
        assert (c["pooled"] < c["rows"]) == (want == "pooled"), (m.tables[0].pooling_factor, c)
        costs = choose_exchange(p, hw(), table_access(m), 512)
        assert p.packs[0].exchange == want and p.packs[1].exchange == "rows"  # a replica exchanges nothing
        assert set(costs) == {"p"}


def test_pooled_pack_is_lowered_with_its_own_ops_and_bytes():
    m = bags_model(100.0)
    acc = table_access(m)
    lo = lower(plan(m, "pooled", "table_wise"), hw(), access=acc)
    names = [o.name for o in lo.ops if "/p/" in o.name]
    assert names == ["fwd/p/bags", "fwd/p/route", "fwd/p/a2a_ids", "fwd/p/cold_pool", "fwd/p/a2a_pooled",
                     "fwd/p/pool", "bwd/p/pool", "bwd/p/a2a_pooled_grad", "opt/p/cold_update"]
    pv = lo.packs[0]
    out = lo.op("fwd/p/a2a_pooled").collective[1]
    # a requester gets one fp32 vector per sample from the owner; the owner returns them to all 4 ranks
    assert out[0] == pytest.approx(512 * 64 * 4) and out[1] == pytest.approx(4 * 512 * 64 * 4)
    assert np.array_equal(lo.op("bwd/p/a2a_pooled_grad").collective[1], out)
    ids = lo.op("fwd/p/a2a_ids").collective[1]
    assert ids[1] == pytest.approx(4 * (512 * 100 + 512) * 4)  # every lookup's ID and each bag's length, int32
    assert pv.pooled and pv.recv_ids[1] == pytest.approx(4 * 512 * 100)
    rows = lower(plan(m, "rows", "table_wise"), hw(), access=acc)
    assert "fwd/p/dedup" in [o.name for o in rows.ops] and "fwd/p/bags" not in [o.name for o in rows.ops]
    # the pooled exchange moves far fewer bytes for bags of 100 IDs
    assert lo.op("fwd/p/a2a_pooled").collective[1].max() < rows.op("fwd/p/a2a_emb").collective[1].max() / 4
    assert all(n in on.PACK_FWD + on.PACK_BWD + on.PACK_OPT for n in (x.split("/")[2] for x in names))


def test_search_chooses_per_pack_and_explain_says_why():
    from planner.explain import explain
    from planner.search import search

    m = get_model("dlrm-dcnv2")
    m = replace(m, tables=tuple(replace(t, dim=32, num_rows=min(t.num_rows, 100_000)) for t in m.tables),
                bottom_mlp=(128, 64, 32), top_mlp=(128, 1), extra={**m.extra, "cross_rank": 64})
    h = load_hardware("local-cpu", ["gpus_per_node=4"])
    res = search(m, h, None, 512, time_budget_s=20)
    ex = {p.name: p.exchange for p in res.plan.packs}
    assert "pooled" in ex.values() and "rows" in ex.values(), ex  # the 100-ID bags pooled, short bags as rows
    pooled = next(p for p in res.plan.packs if p.exchange == "pooled")
    assert "C21" in pooled.tables
    text = explain(res.plan, h, access=table_access(m), baselines=()).text()
    assert f"{pooled.name}: rows " in text and "-> pooled" in text
