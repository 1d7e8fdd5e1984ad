"""Lowering issues the end of a step in the executor's order, and queues each process group's
collectives on a lane of its own.

- Trainer.step launches the replicated packs' gathers and the sparse hot syncs before the
  dense all-reduce (one queue), then runs every cold update, then the hot updates. A hot
  update waits for the all-reduce; issued before another pack's cold update, it held that
  update behind the all-reduce on the compute lane.
- A fused pooled group reduces inside the node and exchanges among peers on two process
  groups (executor.sparse.pooled_twrw.NodeGroups): one micro-batch's exchange across nodes runs
  beside the next one's reduce inside the node.
"""

from __future__ import annotations

from planner.access import table_access
from planner.lowering import analyze, build_program
from planner.plan import PackPlan, Plan
from simulator.hardware import load_hardware
from simulator.measured import NODE_LANE, PEERS_LANE
from tests.test_executor_fused_pooled import fused_plan
from tests.test_executor_pooled import model


def _program(plan: Plan, hw_name: str = "local-cpu", over: tuple = ()):
    hw = load_hardware(hw_name, [f"gpus_per_node={plan.world_size}", *over] if hw_name == "local-cpu" else list(over))
    packs, _, dense = analyze(plan, hw, table_access(plan.model))
    return build_program(plan, packs, dense, hw)


def test_every_cold_update_is_issued_before_the_hot_updates_and_the_syncs_before_the_all_reduce():
    packs = [PackPlan("a", ["C1", "C2"], "row_wise", hot_sync="sparse"), PackPlan("b", ["C3"], "row_wise"),
             PackPlan("c", ["C4"], "replicated"), PackPlan("d", ["C5"], "table_wise", ranks=[1])]
    plan = Plan(model("sum"), 4, 16, packs, hot_rows={"C2": 30, "C3": 200}, hot_ids_file="hot.npz",
                micro_batches=2, kernel_interleaving=True)
    names = [op.name for op in _program(plan)]
    at = names.index
    colds = [at(f"opt/{p}/cold_update") for p in "abd"]
    hots = [at(f"opt/{p}/hot_update") for p in "ab"]
    assert max(colds) < min(hots), names[min(colds):]
    # the replicated pack's gather and the sparse hot sync go before the all-reduce, as launched
    assert at("opt/c/cold_update") < at("bwd/dense/allreduce") and at("opt/a/hot_sync") < at("bwd/dense/allreduce")


def test_a_fused_groups_node_and_peer_collectives_queue_on_their_own_lanes():
    ops = {op.name: op for op in _program(fused_plan(4, 2, k=2))}
    for mb in (0, 1):
        assert ops[f"fwd/pooled/a2a_pooled@mb{mb}"].lane == NODE_LANE
        assert ops[f"fwd/pooled/a2a_pooled_x@mb{mb}"].lane == PEERS_LANE
        assert ops[f"bwd/pooled/a2a_pooled_grad_x@mb{mb}"].lane == PEERS_LANE
        assert ops[f"bwd/pooled/a2a_pooled_grad@mb{mb}"].lane == NODE_LANE
    # the IDs stay on the default group's lane
    assert ops["fwd/pooled/a2a_ids@mb0"].lane == "comm"
