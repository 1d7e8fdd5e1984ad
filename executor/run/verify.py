"""The equivalence check: a plan's distributed training vs the single-process reference."""

from __future__ import annotations

import copy

import numpy as np
import torch

from executor.comm import Comm
from executor.data.batches import Batch
from executor.run.checkpoint import read_manifest, saved_tables
from executor.run.reference import Reference, dense_state, max_rel_diff
from executor.sparse import row_optimizers
from executor.sparse.collect import block_rel_diff, full_packs
from executor.sparse.lowp import verify_tolerance
from executor.step.trainer import Trainer
from planner.model_spec import ModelSpec
from planner.plan import Plan


def local_rows(batch: Batch, plan: Plan, rank: int) -> Batch:
    """This rank's rows of a global batch."""
    b = plan.batch_size_per_rank
    return batch.slice(rank * b, (rank + 1) * b)


TOLERANCE = {"fp32": 1e-4, "tf32": 1e-2, "bf16": 3e-2}  # by the dense precision the trainer used


def default_tolerance(model: ModelSpec, dense_dtype: str) -> float:
    """--verify's tolerance: the dense precision's, looser for 16-bit tables (executor.sparse.lowp)
    and for tables that Adagrad or Adam train (executor.sparse.row_optimizers)."""
    per_element = any(t.optimizer in row_optimizers.TORCH_ONLY for t in model.tables)
    return max(TOLERANCE.get(dense_dtype, TOLERANCE["fp32"]), verify_tolerance(model),
               row_optimizers.VERIFY_TOL if per_element else 0.0)


def start_state(trainer: Trainer, checkpoint: str) -> Reference | None:
    """On rank 0, the reference set to the state the run resumed from; None elsewhere.

    A resumed run is compared from where it resumed, not from the checkpoint's history.
    Rank 0 reads the same checkpoint the trainer loaded, one saved pack at a time: no
    collective, and no full copy of the tables on any rank beyond the reference's own.
    """
    if trainer.comm.rank != 0:
        return None
    ref = Reference(trainer.plan)
    m = read_manifest(checkpoint, trainer.plan)
    ref.load_state(saved_tables(m, trainer.plan.model), copy.deepcopy(trainer.dense.state_dict()),
                   copy.deepcopy(trainer.opt.state_dict()))
    return ref


def compare(trainer: Trainer, batches: list[Batch], start: Reference | None = None) -> dict[str, float] | None:
    """After `trainer` trained on `batches` (global), compare with the reference (collective).

    The reference is `start` (see start_state) when given, else one at the plan's initial
    weights. Returns, on rank 0, the largest relative differences of embeddings and
    dense weights (max|a-b| / max|b| per tensor) and how far the reference moved from its
    start. Rank 0 builds the reference first, then takes the trained packs one at a time
    (executor.sparse.collect): its cost is executor.run.reference.reference_bytes.
    """
    plan, rank, world = trainer.plan, trainer.comm.rank, trainer.comm.world
    ref = None
    if rank == 0:
        ref = start if start is not None else Reference(plan)
        for b in batches:
            ref.step(b)
    emb = 0.0
    for p in trainer.packs:
        for full in full_packs(p, rank, world):
            off = 0
            for t in p.layout.tables:
                n = plan.model.table(t).num_rows
                emb = max(emb, block_rel_diff(full[off : off + n], ref.weight(t)))
                off += n
            del full
    if rank != 0:
        return None
    dense = max_rel_diff(dense_state(trainer.dense), dense_state(ref.dense))
    return {
        "max_rel_diff": max(emb, dense),
        "embedding_rel_diff": emb,
        "dense_rel_diff": dense,
        "reference_moved": ref.moved_from_start(),
        "tolerance": default_tolerance(plan.model, trainer.precision.used),
    }


def train_and_compare(plan: Plan, hot_ids: dict[str, np.ndarray], batches: list[Batch], comm: Comm | None = None):
    """Train `plan` on the global `batches` on this rank, then `compare` (rank 0 gets the result)."""
    comm = comm or Comm()
    torch.manual_seed(0)
    trainer = Trainer(plan, hot_ids, comm)
    local = [local_rows(b, plan, comm.rank) for b in batches]
    for s, rows in enumerate(local):  # the next rows too: the input pipeline sends their IDs ahead
        trainer.step(rows, local[s + 1] if s + 1 < len(local) else None)
    return compare(trainer, batches)


def synthetic_global_batches(plan: Plan, steps: int, seed: int) -> list[Batch]:
    """`steps` global batches of skewed synthetic rows for the plan's model."""
    from executor.data.batches import feature_map, synthetic_raw, to_batch

    g = plan.global_batch
    raw = synthetic_raw(plan.model, g * steps, seed=seed)
    fmap = feature_map(plan.model, raw.sparse)
    return [to_batch(raw.slice(s * g, (s + 1) * g), plan.model, fmap) for s in range(steps)]


def equivalence_worker(rank: int, world: int, cases: list[tuple[dict, dict, int, int]]) -> list:
    """For executor.process.spawn.run_ranks: each case (plan dict, hot ids, data seed, steps) -> result on rank 0."""
    out = []
    for plan_d, hot, seed, steps in cases:
        plan = Plan.from_dict(plan_d)
        batches = synthetic_global_batches(plan, steps, seed)
        out.append(train_and_compare(plan, hot, batches))
    return out
