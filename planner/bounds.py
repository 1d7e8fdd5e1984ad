"""What no plan can beat: the iteration with the embedding part costing nothing.

A plan chooses how embeddings are packed, placed, exchanged and cached; the input copy, the
dense layers and the dense gradients' all-reduce are the same for every plan of a model on
a hardware. Simulating one iteration with every pack op removed gives the time of a plan
whose embeddings are free, so `baseline_us / embedding_free_us(...)` bounds the speedup
any plan can reach over that baseline (Amdahl's law, with the simulator's overlap rules).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from planner import op_names as on
from planner.access import TableAccess
from planner.lowering import Lowered, Op, emit_graph, lower
from planner.plan import Plan

DENSE_SCOPES = ("dense", "input")


def dense_only_ops(lowered: Lowered) -> list[Op]:
    """The ops of `lowered` outside every pack, with dependencies passed through the removed
    ones, and the gradient all-reduce carrying the dense gradients alone."""
    kept: list[Op] = []
    # dense gradients already all-reduced in buckets during the backward (grad_bucket_mb)
    buckets = {on.op_name("bwd", "dense", n) for n in on.GRAD_BUCKET_NAMES}
    bucketed = sum(float(op.collective[1]) for op in lowered.ops if op.name in buckets)
    through: dict[str, list[str]] = {}  # removed op -> the kept ops it waited for
    for op in lowered.ops:
        deps = list(dict.fromkeys(d for name in op.deps for d in through.get(name, [name])))
        if on.split_name(op.name)[1] not in DENSE_SCOPES:
            through[op.name] = deps
            continue
        new = replace(op, deps=deps)
        if op.collective is not None and op.name == on.op_name("bwd", "dense", "allreduce"):
            new = replace(new, collective=(op.collective[0], float(lowered.dense.params * 4) - bucketed))
        kept.append(new)
    return kept


def embedding_free_us(plan: Plan, hw: Any, access: dict[str, TableAccess], engine: str = "simpy") -> float:
    """Iteration time (us) of `plan` on `hw` if every embedding op took no time, at the best of
    the dense-side choices the search gives any plan (micro-batch count, gradient buckets):
    a bound on every plan, not on those sharing `plan`'s choices."""
    from planner.grad_buckets import DDP_BUCKET_CAP_MB
    from planner.search import BUCKET_CAPS_MB, MICRO_BATCHES
    from simulator.engine import simulate

    ks = {plan.micro_batches} | {k for k in MICRO_BATCHES if plan.batch_size_per_rank % k == 0}
    caps = {plan.grad_bucket_mb, 0.0, DDP_BUCKET_CAP_MB, *BUCKET_CAPS_MB} if plan.world_size > 1 else {0.0}
    best = float("inf")
    for k in sorted(ks):
        for cap in sorted(caps):
            variant = replace(plan, micro_batches=k, grad_bucket_mb=cap, ids_after_mb=None)
            lowered = lower(variant, hw, access=access, symmetric=True, check_memory=False)
            graph = emit_graph(dense_only_ops(lowered), plan.world_size, symmetric=True)
            best = min(best, float(simulate(graph, hw, engine=engine).iteration_us))
    return best
