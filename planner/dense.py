"""Cost of the dense part of a model per sample: FLOPs, parameters, activation bytes.

One entry per dense op of op_names.DENSE_FWD (bottom_mlp, interaction, top_mlp, loss);
the backward of each costs twice its forward FLOPs (grad w.r.t. input and weights).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from planner.model_spec import ModelSpec
from planner.modes import DenseDtype

if TYPE_CHECKING:  # types only: the seams' own classes, not loaded at import
    from simulator.hardware import HardwareSpec


# the dense layers' precision (ModelSpec.dense_precision): tf32 keeps fp32 storage but runs
# GEMMs on tensor cores, bf16 also halves the activation bytes
ACT_BYTES_SCALE = {"fp32": 1.0, "tf32": 1.0, "bf16": 0.5}


@dataclass(frozen=True)
class DenseOp:
    flops: float  # forward FLOPs per sample
    params: int  # parameters (fp32)
    act_bytes: float  # activations kept for backward, per sample
    # memory traffic of the forward per sample (bytes); None: its activations plus, for the
    # interaction, reading the pooled embeddings. The backward moves twice as much.
    traffic: float | None = None


@dataclass(frozen=True)
class DenseCost:
    ops: dict[str, DenseOp]  # "bottom_mlp", "interaction", "top_mlp", "loss"
    feature_width: int  # floats per sample entering the interaction from the tables
    top_in: int = 0  # floats per sample entering the top MLP

    @property
    def params(self) -> int:
        return sum(op.params for op in self.ops.values())

    @property
    def act_bytes(self) -> float:
        return sum(op.act_bytes for op in self.ops.values())


def mlp(width_in: int, layers: tuple[int, ...] | list[int]) -> DenseOp:
    flops, params, acts, w = 0.0, 0, 0.0, width_in
    for out in layers:
        flops += 2.0 * w * out
        params += w * out + out
        acts += 4.0 * out * 2  # pre- and post-activation
        w = out
    return DenseOp(flops, params, acts)


def dense_cost(model: ModelSpec) -> DenseCost:
    """Per-sample cost of the dense layers of `model`, by architecture."""
    pooled = [t for t in model.tables if t.pooling != "none"]
    seq = [t for t in model.tables if t.pooling == "none"]
    emb_width = sum(t.dim for t in pooled) + sum(t.dim for t in seq)
    bottom = mlp(model.num_dense, model.bottom_mlp) if model.bottom_mlp else DenseOp(0.0, 0, 0.0)
    arch = model.arch
    if arch == "dlrm":
        d = model.tables[0].dim
        if not model.bottom_mlp:  # as the executor builds it: the dense features projected to dim d
            bottom = mlp(model.num_dense, [d])
        f = len(model.tables) + 1
        if model.interaction == "dot":
            top_in = dot_interaction_width(model)
            # as the executor runs it: stack the F x D features (read + write), bmm (read
            # F x D, write F x F), gather the lower triangle (read F x F, write F(F-1)/2),
            # concatenate with the bottom output (read + write the top input); a small bmm
            # is memory-bound, which FLOPs alone underestimate 6-13x (calibration)
            traffic = 4.0 * (2 * f * d + f * d + f * f + f * f + f * (f - 1) / 2 + 2 * top_in)
            inter = DenseOp(2.0 * f * f * d, 0, 4.0 * f * f, traffic)
        else:  # concatenation
            inter = DenseOp(0.0, 0, 0.0)
            top_in = emb_width + (model.bottom_mlp[-1] if model.bottom_mlp else model.num_dense)
    elif arch == "deepfm":
        f = len(model.tables)
        d = model.tables[0].dim
        # FM: (sum v)^2 - sum v^2, plus the linear term on the dense features
        lin = model.num_dense + 1 if model.num_dense else 0
        inter = DenseOp(4.0 * f * d + 2.0 * model.num_dense, lin, 4.0 * d)
        top_in = emb_width + model.num_dense
    elif arch == "dcn":
        width = emb_width + (model.bottom_mlp[-1] if model.bottom_mlp else model.num_dense)
        layers = model.cross_layers
        rank = model.cross_rank
        if rank:  # low-rank DCNv2: W = U V, width -> rank -> width per layer
            inter = DenseOp(layers * (4.0 * width * rank + 3.0 * width), layers * (2 * width * rank + width),
                            layers * 4.0 * (width * 2 + rank))
        else:
            inter = DenseOp(layers * (2.0 * width * width + 3.0 * width), layers * (width * width + width),
                            layers * 4.0 * width)
        top_in = width
    elif arch == "wide_deep":
        wide = set(model.wide_tables)
        deep_width = sum(t.dim for t in model.tables if t.name not in wide)
        lin = model.num_dense + 1 if model.num_dense else 0  # the wide part's linear term on the dense features
        inter = DenseOp(float(sum(t.dim for t in model.tables if t.name in wide)) + 2.0 * model.num_dense, lin, 4.0)
        top_in = deep_width + model.num_dense
    elif arch == "din":
        att = model.attention_mlp + [1]
        flops, params, acts = 0.0, 0, 0.0
        for t in seq:
            unit = mlp(4 * t.dim, att)  # [query, item, query-item, query*item] per item
            items = min(t.pooling_factor, t.max_len)
            flops += unit.flops * items
            params += unit.params
            acts += unit.act_bytes * items
        inter = DenseOp(flops, params, acts)
        top_in = emb_width + model.num_dense
    else:  # validated upstream; keep a sane default
        inter = DenseOp(0.0, 0, 0.0)
        top_in = emb_width + model.num_dense
    top = mlp(top_in, model.top_mlp) if model.top_mlp else DenseOp(0.0, 0, 0.0)
    loss = DenseOp(8.0, 0, 4.0)
    return DenseCost({"bottom_mlp": bottom, "interaction": inter, "top_mlp": top, "loss": loss}, emb_width, top_in)


def dot_interaction_width(model: ModelSpec) -> int:
    """Floats per sample DLRM's dot interaction hands its top MLP (executor.dense.model builds
    that layer from it): the bottom output (the table dim d) and the F(F-1)/2 pairwise dot
    products of its F = tables + 1 features."""
    f = len(model.tables) + 1
    return model.tables[0].dim + f * (f - 1) // 2


# Tensor-core GEMMs (cuBLAS's TF32 and bf16 kernels) need each operand's leading dimension 16-byte
# aligned, else cuBLAS falls back to fp32 SIMT kernels. 8 elements is 16 bytes of bf16 and 32 of
# fp32, one k-step of TF32's MMA (m16n8k8): both aligned, with no masked tail step under TF32.
TENSOR_CORE_ELEMENTS = 8


def gemm_width(width: int, dtype: DenseDtype | str) -> int:
    """The width a GEMM operand of `width` logical columns is laid out at for the dense dtype
    `dtype`: a multiple of TENSOR_CORE_ELEMENTS where the GEMM runs on tensor cores (tf32,
    bf16), the width itself for fp32 (no tensor cores to reach; padding would only add work).
    The planner costs the logical width; the padding columns hold zeros."""
    if DenseDtype.from_str(dtype, "dense_dtype") == DenseDtype.FP32:
        return width
    return -(-width // TENSOR_CORE_ELEMENTS) * TENSOR_CORE_ELEMENTS


def mlp_shapes(model: ModelSpec) -> tuple[tuple[int, int], ...]:
    """(in, out) of every linear layer of the bottom and top MLPs: the GEMMs calibration times."""
    shapes, w = [], model.num_dense
    for out in model.bottom_mlp:
        shapes.append((w, out))
        w = out
    w = dense_cost(model).top_in
    for out in model.top_mlp:
        shapes.append((w, out))
        w = out
    return tuple(shapes)


def default_dense_dtype(hw: HardwareSpec) -> DenseDtype:
    """The dense precision a plan gets when nobody asks: tf32 on a GPU with a TF32 rate (as
    NVIDIA's DLRM trains: tensor-core GEMMs, fp32 storage and optimizer), fp32 elsewhere (CPUs,
    calibrated CPU workers, GPUs without tensor cores)."""
    return DenseDtype.TF32 if hw.kind == "gpu" and DenseDtype.TF32 in hw.gpu.flops else DenseDtype.FP32


def with_dense_dtype(model: ModelSpec, hw: HardwareSpec, asked: str | None = None) -> ModelSpec:
    """`model` with its dense_dtype set, so the plan records what the executor runs: `asked`
    (--dense-dtype) first, then the model's own, then the hardware's default."""
    want = asked or model.dense_dtype or default_dense_dtype(hw)
    if model.dense_dtype != want:
        model = replace(model, dense_dtype=want)
    _ = model.dense_precision  # a PlanError unless it names a DenseDtype
    return model


def dense_dtype(model: ModelSpec, hw: HardwareSpec) -> tuple[DenseDtype, str | None]:
    """(dtype the dense ops are costed at, note or None) for `model` on `hw`: the model's
    dense_precision, but fp32 on a preset without a FLOP rate for it (V100 has no tf32 nor
    bf16), and the note says so."""
    want = model.dense_precision
    if want != DenseDtype.FP32 and want not in hw.gpu.flops:
        return DenseDtype.FP32, (f"dense_dtype {want}: hardware {hw.name} has no {want} FLOP rate; "
                                 "dense ops costed at fp32")
    return want, None
