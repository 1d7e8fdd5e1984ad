"""The fused, hierarchical pooled exchange in the planner (Plan.exchange "fused_pooled",
planner.pooled_twrw): lowering gives the group one collective per stage (IDs over all ranks,
a reduce-scatter inside the node, an all-to-all among peers across nodes), the search picks
it where it beats its other plans (DLRM-DCNv2 on 4 nodes of 8 H100), and --explain says so."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from planner.access import table_access
from planner.explain import explain
from planner.lowering import lower
from planner.plan import PackPlan, Plan
from planner.presets import get_model
from planner.search import search
from simulator.hardware import load_hardware
from tests.test_executor_pooled import model


def test_group_lowers_to_one_collective_per_stage():
    hw = load_hardware("dgx-h100", ["nodes=2", "gpus_per_node=2"])
    packs = [PackPlan("a", ["C1", "C2"], "table_row_wise", [0, 1], exchange="pooled"),
             PackPlan("b", ["C3", "C5"], "table_row_wise", [2, 3], exchange="pooled"),
             PackPlan("c", ["C4"], "row_wise")]
    plan = Plan(model(), 4, 64, packs, micro_batches=2, exchange="fused_pooled")
    plan.validate()
    lo = lower(plan, hw, symmetric=False)
    names = {o.name: o for o in lo.ops}
    assert not any(n.startswith(("fwd/a/", "fwd/b/", "bwd/a/", "bwd/b/")) for n in names)
    rs, x = names["fwd/pooled/a2a_pooled@mb1"], names["fwd/pooled/a2a_pooled_x@mb1"]
    assert (rs.collective[0], rs.group) == ("reduce_scatter", "node")
    assert (x.collective[0], x.group) == ("all_to_all", "peers")
    assert names["bwd/pooled/a2a_pooled_grad@mb0"].collective[0] == "all_gather"
    assert "fwd/c/a2a_ids@mb0" in names  # other packs keep their own exchange
    # across nodes a requester gets one vector per bag and table of the group (32 samples per
    # micro-batch, 4 tables of dim 8, fp32), and an owner sends its node's 2 tables to 2 peers
    per_rank = 32 * 4 * 8 * 4.0
    assert np.allclose(np.asarray(x.collective[1]), per_rank)


def test_search_picks_the_fused_pooled_exchange_for_dcnv2_on_four_nodes():
    m = get_model("dlrm-dcnv2")
    hw = load_hardware("dgx-h100", ["nodes=4", "nic_per=node"])
    acc = table_access(m)
    res = search(m, hw, None, 4096, access=acc, time_budget_s=20)
    assert res.plan.exchange == "fused_pooled", res.best.label
    res.plan.validate()
    members = [p for p in res.plan.packs if p.sharding == "table_row_wise" and p.exchange == "pooled"]
    assert len(members) == 4
    per_pack = [e.iteration_us for e in res.candidates
                if e.iteration_us and e.plan.exchange != "fused_pooled"]
    assert res.best.iteration_us < 0.8 * min(per_pack)
    text = explain(res.plan, hw, access=acc, baselines=()).text()
    assert "fused pooled exchange pooled: packs node0, node1, node2, node3" in text


def test_fused_layouts_take_tables_out_of_the_group_replicated_or_as_rows():
    from planner.search import MAX_EXTRA_REPLICATED, _as_fused_pooled, _fused_pooled_layouts, byte_costs

    m = get_model("dlrm-dcnv2")
    hw = load_hardware("dgx-h100", ["nodes=4", "nic_per=node"])
    acc = table_access(m)
    c_a2a, c_ar = byte_costs(hw, hw.world_size)
    layouts = _fused_pooled_layouts(m, acc, hw, 4096, c_a2a, c_ar, float(hw.gpu.hbm_bytes))
    tags = [t for t, _ in layouts]
    assert tags[0] == "" and tags[1:3] == ["replicate+1", "rows+1"]
    assert len(tags) == 1 + 2 * MAX_EXTRA_REPLICATED
    base = {p.name: set(p.tables) for p in layouts[0][1]}
    for tag, packs in layouts[1:]:
        j = int(tag.split("+")[1])
        by = {p.name: p for p in packs}
        pooled = {t for p in packs if p.sharding == "table_row_wise" for t in p.tables}
        if tag.startswith("rows"):
            assert by["small"].tables and set(by["small"].tables) == base["small"]
            assert by["rows"].sharding == "row_wise" and len(by["rows"].tables) == j
            assert not pooled & set(by["rows"].tables)
        else:
            assert "rows" not in by and len(by["small"].tables) == len(base["small"]) + j
        plan = _as_fused_pooled(Plan(m, 32, 4096, [replace(p) for p in packs], hot_rows={}), True)
        for p in plan.packs:  # only the replicated tables become all hot
            assert plan.fully_hot(p) == (p.name == "small"), (tag, p.name)
