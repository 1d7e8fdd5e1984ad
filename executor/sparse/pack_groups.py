"""Which packs share their collectives, and every pack of a plan built as the executor runs it.

Two kinds of fused exchange share one set of collectives among member packs: the
table-row-wise groups of Plan.exchange "fused_pooled" (executor.sparse.pooled_twrw) and the runs of
pooled packs of TorchRec's own plans (executor.sparse.pooled_flat); every other pack exchanges on
its own (executor.sparse.pooled.make_pack).
"""

from __future__ import annotations

import numpy as np

from executor.comm import Comm, wire_id_dtype
from executor.sparse.pooled import make_pack
from executor.sparse.pooled_flat import FlatFuser
from executor.sparse.pooled_twrw import FusedPooledPack, Fuser
from executor.sparse.protocol import PackExchange
from planner.modes import PlanExchange
from planner.plan import PackPlan, Plan, fused_runs, pooled_at_owners
from planner.pooled_twrw import groups


def make_packs(plan: Plan, hot_ids: dict[str, np.ndarray], comm: Comm) -> list[PackExchange]:
    """Every pack of the plan as the executor runs it (executor.sparse.pooled.make_pack), the members
    of a fused pooled group sharing one Fuser: a table-row-wise group's (Plan.exchange
    "fused_pooled"), or a run of pooled packs that TorchRec fuses (Plan.exchange "torchrec",
    executor.sparse.pooled_flat)."""
    member_of: dict[str, tuple[Fuser, int]] = {}
    if comm.world > 1:
        for grp in groups(plan):
            fuser = Fuser(grp, comm.world, comm.rank, comm.device, plan.model.table(grp[0].tables[0]).dim,
                          wire_id_dtype(max(plan.wire_id_bytes(p) for p in grp)))
            for i, p in enumerate(grp):
                member_of[p.name] = (fuser, i)
        for run in flat_runs(plan):
            fuser = FlatFuser([p.name for p in run], [plan.pack_ranks(p) for p in run],
                              [plan.model.table(p.tables[0]).dim for p in run], comm.world, comm.rank, comm.device,
                              wire_id_dtype(max(plan.wire_id_bytes(p) for p in run)))
            for i, p in enumerate(run):
                member_of[p.name] = (fuser, i)
    out = []
    for p in plan.packs:
        if p.name in member_of:
            fuser, i = member_of[p.name]
            out.append(FusedPooledPack(plan, p, hot_ids, comm, fuser, i))
        else:
            out.append(make_pack(plan, p, hot_ids, comm))
    return out


def flat_runs(plan: Plan) -> list[list[PackPlan]]:
    """The runs of planner.plan.fused_runs the executor fuses (executor.sparse.pooled_flat): those of
    TorchRec's own plans, of two packs or more, every member pooled at its owners. A run of
    the rows exchange (sequence tables) runs pack by pack; so do the torchrec-like baseline's
    runs (Provenance.scoring fused_table_wise), which explain scores both ways."""
    if plan.exchange != PlanExchange.TORCHREC:
        return []
    return [run for run in fused_runs(plan) if len(run) > 1 and all(pooled_at_owners(plan, p) for p in run)]
