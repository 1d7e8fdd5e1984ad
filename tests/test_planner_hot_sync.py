"""Hot-row gradient sync chosen by cost: the planner costs the dense all-reduce and the sparse
all-gather of touched hot rows, lowers the one the plan records, and picks the cheaper."""

from __future__ import annotations

import numpy as np
import pytest

from planner.access import table_access
from planner.lowering import choose_hot_sync, hot_sync_costs, lower
from planner.plan import PackPlan, Plan
from planner.presets import get_model
from simulator.hardware import load_hardware


def plan(batch: int, hot: int, hot_sync: str = "dense") -> Plan:
    m = get_model("dlrm-criteo-kaggle")
    return Plan(m, 8, batch, [PackPlan("pack0", m.table_names, hot_sync=hot_sync)],
                hot_rows={"C3": hot}, hot_ids_file="x")


def hw():
    return load_hardware("dgx-h100")


def test_costs_favour_sparse_for_large_hot_sets_and_small_batches():
    acc = table_access(get_model("dlrm-criteo-kaggle"))
    big = plan(64, 1_000_000)
    c = hot_sync_costs(big, lower(big, hw(), access=acc).packs[0], hw())
    assert c["sparse"] * 2 < c["dense"], c
    small = plan(65536, 200)
    c = hot_sync_costs(small, lower(small, hw(), access=acc).packs[0], hw())
    assert c["dense"] < c["sparse"], c
    choose_hot_sync(big, hw(), acc, 64)
    choose_hot_sync(small, hw(), acc, 65536)
    assert big.packs[0].hot_sync == "sparse" and small.packs[0].hot_sync == "dense"


def test_sparse_hot_sync_is_lowered_as_an_all_gather_outside_the_dense_all_reduce():
    dense, sparse = lower(plan(512, 5000), hw()), lower(plan(512, 5000, "sparse"), hw())
    d_ar, s_ar = dense.op("bwd/dense/allreduce"), sparse.op("bwd/dense/allreduce")
    assert d_ar.collective[1] - s_ar.collective[1] == pytest.approx(5000 * 16 * 4)
    sync = sparse.op("opt/pack0/hot_sync")
    # a serial plan's hot update also waits for the cold update, which the executor runs first
    assert sync.collective[0] == "all_gather"
    # the sync is launched before the all-reduce and waits for the gradient exchange, not for
    # the all-reduce (the cold update's dependency list once leaked into it)
    assert sync.deps == ["bwd/pack0/a2a_grad"]
    assert sparse.op("opt/pack0/hot_update").deps == ["opt/pack0/hot_sync", "opt/pack0/cold_update"]
    assert "opt/pack0/hot_sync" not in [o.name for o in dense.ops]
    # memory: no whole-hot-set gradient buffer under the sparse sync
    assert sparse.memory.hbm["hot_cache"].max() < dense.memory.hbm["hot_cache"].max()


def test_old_plans_load_with_the_dense_default_and_bad_values_are_refused():
    from planner.errors import PlanError

    d = plan(512, 10).to_dict()
    del d["packs"][0]["hot_sync"]
    assert Plan.from_dict(d).packs[0].hot_sync == "dense"
    d["packs"][0]["hot_sync"] = "gossip"
    with pytest.raises(PlanError, match="hot_sync: 'gossip' is not one of"):
        Plan.from_dict(d)


def test_search_records_a_choice():
    from planner.search import search

    m = get_model("dlrm-criteo-kaggle")
    res = search(m, hw(), batch_size_per_rank=256, time_budget_s=5.0, top_k=1)
    packs = res.plan.packs
    assert all(p.hot_sync in ("dense", "sparse") for p in packs)
    acc = table_access(m)
    for p in packs:
        if any(res.plan.hot_rows.get(t, 0) for t in p.tables):
            pv = lower(res.plan, hw(), access=acc).packs[[q.name for q in packs].index(p.name)]
            c = hot_sync_costs(res.plan, pv, hw())
            assert p.hot_sync == min(c, key=c.get), (p.name, c)
    assert np.isfinite(res.plan.prediction.iteration_us)
