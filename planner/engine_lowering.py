"""Lowering's pass for an engine's traits (planner.engines): the program picasso's executor would
launch, changed where the plan's engine runs differently. Demands only, as all of lowering.

Applied after the kernels are set (planner.kernel_passes), so that a fused kernel replaces the
kernels and passes of the ops it fuses; an engine without a trait leaves its ops unchanged.
"""

from __future__ import annotations

import numpy as np

from planner import op_names as on
from planner.dense import DenseCost, DenseOp
from planner.engines import Trait, traits
from planner.kernel_passes import RLE_BYTES, SORT_BYTES
from planner.model_spec import ModelSpec
from planner.plan import Plan
from planner.program_ops import Op
from planner.volumes import PackVolumes


def engine_dense(dense: DenseCost, plan: Plan) -> DenseCost:
    """The dense costs under the plan's engine: a fused dot interaction (Trait.FUSED_INTERACTION)
    reads the F x D features once and writes the top MLP's input once; with the pooling fused
    into it (Trait.FUSED_POOL_INTERACTION) the embeddings' part is read where it is produced."""
    have = traits(plan.provenance.engine)
    model = plan.model
    if Trait.FUSED_INTERACTION not in have or model.arch != "dlrm" or model.interaction != "dot":
        return dense
    inter = dense.ops["interaction"]
    features = len(model.tables) + 1
    dim = model.tables[0].dim
    read = features - (len(model.tables) if Trait.FUSED_POOL_INTERACTION in have else 0)
    traffic = 4.0 * (read * dim + dense.top_in)
    ops = {**dense.ops, "interaction": DenseOp(inter.flops, inter.params, inter.act_bytes, traffic)}
    return DenseCost(ops, dense.feature_width, dense.top_in)


def serial(plan: Plan) -> bool:
    """Whether the step is one serial chain on the plan's engine (without interleaving, picasso's is)."""
    return Trait.OVERLAPPED_PIPELINE not in traits(plan.provenance.engine)


HALVED = ("a2a_emb", "a2a_grad", "allreduce")  # collectives of vectors and gradients (Trait.HALF_EXCHANGE)


def apply(ops: list[Op], plan: Plan, packs: list[PackVolumes], micro_batches: int, act_scale: float) -> None:
    """Change the ops of one iteration in place for the plan's engine (planner.engines' table);
    `act_scale` is the dense dtype's bytes over fp32's."""
    have = traits(plan.provenance.engine)
    by_name = {pv.name: pv for pv in packs}
    world = plan.world_size
    for op in ops:
        phase, scope, name, _ = on.split_name(on.base_name(op.name))
        if Trait.HALF_EXCHANGE in have and op.collective is not None and name in HALVED and act_scale < 1.0:
            op.collective = (op.collective[0], op.collective[1] * act_scale)
            continue
        if Trait.BOTTOM_MLP_ON_ONE_RANK in have and world > 1 and scope == "dense" and name == "bottom_mlp":
            _on_rank0_for_all(op, world)
        elif Trait.FUSED_INTERACTION in have and scope == "dense" and name == "interaction" and _dot(plan.model):
            op.args["launch"] = 1 if phase == "fwd" else 2
        elif Trait.FUSED_POOL_INTERACTION in have and name == "pool" and scope in by_name:
            pv = by_name[scope]
            # the pooled vectors (forward) and their gradients (backward) stay on chip
            op.demand["hbm_bytes"] = np.maximum(op.demand["hbm_bytes"] - pv.samples * pv.pooled_width * 4, 0.0)
        elif (Trait.SPARSE_GRAD_OPTIMIZER in have and world > 1 and phase == "opt" and name == "cold_update"
              and scope in by_name):
            pv = by_name[scope]
            lookups = np.asarray(pv.recv_ids, dtype=float) * micro_batches
            extra = float(np.max(lookups)) * (pv.grad_row_bytes * 4 + SORT_BYTES + RLE_BYTES)
            op.args["fixed_hbm_bytes"] = float(op.args.get("fixed_hbm_bytes", 0.0)) + extra
            op.args["launch"] = int(op.args.get("launch", 1)) + 8  # sparse tensor, coalesce (sort, reduce), add


def _dot(model: ModelSpec) -> bool:
    return model.arch == "dlrm" and model.interaction == "dot"


def _on_rank0_for_all(op: Op, world: int) -> None:
    """A dense stage that rank 0 runs for every rank's samples; the others skip it."""
    for k in ("flops", "hbm_bytes"):
        op.demand[k] = op.demand.get(k, 0.0) * world
    if op.args.get("fixed_hbm_bytes"):
        op.args["fixed_hbm_bytes"] = float(op.args["fixed_hbm_bytes"]) * world
    op.ranks = np.array([0])
