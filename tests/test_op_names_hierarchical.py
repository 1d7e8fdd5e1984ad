"""Every op a fused pooled table-row-wise plan lowers to is named as planner.op_names builds and
parses names, micro-batch included (the across-node stage of a hierarchical exchange was once
named `...@mb0_x`)."""

from __future__ import annotations

from planner import op_names as on
from planner.lowering import lower
from planner.plan import PackPlan, Plan
from planner.presets import get_model
from simulator.hardware import load_hardware


def test_hierarchical_exchange_ops_round_trip_through_split_name():
    m = get_model("dlrm-criteo-kaggle")
    names = m.table_names
    plan = Plan(m, 16, 512, [PackPlan("a", names[:13], "table_row_wise", list(range(8)), exchange="pooled"),
                             PackPlan("b", names[13:], "table_row_wise", list(range(8, 16)), exchange="pooled")],
                micro_batches=2, exchange="fused_pooled")
    low = lower(plan, load_hardware("dgx-h100", ["nodes=2"]))
    ops = [op.name for op in low.ops]
    across = [n for n in ops if "_x" in n]
    assert across and all("@mb" in n for n in across)
    for n in ops:
        phase, scope, op, mb = on.split_name(n)
        assert on.op_name(phase, scope, op, mb) == n
        if scope not in ("dense", "input"):
            assert op in on.PACK_FWD + on.PACK_BWD + on.PACK_OPT, n
