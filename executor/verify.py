"""The equivalence check: a plan's distributed training vs the single-process reference."""

from __future__ import annotations

import numpy as np
import torch

from executor.batches import Batch
from executor.comm import Comm
from executor.lowp import verify_tolerance
from executor.reference import Reference, dense_state, max_rel_diff
from executor.trainer import Trainer
from planner.plan import Plan


def local_rows(batch: Batch, plan: Plan, rank: int) -> Batch:
    """This rank's rows of a global batch."""
    b = plan.batch_size_per_rank
    return batch.slice(rank * b, (rank + 1) * b)


def compare(trainer: Trainer, batches: list[Batch]) -> dict[str, float] | None:
    """After `trainer` trained on `batches` (global), compare with the reference (collective).

    Returns, on rank 0, the largest relative differences of embeddings and dense weights
    (max|a-b| / max|b| per tensor) and how far the reference moved from its start.
    """
    weights, _ = trainer.full_tables()
    if trainer.comm.rank != 0:
        return None
    plan = trainer.plan
    ref = Reference(plan)
    start = ref.tables()
    for b in batches:
        ref.step(b)
    emb = max_rel_diff(weights, ref.tables())
    dense = max_rel_diff(dense_state(trainer.dense), dense_state(ref.dense))
    return {
        "max_rel_diff": max(emb, dense),
        "embedding_rel_diff": emb,
        "dense_rel_diff": dense,
        "reference_moved": max_rel_diff(start, ref.tables()),
        "tolerance": verify_tolerance(plan.model),  # 16-bit tables: executor.lowp
    }


def train_and_compare(plan: Plan, hot_ids: dict[str, np.ndarray], batches: list[Batch], comm: Comm | None = None):
    """Train `plan` on the global `batches` on this rank, then `compare` (rank 0 gets the result)."""
    comm = comm or Comm()
    torch.manual_seed(0)
    trainer = Trainer(plan, hot_ids, comm)
    for b in batches:
        trainer.step(local_rows(b, plan, comm.rank))
    return compare(trainer, batches)


def synthetic_global_batches(plan: Plan, steps: int, seed: int) -> list[Batch]:
    """`steps` global batches of skewed synthetic rows for the plan's model."""
    from executor.batches import feature_map, synthetic_raw, to_batch

    g = plan.global_batch
    raw = synthetic_raw(plan.model, g * steps, seed=seed)
    fmap = feature_map(plan.model, raw.sparse)
    return [to_batch(raw.slice(s * g, (s + 1) * g), plan.model, fmap) for s in range(steps)]


def equivalence_worker(rank: int, world: int, cases: list[tuple[dict, dict, int, int]]) -> list:
    """For executor.spawn.run_ranks: each case (plan dict, hot ids, data seed, steps) -> result on rank 0."""
    out = []
    for plan_d, hot, seed, steps in cases:
        plan = Plan.from_dict(plan_d)
        batches = synthetic_global_batches(plan, steps, seed)
        out.append(train_and_compare(plan, hot, batches))
    return out
