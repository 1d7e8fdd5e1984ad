"""DLRM's dot interaction as two Triton kernels (the function of interaction.dot_interaction_ref).

Forward: each program takes a block of samples, loads their features X [1 + F, D] (the bottom
MLP's output `x0` and the F pooled embeddings, read where the pool wrote them: one strided
[F, B, D] view, no stack), computes Z = X X^T as one batched tensor-core product (features
and dim padded to 16, fp32 accumulation) and stores x0 and the lower triangle of Z straight
into the top MLP's input buffer, in that buffer's dtype: no cat, no cast, no triangle gather.
Backward: dX = S X with S the symmetric matrix of the pairs' gradients (each pair's gradient
at (i, j) and (j, i), twice on the diagonal with self-interaction), gathered from the output
gradient by the kernel itself; dx0 adds the gradient of the copied x0. Each output element is
written by exactly one program, so the result does not depend on the order programs run in
(Triton's interpreter, one program at a time on CPU tensors, stands for the GPU in tests).
"""

from __future__ import annotations

import os
from enum import IntEnum

import torch

if not torch.cuda.is_available():  # the interpreter is the only way Triton runs here
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

TILE_ELEMENTS = 16384  # samples x padded features x padded dim held by one program
MAX_SAMPLES = 16


class Compute(IntEnum):
    """The products' input precision (accumulation is fp32 in all three)."""

    FP32 = 0
    TF32 = 1
    BF16 = 2

    @classmethod
    def current(cls, device: torch.device) -> Compute:
        """What the torch path would run here: the autocast dtype when autocast is on, TF32
        where CUDA matmuls allow it, else fp32."""
        if torch.is_autocast_enabled(device.type):
            dt = torch.get_autocast_dtype(device.type)
            if dt != torch.bfloat16:
                raise ValueError(f"the Triton interaction computes in bf16, tf32 or fp32, not {dt}")
            return cls.BF16
        if device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
            return cls.TF32
        return cls.FP32

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the interaction's output (the top MLP's input)."""
        return torch.bfloat16 if self == Compute.BF16 else torch.float32


def pairs(f: int, self_interaction: bool = False) -> int:
    """Pairs of f features in the lower triangle (diagonal included with self-interaction)."""
    return f * (f + 1) // 2 if self_interaction else f * (f - 1) // 2


@triton.jit
def _features(x0, s_x0, e, s_ef, s_en, rows, rm, nf, dim, BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr):
    """[N, BLOCK_F, BLOCK_D] features of the samples `rows`: x0 in row 0, embedding f in row
    1 + f, zeros in the padding."""
    i = tl.arange(0, BLOCK_F)[None, :, None]
    d = tl.arange(0, BLOCK_D)[None, None, :]
    r = rows[:, None, None]
    ok = rm[:, None, None] & (d < dim)
    a = tl.load(x0 + r * s_x0 + d + i * 0, mask=ok & (i == 0), other=0.0).to(tl.float32)
    a += tl.load(e + (i - 1) * s_ef + r * s_en + d, mask=ok & (i >= 1) & (i <= nf), other=0.0).to(tl.float32)
    return a


@triton.jit
def _pair_column(hi, lo, dim, SELF: tl.constexpr):
    """Column of pair (hi, lo), hi >= lo, in the output: after x0, row-major lower triangle."""
    if SELF:
        return dim + hi * (hi + 1) // 2 + lo
    else:
        return dim + hi * (hi - 1) // 2 + lo


@triton.jit
def _product(a, b, COMPUTE: tl.constexpr, EMULATE_BF16: tl.constexpr):
    if COMPUTE == 2 and EMULATE_BF16:  # the same products: bf16 operands, exact fp32 products and sums
        return tl.dot(a.to(tl.bfloat16).to(tl.float32), b.to(tl.bfloat16).to(tl.float32), input_precision="ieee")
    elif COMPUTE == 2:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    elif COMPUTE == 1:
        return tl.dot(a, b, input_precision="tf32")
    else:
        return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _forward_kernel(x0, s_x0, e, s_ef, s_en, out, s_o, n, nf, dim, width,
                    SELF: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_PAD: tl.constexpr, EMULATE_BF16: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = rows < n
    a = _features(x0, s_x0, e, s_ef, s_en, rows, rm, nf, dim, BLOCK_F, BLOCK_D)
    z = _product(a, tl.trans(a, 0, 2, 1), COMPUTE, EMULATE_BF16)  # [N, F, F], fp32
    hi = tl.arange(0, BLOCK_F)[None, :, None]
    lo = tl.arange(0, BLOCK_F)[None, None, :]
    keep = (hi <= nf) & (lo <= hi) if SELF else (hi <= nf) & (lo < hi)
    r = rows[:, None, None]
    tl.store(out + r * s_o + _pair_column(hi, lo, dim, SELF), z.to(out.dtype.element_ty),
             mask=rm[:, None, None] & keep)
    d = tl.arange(0, BLOCK_D)[None, :]
    r2 = rows[:, None]
    dm = rm[:, None] & (d < dim)
    tl.store(out + r2 * s_o + d, tl.load(x0 + r2 * s_x0 + d, mask=dm, other=0.0).to(out.dtype.element_ty), mask=dm)
    if BLOCK_PAD > 0:  # columns past the pairs (a top MLP input padded to a tile): zeros
        used = dim + (nf + 1) * (nf + 2) // 2 if SELF else dim + (nf + 1) * nf // 2
        p = used + tl.arange(0, BLOCK_PAD)[None, :]
        tl.store(out + r2 * s_o + p, tl.zeros([BLOCK_N, BLOCK_PAD], dtype=out.dtype.element_ty),
                 mask=rm[:, None] & (p < width))


@triton.jit
def _backward_kernel(g, s_g, x0, s_x0, e, s_ef, s_en, dx0, s_dx0, de, s_def, s_den, n, nf, dim,
                     SELF: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr,
                     BLOCK_D: tl.constexpr, EMULATE_BF16: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = rows < n
    a = _features(x0, s_x0, e, s_ef, s_en, rows, rm, nf, dim, BLOCK_F, BLOCK_D)
    i = tl.arange(0, BLOCK_F)[None, :, None]
    j = tl.arange(0, BLOCK_F)[None, None, :]
    hi = tl.maximum(i, j)
    lo = tl.minimum(i, j)
    keep = (hi <= nf) & (lo <= hi) if SELF else (hi <= nf) & (lo < hi)
    r = rows[:, None, None]
    s = tl.load(g + r * s_g + _pair_column(hi, lo, dim, SELF), mask=rm[:, None, None] & keep, other=0.0)
    s = s.to(tl.float32)
    if SELF:  # d(x_i . x_i)/d x_i = 2 x_i
        s = tl.where(i == j, 2.0 * s, s)
    dx = _product(s, a, COMPUTE, EMULATE_BF16)  # [N, F, D], fp32
    d3 = tl.arange(0, BLOCK_D)[None, None, :]
    tl.store(de + (i - 1) * s_def + r * s_den + d3, dx.to(de.dtype.element_ty),
             mask=rm[:, None, None] & (i >= 1) & (i <= nf) & (d3 < dim))
    d = tl.arange(0, BLOCK_D)[None, :]
    r2 = rows[:, None]
    dm = rm[:, None] & (d < dim)
    first = tl.sum(tl.where(i == 0, dx, 0.0), axis=1) + tl.load(g + r2 * s_g + d, mask=dm, other=0.0).to(tl.float32)
    tl.store(dx0 + r2 * s_dx0 + d, first.to(dx0.dtype.element_ty), mask=dm)


def _interpreted() -> bool:
    """Triton 3.6's interpreter multiplies bf16 tiles wrongly (the raw bits): emulate there."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _blocks(nf: int, dim: int) -> tuple[int, int, int]:
    bf = max(16, triton.next_power_of_2(nf + 1))
    bd = max(16, triton.next_power_of_2(dim))
    bn = max(1, min(MAX_SAMPLES, TILE_ELEMENTS // (bf * bd)))
    return bn, bf, bd


def _check(x0: torch.Tensor, e: torch.Tensor) -> None:
    if x0.dim() != 2 or e.dim() != 3 or e.shape[1:] != x0.shape:
        raise ValueError(f"interaction: x0 [B, D] and embeddings [F, B, D] expected, got {tuple(x0.shape)} "
                         f"and {tuple(e.shape)}")
    if x0.stride(1) != 1 or e.stride(2) != 1:
        raise ValueError("interaction: features must be contiguous along D")


def forward_into(x0: torch.Tensor, e: torch.Tensor, out: torch.Tensor, compute: Compute,
                 self_interaction: bool = False) -> torch.Tensor:
    """out[:, :D] = x0, out[:, D:D+P] = the pairs, out[:, D+P:] = 0; `e` [F, B, D] any strides
    with D contiguous; `out` [B, W >= D + P] with rows contiguous, in the dtype it is read in."""
    _check(x0, e)
    nf, (n, dim) = e.shape[0], x0.shape
    used = dim + pairs(nf + 1, self_interaction)
    if out.shape[0] != n or out.shape[1] < used or out.stride(1) != 1:
        raise ValueError(f"interaction: output [{n}, >= {used}] with contiguous rows expected, got {tuple(out.shape)}")
    if n == 0:
        return out
    bn, bf, bd = _blocks(nf, dim)
    extra = out.shape[1] - used
    _forward_kernel[(triton.cdiv(n, bn),)](x0, x0.stride(0), e, e.stride(0), e.stride(1), out, out.stride(0), n, nf,
                                           dim, out.shape[1], SELF=self_interaction, COMPUTE=int(compute),
                                           BLOCK_N=bn, BLOCK_F=bf, BLOCK_D=bd,
                                           BLOCK_PAD=triton.next_power_of_2(extra) if extra else 0,
                                           EMULATE_BF16=_interpreted())
    return out


def backward_into(grad: torch.Tensor, x0: torch.Tensor, e: torch.Tensor, dx0: torch.Tensor, de: torch.Tensor,
                  compute: Compute, self_interaction: bool = False) -> None:
    """dx0 [B, D] and de [F, B, D] (any strides, D contiguous) from the output's gradient."""
    _check(x0, e)
    _check(dx0, de)
    nf, (n, dim) = e.shape[0], x0.shape
    if grad.stride(1) != 1:
        grad = grad.contiguous()
    if n == 0:
        return
    bn, bf, bd = _blocks(nf, dim)
    _backward_kernel[(triton.cdiv(n, bn),)](grad, grad.stride(0), x0, x0.stride(0), e, e.stride(0), e.stride(1),
                                            dx0, dx0.stride(0), de, de.stride(0), de.stride(1), n, nf, dim,
                                            SELF=self_interaction, COMPUTE=int(compute), BLOCK_N=bn, BLOCK_F=bf,
                                            BLOCK_D=bd, EMULATE_BF16=_interpreted())


def strided_stack(xs: list[torch.Tensor]) -> torch.Tensor | None:
    """xs [B, D] each as one [F, B, D] view when they lie at equal distances in one storage
    with the same row stride (the tables of one pooled pack, as the pool wrote them), else None."""
    first = xs[0]
    if any(x.shape != first.shape or x.dtype != first.dtype or x.device != first.device
           or x.stride() != first.stride() or x.stride(-1) != 1 for x in xs):
        return None
    try:
        ptrs = [x.untyped_storage().data_ptr() for x in xs]
    except (RuntimeError, NotImplementedError):
        return None
    if len(set(ptrs)) != 1:
        return None
    offs = [x.storage_offset() for x in xs]
    step = offs[1] - offs[0] if len(xs) > 1 else first.shape[0] * first.stride(0)
    if step < first.shape[0] * first.stride(0) or any(b - a != step for a, b in zip(offs, offs[1:])):
        return None
    return first.as_strided((len(xs), *first.shape), (step, *first.stride()))


class TritonDots(torch.autograd.Function):
    """[x0 | pairs] of x0 and the embeddings, forward and backward on the kernels above. The
    embeddings' gradients are views of one buffer laid out as their inputs were (padding rows
    between tables zeroed), so the trainer hands the pack one gradient without a cat."""

    @staticmethod
    def forward(ctx, compute: Compute, self_interaction: bool, width: int, x0: torch.Tensor,
                *embs: torch.Tensor) -> torch.Tensor:
        e = strided_stack(list(embs))
        if e is None:
            e = torch.stack(embs)
        out = torch.empty(x0.shape[0], width, dtype=compute.dtype, device=x0.device)
        forward_into(x0, e, out, compute, self_interaction)
        ctx.compute, ctx.self_interaction = compute, self_interaction
        ctx.save_for_backward(x0, e)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x0, e = ctx.saved_tensors
        dx0 = torch.empty_like(x0, memory_format=torch.contiguous_format)
        nf, n, dim = e.shape
        step = e.stride(0) if e.stride(1) == dim else n * dim
        flat = torch.empty(nf * step, dtype=e.dtype, device=e.device)
        de = flat.as_strided(e.shape, (step, dim, 1))
        if step > n * dim:  # rows between tables (the pack's padding bags): their gradient is zero
            flat.view(nf, step)[:, n * dim:].zero_()
        backward_into(grad, x0, e, dx0, de, ctx.compute, ctx.self_interaction)
        return (None, None, None, dx0, *de.unbind(0))


def dot_interaction(xs: list[torch.Tensor], self_interaction: bool = False, width: int | None = None) -> torch.Tensor:
    """dot_interaction_ref's function on the Triton kernels: [n, width] in the compute dtype
    (the autocast dtype, else fp32), width D + pairs unless a padded width is asked for."""
    x0 = xs[0]
    compute = Compute.current(x0.device)
    used = x0.shape[1] + pairs(len(xs), self_interaction)
    return TritonDots.apply(compute, self_interaction, width or used, x0, *xs[1:])


def compile_for(arch: int = 90) -> dict[str, str]:
    """Compile both kernels for CUDA compute capability `arch` without a GPU (TRITON_INTERPRET=0):
    variant -> "ok" or the compiler's first error line."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    out = {}
    for dt, comp in (("fp32", Compute.TF32), ("fp32", Compute.FP32), ("bf16", Compute.BF16)):
        for nf, dim in ((26, 128), (5, 16)):
            bn, bf, bd = _blocks(nf, dim)
            common = {"SELF": False, "COMPUTE": int(comp), "BLOCK_N": bn, "BLOCK_F": bf, "BLOCK_D": bd,
                      "EMULATE_BF16": False}
            feats = {"x0": f"*{dt}", "s_x0": "i32", "e": "*fp32", "s_ef": "i32", "s_en": "i32"}
            fwd = {**feats, "out": f"*{dt}", "s_o": "i32", "n": "i32", "nf": "i32", "dim": "i32", "width": "i32",
                   **{k: "constexpr" for k in (*common, "BLOCK_PAD")}}
            bwd = {"g": f"*{dt}", "s_g": "i32", **feats, "dx0": f"*{dt}", "s_dx0": "i32", "de": "*fp32",
                   "s_def": "i32", "s_den": "i32", "n": "i32", "nf": "i32", "dim": "i32",
                   **{k: "constexpr" for k in common}}
            for name, fn, sig, consts in (("forward", _forward_kernel, fwd, {**common, "BLOCK_PAD": 1}),
                                          ("backward", _backward_kernel, bwd, common)):
                sixteen = {(k,): [["tt.divisibility", 16]] for k, (a, ty) in enumerate(sig.items())
                           if ty.startswith("*") or a.startswith("s_")}
                key = f"{name}_{comp.name.lower()}_f{nf}_d{dim}"
                try:
                    triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=sixteen),
                                   target=GPUTarget("cuda", arch, 32))
                    out[key] = "ok"
                except Exception as err:  # the compiler's own error: reported, the caller decides
                    lines = [ln.strip() for ln in str(err).splitlines() if "error" in ln.lower()]
                    out[key] = (lines or [str(err).strip()[:200]])[0][:300]
    return out


def self_check(device: torch.device) -> None:
    """Compile and run both kernels once on `device` against the torch path; raise if they
    fail or differ (a Triton that cannot build them must leave the torch path, not fail a run)."""
    from executor.dense.interaction import dot_interaction_ref

    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(5, 16, generator=g).to(device).requires_grad_() for _ in range(4)]
    got = dot_interaction(xs)
    want = dot_interaction_ref(xs)
    grad = torch.randn(want.shape, generator=g).to(device)
    if not torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2):
        raise RuntimeError("the Triton interaction's forward differs from torch")
    for a, b in zip(torch.autograd.grad(got, xs, grad.to(got.dtype)), torch.autograd.grad(want, xs, grad)):
        if not torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-2):
            raise RuntimeError("the Triton interaction's backward differs from torch")
