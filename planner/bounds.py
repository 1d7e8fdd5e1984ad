"""What no plan can beat: the iteration with the embedding part costing nothing.

A plan chooses how embeddings are packed, placed, exchanged and cached; the input copy, the
dense layers and the dense gradients' all-reduce are the same for every plan of a model on
a hardware. Simulating one iteration with every pack op removed gives the time of a plan
whose embeddings are free, so `baseline_us / embedding_free_us(...)` bounds the speedup
any plan can reach over that baseline (Amdahl's law, with the simulator's overlap rules).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from planner import op_names as on
from planner.access import TableAccess
from planner.dense import DenseCost
from planner.lowering import Lowered, Op, analyze, build_program, emit_graph, lower
from planner.plan import Plan

if TYPE_CHECKING:  # types only: the seams' own classes, not loaded at import
    from simulator.hardware import HardwareSpec


DENSE_SCOPES = ("dense", "input")


def dense_only_ops(lowered: Lowered) -> list[Op]:
    """The ops of `lowered` outside every pack, with dependencies passed through the removed
    ones, and the gradient all-reduce carrying the dense gradients alone."""
    return _dense_only(lowered.ops, lowered.dense)


def _dense_only(ops: list[Op], dense: DenseCost) -> list[Op]:
    kept: list[Op] = []
    # dense gradients already all-reduced in buckets during the backward (grad_bucket_mb)
    buckets = {on.op_name("bwd", "dense", n) for n in on.GRAD_BUCKET_NAMES}
    bucketed = sum(float(op.collective[1]) for op in ops if op.name in buckets)
    through: dict[str, list[str]] = {}  # removed op -> the kept ops it waited for
    for op in ops:
        deps = list(dict.fromkeys(d for name in op.deps for d in through.get(name, [name])))
        if on.split_name(op.name)[1] not in DENSE_SCOPES:
            through[op.name] = deps
            continue
        new = replace(op, deps=deps)
        if op.collective is not None and op.name == on.op_name("bwd", "dense", "allreduce"):
            new = replace(new, collective=(op.collective[0], float(dense.params * 4) - bucketed))
        kept.append(new)
    return kept


def embedding_free_us(plan: Plan, hw: HardwareSpec, access: dict[str, TableAccess], engine: str = "simpy") -> float:
    """Iteration time (us) of `plan` on `hw` if every embedding op took no time, at the best of
    the dense-side choices the search gives any plan (micro-batch count, gradient buckets):
    a bound on every plan, not on those sharing `plan`'s choices. The packs' volumes are
    computed once per micro-batch count, and caps with one bucket layout simulated once."""
    from planner.grad_buckets import DDP_BUCKET_CAP_MB, early_buckets
    from planner.search import BUCKET_CAPS_MB, MICRO_BATCHES
    from simulator.engine import simulate

    lower(plan, hw, access=access, symmetric=True, check_memory=False)  # the plan's own checks (ranks, ...)
    ks = {plan.micro_batches} | {k for k in MICRO_BATCHES if plan.batch_size_per_rank % k == 0}
    caps = {plan.grad_bucket_mb, 0.0, DDP_BUCKET_CAP_MB, *BUCKET_CAPS_MB} if plan.world_size > 1 else {0.0}
    best = float("inf")
    for k in sorted(ks):
        at_k = replace(plan, micro_batches=k, ids_after_mb=None)
        packs, _, dense = analyze(at_k, hw, access)
        seen = set()
        for cap in sorted(caps):
            layout = (cap > 0, tuple(early_buckets(dense, cap)) if cap > 0 else ())
            if layout in seen:
                continue
            seen.add(layout)
            ops = build_program(replace(at_k, grad_bucket_mb=cap), packs, dense, hw)
            graph = emit_graph(_dense_only(ops, dense), plan.world_size, symmetric=True)
            best = min(best, float(simulate(graph, hw, engine=engine).iteration_us))
    return best
