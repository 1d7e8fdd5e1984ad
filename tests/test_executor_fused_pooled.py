"""The fused, hierarchical pooled exchange (Plan.exchange "fused_pooled") trains the same
weights as the reference: table-row-wise packs pooled at their owners, reduced inside the
node, then across nodes to the requesters, all members' collectives fused. Nodes are rank
groups: 2 ranks as 2 nodes of 1 and as 1 node of 2; 4 ranks as 2 nodes of 2 with two
members on one node, or all on one node; hot rows (dense and sparse sync), mean pooling, row-wise Adagrad,
host placement, kernel interleaving alone, and a plan mixing other packs."""

from __future__ import annotations

import pytest

from planner.errors import PlanError
from planner.plan import PackPlan, Plan
from tests.equivalence_cases import assert_shared_cases_match, shared_cases
from tests.shared_ranks import shared_call
from tests.test_executor_pooled import ADAGRAD, HOT, SGD, TOL, model


def fused_plan(world: int, g: int, pooling: str = "sum", *, hot_sync: str = "dense", placement: str = "hbm",
               k: int = 2, ki: bool = False, opt=SGD, mixed: bool = False) -> Plan:
    nodes = [list(range(n * g, n * g + g)) for n in range(world // g)]
    packs = [PackPlan("a", ["C1", "C2"], "table_row_wise", ranks=nodes[-1], hot_sync=hot_sync, placement=placement,
                      exchange="pooled"),
             PackPlan("b", ["C3"], "table_row_wise", ranks=nodes[0], exchange="pooled", hot_sync=hot_sync),
             PackPlan("c", ["C4", "C5"], "table_row_wise", ranks=nodes[-1], exchange="pooled")]
    if mixed:
        packs[2:] = [PackPlan("c", ["C4"], "replicated"), PackPlan("d", ["C5"], "row_wise")]
    hot = {"C2": 30, "C3": 200, "C5": 20}
    return Plan(model(pooling), world, 16, packs, hot_rows=hot, hot_ids_file="hot.npz", micro_batches=k,
                kernel_interleaving=ki, optimizer=opt, exchange="fused_pooled")


def cases(world: int) -> list:
    plans = [fused_plan(world, g) for g in ((1, 2) if world == 2 else (2,))]
    lopsided = fused_plan(world, world // 2)  # the last node holds no member
    for p in lopsided.packs:
        p.ranks = list(range(world // 2))
    plans += [lopsided, fused_plan(world, world // 2, "mean", hot_sync="sparse", opt=ADAGRAD),
              fused_plan(world, world // 2, k=1, ki=True, placement="host"),
              fused_plan(world, world // 2, k=4, opt=ADAGRAD, mixed=True)]
    return [(p.to_dict(), HOT, i, 2) for i, p in enumerate(plans)]


SHARED = {w: shared_cases(__name__, w, cases(w)) for w in (2, 4)}


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_fused_pooled_plans_match_reference(world, shared_ranks):
    assert_shared_cases_match(shared_ranks, SHARED[world], TOL, lambda d: [(p["name"], p["ranks"]) for p in d["packs"]])


def test_fused_pooled_refused_where_it_cannot_run():
    with pytest.raises(PlanError, match="needs micro_batches > 1 or kernel_interleaving"):
        fused_plan(4, 2, k=1).validate()
    bad = fused_plan(4, 2)
    bad.packs[0].ranks = [1, 2]
    with pytest.raises(PlanError, match="must hold one whole node"):
        bad.validate()


def _logits_worker(rank: int, world: int, plan_d: dict) -> list:
    """Evaluation's forward (executor.run.evaluate.forward_logits) of a fused plan and of the same
    plan exchanging pack by pack: the logits of this rank's rows."""
    from executor.comm import Comm
    from executor.run.evaluate import forward_logits
    from executor.run.verify import local_rows, synthetic_global_batches
    from executor.step.trainer import Trainer

    comm = Comm()
    out = []
    for exchange in ("fused_pooled", "per_pack"):
        plan = Plan.from_dict(plan_d)
        plan.exchange = exchange
        batch = synthetic_global_batches(plan, 1, seed=5)[0]
        out.append(forward_logits(Trainer(plan, HOT, comm), local_rows(batch, plan, rank)).numpy())
    return out


LOGITS = shared_call(__name__, 4, _logits_worker, fused_plan(4, 2).to_dict())


@pytest.mark.dist
def test_fused_pooled_evaluation_forward_matches_per_pack(shared_ranks):
    for fused, per_pack in shared_ranks(LOGITS):
        assert fused.shape == per_pack.shape and len(fused)
        assert abs(fused - per_pack).max() <= 1e-5 * max(abs(per_pack).max(), 1.0)
