"""TorchRec's own plans (Plan.exchange "torchrec") run as TorchRec runs them: each run of
pooled packs that lowering scores as one exchange (planner.plan.fused_runs) moves in one
all-to-all per stage (executor.sparse.pooled_flat), not one per pack. The weights are the
reference's, and bit for bit those of the same plan exchanged pack by pack: table-wise runs
without overlap and with the input pipeline (TorchRec's own shape), a table-row-wise run,
micro-batches with interleaving, hot rows, mean pooling and row-wise Adagrad, at 2 and 4
ranks."""

from __future__ import annotations

import numpy as np
import pytest

from executor.sparse.pack_groups import flat_runs
from planner.plan import PackPlan, Plan, fused_runs
from tests.equivalence_cases import assert_shared_cases_match, shared_cases
from tests.shared_ranks import shared_call
from tests.test_executor_pooled import ADAGRAD, HOT, SGD, TOL, model


def torchrec_plan(world: int, pooling: str = "sum", *, k: int = 1, ki: bool = False, opt=SGD, twrw: bool = False,
                  hot: bool = False) -> Plan:
    last = world - 1
    if twrw:  # two nodes of world/2 ranks, one member on each, then a table-wise run
        half = world // 2
        packs = [PackPlan("w0", ["C1", "C2"], "table_row_wise", ranks=list(range(half)), exchange="pooled"),
                 PackPlan("w1", ["C3"], "table_row_wise", ranks=list(range(half, world)), exchange="pooled"),
                 PackPlan("t0", ["C4"], "table_wise", ranks=[last], exchange="pooled"),
                 PackPlan("t1", ["C5"], "table_wise", ranks=[0], exchange="pooled")]
    else:  # a table-wise run over every rank, then a row-wise pack of its own
        packs = [PackPlan("t0", ["C1", "C2"], "table_wise", ranks=[0], exchange="pooled"),
                 PackPlan("t1", ["C3"], "table_wise", ranks=[last], exchange="pooled"),
                 PackPlan("t2", ["C5"], "table_wise", ranks=[1 % world], exchange="pooled"),
                 PackPlan("r", ["C4"], "row_wise", exchange="pooled")]
    rows = {"C2": 30, "C3": 200, "C5": 20} if hot else {}
    return Plan(model(pooling), world, 16, packs, hot_rows=rows, hot_ids_file="hot.npz" if hot else None,
                micro_batches=k, kernel_interleaving=ki, optimizer=opt, input_pipeline=True, exchange="torchrec")


def plans(world: int) -> list[Plan]:
    return [torchrec_plan(world), torchrec_plan(world, "mean", opt=ADAGRAD, hot=True),
            torchrec_plan(world, k=2, ki=True, twrw=True), torchrec_plan(world, k=1, twrw=True, opt=ADAGRAD)]


def test_runs_fused_are_lowerings():
    p = torchrec_plan(4)
    assert [[q.name for q in r] for r in fused_runs(p)] == [["t0", "t1", "t2"]]
    assert [[q.name for q in r] for r in flat_runs(p)] == [["t0", "t1", "t2"]]
    assert [[q.name for q in r] for r in flat_runs(torchrec_plan(4, twrw=True))] == [["w0", "w1"], ["t0", "t1"]]
    p.exchange = "per_pack"
    assert flat_runs(p) == [] and fused_runs(p) == []
    seq = torchrec_plan(4)
    seq.packs[1].exchange = "rows"  # a run with a member that sends rows back is not fused
    assert flat_runs(seq) == []


SHARED = {w: shared_cases(__name__, w, [(p.to_dict(), HOT, i, 2) for i, p in enumerate(plans(w))]) for w in (2, 4)}


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_torchrec_plans_match_reference(world, shared_ranks):
    assert_shared_cases_match(shared_ranks, SHARED[world], TOL,
                              lambda d: [(p["name"], p["sharding"], p["ranks"]) for p in d["packs"]])


def _train_worker(rank: int, world: int, plan_d: dict) -> list:
    """The plan trained 3 steps exchanged as TorchRec runs it, then pack by pack: per way, the
    all-to-alls its steps issued, and this rank's packs' rows and dense weights after."""
    import torch
    import torch.distributed as dist

    from executor.comm import Comm
    from executor.run.verify import local_rows, synthetic_global_batches
    from executor.step.trainer import Trainer

    calls = [0]
    real = dist.all_to_all_single

    def counted(*a, **kw):
        calls[0] += 1
        return real(*a, **kw)

    out = []
    for exchange in ("torchrec", "per_pack"):
        plan = Plan.from_dict(plan_d)
        plan.exchange = exchange
        torch.manual_seed(0)
        trainer = Trainer(plan, HOT, Comm())
        local = [local_rows(b, plan, rank) for b in synthetic_global_batches(plan, 3, seed=7)]
        calls[0] = 0
        dist.all_to_all_single = counted
        try:
            for s, rows in enumerate(local):
                trainer.step(rows, local[s + 1] if s + 1 < len(local) else None)
        finally:
            dist.all_to_all_single = real
        state = [p.weight.detach().numpy().copy() for p in trainer.packs]
        state += [q.detach().numpy().copy() for q in trainer.dense.parameters()]
        out.append((calls[0], state))
    return out


TRAINED = {twrw: shared_call(__name__, 4, _train_worker, torchrec_plan(4, opt=ADAGRAD, twrw=twrw).to_dict())
           for twrw in (False, True)}


@pytest.mark.dist
@pytest.mark.parametrize("twrw", [False, True])
def test_fused_run_is_one_collective_per_stage_with_the_same_weights(twrw, shared_ranks):
    plan = torchrec_plan(4, opt=ADAGRAD, twrw=twrw)
    runs = flat_runs(plan)
    members = sum(len(r) for r in runs)
    for (fused_calls, fused), (per_pack_calls, per_pack) in shared_ranks(TRAINED[twrw]):
        # per step and run: the per-pack exchange's IDs, lengths, sums and gradients of every
        # member (4 all-to-alls each) become 3 (IDs with lengths, sums, gradients)
        assert per_pack_calls - fused_calls == 3 * (4 * members - 3 * len(runs)), (fused_calls, per_pack_calls)
        assert len(fused) == len(per_pack)
        for a, b in zip(fused, per_pack):
            np.testing.assert_array_equal(a, b)
