"""One schedule: the ops one real training step issues, per rank and lane and in order, are the
ops of the lowered graph (planner.lowering.build_program) for that rank and lane, in order.

Random plans over every sharding, both per-pack exchanges (pooled on one rank too), host placement, both hot syncs,
1/2/4 micro-batches, kernel interleaving, the input pipeline (and where its IDs go), gradient
buckets and the layered backward run 3 steps on 1 and 2 ranks over gloo; the middle step's
issue order is recorded at the trainer's timer (executor.step.timing.OpTimer.start: every op the
step times starts there, in issue order). How the two sides name the same program differently,
each in one place here:
- the executor has no copy stream: lowering's copy lane (the step's input, a host pack's PCIe
  copy) is issued on its compute stream, in program order;
- fwd/input/h2d_next is the worker's DeviceFeeder, not the step;
- an op lowering gives only to the ranks with work (an owner's gather or update) is issued, empty,
  on the others.
Known exclusions, where lowering and the executor describe different programs (each more than a
renaming; what differs, per rank and lane, on 2 ranks):
- TorchRec's own plans (Plan.exchange torchrec, planner.torchrec_bridge: pooled packs, input
  pipeline, DDP's 25 MiB buckets). Lowering scores them as TorchRec runs them
  (lowering._tr_pack_fwd/_tr_pack_bwd); the executor runs them with its own step, fusing only
  runs of two or more pooled packs (executor.sparse.pooled_flat). Compute lane: the executor
  issues each pack's dedup (pooled: bags) and route, which lowering's TorchRec path has
  neither of; it issues the bottom MLP after the packs' route, lowering before the
  lookups; a pooled pack's owner part is `cold_pool` in the executor, `cold_gather` in
  lowering; lowering's run of table-wise packs is one op `first..last/op`, the executor's a
  run of rows packs is issued pack by pack. Comm lane: the executor's `a2a_pooled` and
  `a2a_pooled_grad` are lowering's `a2a_emb` and `a2a_grad` (a reduce-scatter and an
  all-gather for row-wise packs); the dense gradients' last bucket is the executor's
  `bwd/dense/allreduce` on lane grad_sync with the hot rows', lowering's
  `bwd/dense/allreduce_dense` on comm; a replicated pack's gradient all-reduce is the
  executor's `opt/<pack>/cold_update` on comm, in lowering part of allreduce_dense.
- Fused pooled plans (Plan.exchange fused_pooled, planner.pooled_twrw). Lowering issues one
  group op `fwd/pooled/<op>` at the first member's place; the executor issues each member's
  ops (`fwd/<member>/bags`, `route`, `hot_gather`, `cold_pool`, `pool`, `opt/<member>/...`)
  at the member's own place in plan order, so a non-member pack between two members comes
  before the group's collective in the executor and after it in lowering (comm lane: e.g.
  `pack2/a2a_ids` before the group's IDs). The group's pooled sums are two collectives in
  lowering, `a2a_pooled` on lane node_group and `a2a_pooled_x` on peers_group (on one node
  too, where the executor copies locally), and one op per member, `<member>/a2a_pooled`
  on comm, in the executor; likewise the gradients (`a2a_pooled_grad`, `a2a_pooled_grad_x`).
"""

from __future__ import annotations

import numpy as np
import pytest

from executor.process.spawn import run_ranks
from planner.builders import random_plan
from planner.lowering import lower
from planner.plan import Plan
from simulator.hardware import load_hardware
from tests.shared_ranks import shared_call
from tests.test_executor_features import SGD, model

UNISSUED = {"fwd/input/h2d_next"}  # the worker's input copy a batch ahead, not the step's


def plan_for(world: int, seed: int) -> tuple[Plan, dict[str, list[int]]]:
    rng = np.random.default_rng(seed)
    plan, hot = random_plan(model(), world, 16, rng, optimizer=SGD)
    plan.input_pipeline = bool(rng.integers(2))
    if plan.input_pipeline and rng.integers(2):
        plan.ids_after_mb = int(rng.integers(plan.micro_batches))
    plan.grad_bucket_mb = float(rng.choice([0.0, 1e-4]))
    plan.backward_by_layer = bool(rng.integers(2))
    for p in plan.packs:
        p.placement = ["hbm", "host"][int(rng.integers(2))]
        p.hot_sync = ["dense", "sparse"][int(rng.integers(2))]
        # on one rank a pooled pack is run and lowered as rows (planner.plan.pooled_at_owners)
        if p.sharding.can_pool_at_owner and rng.integers(2):
            p.exchange = "pooled"
    plan.validate()
    return plan, {t: ids.tolist() for t, ids in hot.items()}


def issued_worker(rank: int, world: int, cases: list[tuple[dict, dict]]) -> list[list[tuple[str, str]]]:
    """Per case: (op name, lane) of every op this rank's second of three steps issued, in order."""
    from executor.comm import Comm
    from executor.run.verify import local_rows, synthetic_global_batches
    from executor.step.timing import OpTimer
    from executor.step.trainer import Trainer

    out = []
    for plan_d, hot in cases:
        plan = Plan.from_dict(plan_d)
        comm = Comm()
        timer = OpTimer(rank, comm.device, enabled=True, micro_batches=plan.micro_batches)
        log: list[tuple[str, str]] = []
        recording = [False]
        start = timer.start

        def recorded(phase, scope, op, mb=None, lane="compute", start=start, log=log, recording=recording, timer=timer):
            if recording[0]:
                log.append((timer.name(phase, scope, op, mb), lane))
            return start(phase, scope, op, mb, lane)

        timer.start = recorded
        trainer = Trainer(plan, {t: np.asarray(v, dtype=np.int64) for t, v in hot.items()}, comm, timer)
        local = [local_rows(b, plan, rank) for b in synthetic_global_batches(plan, 3, 0)]
        for s in range(3):  # the middle step: a steady one (the input pipeline's IDs came ahead)
            recording[0] = s == 1
            trainer.step(local[s], local[s + 1] if s + 1 < len(local) else None)
            timer.discard()
        out.append(log)
    return out


def lowered(plan: Plan) -> tuple[dict[int, list[tuple[str, str]]], set[str]]:
    """Per rank, (op name, lane) of the lowered program in issue order; and every op's name."""
    hw = load_hardware("local-cpu", [f"gpus_per_node={plan.world_size}"])
    ops = lower(plan, hw, symmetric=False, check_memory=False).ops
    per_rank = {r: [(o.name, "compute" if o.lane == "copy" else o.lane) for o in ops if o.name not in UNISSUED
                    and (o.ranks is None or r in np.asarray(o.ranks).tolist())] for r in range(plan.world_size)}
    return per_rank, {o.name for o in ops}


def mismatches(plan: Plan, issued: list[list[tuple[str, str]]]) -> list[str]:
    want, names = lowered(plan)
    out = []
    for r, ops in enumerate(issued):
        mine = {n for n, _ in want[r]}
        # an op lowering gives only to other ranks is issued here, empty
        got = [(n, lane) for n, lane in ops if n in mine or n not in names]
        for lane in sorted({lane for _, lane in got} | {lane for _, lane in want[r]}):
            a = [n for n, x in got if x == lane]
            b = [n for n, x in want[r] if x == lane]
            if a != b:
                at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                out.append(f"rank {r} lane {lane}: op {at} issued {a[at:at + 3]}, lowered {b[at:at + 3]}")
    return out


SEEDS = {1: range(4), 2: range(10)}
# two ranks: in the session's shared group (tests/shared_ranks.py); one rank: a group of its own
SHARED = shared_call(__name__, 2, issued_worker, [(p.to_dict(), hot) for p, hot in (plan_for(2, s) for s in SEEDS[2])],
                     timeout_s=120)


@pytest.mark.dist
@pytest.mark.parametrize("world, seeds", SEEDS.items())
def test_a_step_issues_the_lowered_ops_in_order(world, seeds, shared_ranks):
    plans = [plan_for(world, s) for s in seeds]
    issued = (shared_ranks(SHARED) if world == 2 else
              run_ranks(issued_worker, world, [(p.to_dict(), hot) for p, hot in plans], timeout_s=120))
    bad = {}
    for i, (plan, _) in enumerate(plans):
        found = mismatches(plan, [issued[r][i] for r in range(world)])
        if found:
            bad[f"seed {seeds[i]}"] = found
    assert not bad, bad
