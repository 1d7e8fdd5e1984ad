"""Hot-set sizing uses the cost of the sync the pack will use: a pack whose hot rows
are synchronised sparsely is sized by what a touched hot row costs in the all-gather and its
apply (planner.lowering.sparse_sync_row_us), not by the dense all-reduce of every hot row."""

from __future__ import annotations

import pytest

from planner.access import table_access
from planner.lowering import choose_hot_sync, hot_sync_costs, sparse_sync_row_us
from planner.model_spec import ModelSpec, TableSpec
from planner.plan import PackPlan, Plan
from planner.search import byte_costs, hot_threshold_rows, size_for_sparse_sync, sparse_presence_threshold
from planner.volumes import pack_volumes
from simulator.hardware import load_hardware


def test_sparse_presence_threshold_bounds():
    assert sparse_presence_threshold(0.9, 4) == 0.0  # cheaper than the exchange even once: every row
    assert sparse_presence_threshold(4.0, 4) == 1.0  # dearer than k exchanges: no row
    q = sparse_presence_threshold(2.0, 4)
    assert 0 < q < 1 and 4 * q / (1 - (1 - q) ** 4) == pytest.approx(2.0, rel=1e-6)


def setup(k: int, hot: int):
    model = ModelSpec("s", "dlrm", 13, (TableSpec("big", 2_000_000, 32), TableSpec("mid", 50_000, 32)),
                      bottom_mlp=(32, 32), top_mlp=(32, 1))
    hw = load_hardware("dgx-h100", ["gpus_per_node=4"])
    access = table_access(model, None)
    plan = Plan(model, 4, 64 * k, [PackPlan("p0", ["big", "mid"], "row_wise")], hot_rows={"big": hot, "mid": 5000},
                micro_batches=k)
    return model, hw, access, plan


def test_a_sparsely_synced_pack_is_sized_by_the_sparse_cost():
    model, hw, access, plan = setup(k=8, hot=400_000)
    choose_hot_sync(plan, hw, access, 64)
    assert plan.packs[0].hot_sync == "sparse"  # a large hot set, few rows touched: the gather wins
    dense_sized = dict(plan.hot_rows)
    c_a2a, c_ar = byte_costs(hw, 4)
    size_for_sparse_sync(plan, hw, access, 1.0, 1e15, c_a2a, c_ar, {})
    pv = pack_volumes(Plan(model, 4, 512, plan.packs, micro_batches=8), plan.packs[0], access, 64, 4)
    row_us = sparse_sync_row_us(plan, pv, hw)
    for t in ("big", "mid"):
        want = hot_threshold_rows(model.table(t), access[t], 64, 8, c_a2a, c_ar, 0.0, row_us)
        assert plan.hot_rows.get(t, 0) == want
    assert plan.hot_rows != dense_sized
    # the sizes the pack ends with are costed with the sync it uses
    assert plan.packs[0].hot_sync == ("sparse" if plan.hot_rows else "dense")


def test_packs_with_a_dense_sync_keep_their_sizes():
    model, hw, access, plan = setup(k=1, hot=200)
    choose_hot_sync(plan, hw, access, 64)
    assert plan.packs[0].hot_sync == "dense"
    before = dict(plan.hot_rows)
    c_a2a, c_ar = byte_costs(hw, 4)
    size_for_sparse_sync(plan, hw, access, 1.0, 1e15, c_a2a, c_ar, {})
    assert plan.hot_rows == before


def test_sparse_cost_split_per_row_adds_up_to_hot_sync_costs():
    model, hw, access, plan = setup(k=2, hot=300_000)
    pv = pack_volumes(plan, plan.packs[0], access, 64, 4)
    from simulator.cost import collective_cost
    from simulator.opgraph import Collective

    lat, _, _ = collective_cost(Collective("all_gather", (0, 1, 2, 3), pv.hot_sync_bytes(2)), hw)
    assert hot_sync_costs(plan, pv, hw)["sparse"] == pytest.approx(
        lat + pv.hot_unique * 2 * sparse_sync_row_us(plan, pv, hw))  # one gather: rows with values
