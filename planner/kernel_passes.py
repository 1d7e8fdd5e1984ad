"""The kernels behind each lowered op: how many the executor launches, how their memory is
accessed, and the passes a roofline over the op's totals would hide.

Lowering names ops as the executor times them (planner.op_names), one op per timed span; a
span runs several kernels one after the other. This module is the one owner of what those
kernels are, so that a faster kernel in the executor is a smaller op here:

- dense stages (MLPs, cross layers): per linear layer a GEMM (bias fused) and the activation;
  its backward two GEMMs, the activation's backward and the bias gradient's reduction. The
  GEMMs are tall-skinny (batch x width x width): eff_key "gemm". The elementwise passes
  run after their GEMM, not beside it: `fixed_hbm_bytes` at the streaming rate.
- embeddings: gathers, pooling and sparse updates read and write rows at random
  (eff_key "random": DevicePerf.hbm_random). The backward sorts the lookups by row
  (radix sort), run-length encodes them and sums each run (one row's gradient) without
  atomics; the longest run is summed by one unit alone (`run_bytes`: skew has a cost).
- everything else: one kernel or a few, streaming.

Demands only: no microseconds (simulator.cost prices them under any spec).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from planner import op_names as on
from planner.access import TableAccess
from planner.dense import DenseCost
from planner.model_spec import PER_ELEMENT_OPTIMIZERS, ModelSpec
from planner.program_ops import Op
from planner.volumes import ID_BYTES, PackVolumes
from simulator.device_perf import RANDOM_KEY

RADIX_PASSES = 4  # 8-bit digits over the row index of a table (up to 2^32 rows)
SORT_BYTES = (ID_BYTES + 4) * 2 * RADIX_PASSES  # per lookup: key + position, read and written, per pass
RLE_BYTES = ID_BYTES * 3  # per lookup: read sorted keys, write run starts and lengths

# kernels per op the executor launches (eager PyTorch or its Triton kernels), by base op name
EMBEDDING_KERNELS = {
    "dedup": 6, "bags": 4, "route": 4, "hot_gather": 2, "cold_gather": 2, "cold_pool": 3, "cold_h2d": 1,
    "pool": 2, "cold_update": 3, "hot_update": 2, "hot_sync": 1,
}
RANDOM_OPS = {"hot_gather", "cold_gather", "cold_pool", "pool", "cold_update", "hot_update"}
# the random-row ops that read a table (its shard or its hot cache) rather than a batch's buffer:
# their rows are spread over the table's memory (`span_bytes`: the TLB's share of misses); of
# their memory bytes, the demand "table_bytes" (set where lowering builds them) are the table's rows
TABLE_OPS = {"cold_gather": "shard", "cold_pool": "shard", "cold_update": "shard", "hot_gather": "hot",
             "hot_update": "hot"}
# the torch path's kernels per update beyond the fused one's: unique (a sort), the summed
# gradients, the state's read and write-back, the elementwise steps (executor.sparse.row_optimizers)
TORCH_UPDATE_KERNELS = {"adagrad": 10, "adam": 16}
INTERACTION_KERNELS = {"dot": (4, 6), "cross": (4, 7), "fm": (4, 6), "cat": (1, 1)}  # (fwd, bwd) per layer/op


def stage_layers(model: ModelSpec, stage: str) -> int:
    """Linear layers (or cross layers) of a dense stage of `model`."""
    if stage == "bottom_mlp":
        return len(model.bottom_mlp) or (1 if model.arch == "dlrm" else 0)
    if stage == "top_mlp":
        return len(model.top_mlp)
    if stage == "interaction" and model.arch == "dcn":
        return int(model.cross_layers)
    if stage == "interaction" and model.arch == "din":
        return len(model.attention_mlp) + 1
    return 1


def dense_kernels(model: ModelSpec, stage: str, backward: bool) -> int:
    """Kernels a dense stage launches per micro-batch."""
    layers = stage_layers(model, stage)
    if stage in ("bottom_mlp", "top_mlp") or (stage == "interaction" and model.arch == "din"):
        return layers * (4 if backward else 2)
    if stage == "interaction":
        f, b = INTERACTION_KERNELS.get(model.interaction, (4, 6))
        return layers * (b if backward else f)
    return 3 if not backward else 2  # the loss


def is_gemm_stage(model: ModelSpec, stage: str) -> bool:
    return stage in ("bottom_mlp", "top_mlp") or (stage == "interaction" and model.arch in ("dcn", "din"))


def dense_passes(dense: DenseCost, model: ModelSpec, stage: str, samples: float, act_scale: float,
                 backward: bool) -> float:
    """Bytes of a GEMM stage's elementwise passes (activation; backward: its gradient and the
    bias gradient's reduction), streamed after the GEMMs: per layer output, forward read +
    write (the stage's act_bytes), backward four passes (twice)."""
    if not is_gemm_stage(model, stage):
        return 0.0
    return samples * dense.ops[stage].act_bytes * act_scale * (2.0 if backward else 1.0)


def longest_run(pv: PackVolumes, access: dict[str, TableAccess]) -> float:
    """Lookups of the most frequent row of the pack in one micro-batch on one rank: the
    longest segment of the backward's segment sums."""
    best = 0.0
    for t in pv.tables:
        a = access.get(t)
        if a is None:
            continue
        best = max(best, pv.samples * float(a.pooling) * a.coverage_at(1))
    return best


def apply(ops: list[Op], model: ModelSpec, packs: list[PackVolumes], dense: DenseCost, samples: float,
          act_scale: float) -> None:
    """Set each op's kernel count, access pattern and passes, in place."""
    by_name = {pv.name: pv for pv in packs}
    for op in ops:
        if op.kind == "collective":
            continue
        phase, scope, name, _ = on.split_name(on.base_name(op.name))
        if scope == "dense" and name in on.DENSE_FWD and phase in ("fwd", "bwd"):
            add_dense(op, dense, model, name, samples, act_scale, phase == "bwd")
            continue
        pv = by_name.get(scope)
        if pv is None:
            continue
        op.args.setdefault("launch", EMBEDDING_KERNELS.get(name, 1))
        if name in ("cold_update", "hot_update") and pv.optimizer in PER_ELEMENT_OPTIMIZERS:
            op.args["launch"] += TORCH_UPDATE_KERNELS[pv.optimizer]
        if name in RANDOM_OPS and op.args.get("eff_key") is None:
            op.args["eff_key"] = RANDOM_KEY
        if name in TABLE_OPS and "table_bytes" in op.demand:
            op.args["span_bytes"] = span_bytes(pv, TABLE_OPS[name])
        if phase == "bwd" and name == "pool":
            # sort the lookups by row and find the runs, then sum each run: the longest alone
            op.args["fixed_hbm_bytes"] = op.args.get("fixed_hbm_bytes", 0.0) + pv.lookups * (SORT_BYTES + RLE_BYTES)
            op.args["run_bytes"] = pv.longest_run * pv.grad_row_bytes
            op.args["launch"] = EMBEDDING_KERNELS["pool"] + RADIX_PASSES + 2


def span_bytes(pv: PackVolumes, part: str) -> float:
    """Device memory a pack's random rows are spread over on its busiest rank: its cold shard, or its hot cache."""
    if part == "hot":
        return float(pv.hot_rows) * pv.row_bytes
    return float(np.max(pv.shard_rows)) * pv.slice_bytes if len(pv.shard_rows) else 0.0


def add_dense(op: Op, dense: DenseCost, model: ModelSpec, stage: str, samples: float, act_scale: float,
              backward: bool) -> Op:
    """A dense stage's op with its kernels, GEMM class and elementwise passes set."""
    op.args["launch"] = dense_kernels(model, stage, backward)
    if is_gemm_stage(model, stage):
        op.args["eff_key"] = "gemm"
    passes = dense_passes(dense, model, stage, samples, act_scale, backward)
    if passes:
        op.args["fixed_hbm_bytes"] = passes
    return op


def describe(op: Op) -> dict[str, Any]:
    """The kernel-level annotations of an op (for explanations and tests)."""
    return {k: op.args[k] for k in ("launch", "eff_key", "fixed_hbm_bytes", "run_bytes") if k in op.args}
