"""The fused, hierarchical pooled exchange in the planner (Plan.exchange "fused_pooled",
planner.pooled_twrw): lowering gives the group one collective per stage (IDs over all ranks,
a reduce-scatter inside the node, an all-to-all among peers across nodes), the search picks
it where it beats its other plans (DLRM-DCNv2 on 4 nodes of 8 H100), and --explain says so."""

from __future__ import annotations

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
