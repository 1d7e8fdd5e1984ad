"""DLRM's dot interaction: [x0 | x_i . x_j for i > j] of f inputs [n, d], and its gradient.

Two implementations of the same function (exact to fp32 rounding):
- `dot_interaction_ref`: bmm(t, t^T) over the stacked inputs, the lower triangle picked out;
  its backward (`LowerTriangleDots`) gathers the pairs' gradients into the symmetric matrix;
- `dot_interaction_on(lib, ...)`: csrc's kernel with a block of samples in the SIMD lanes, which
  computes only the f(f-1)/2 pairs and writes the output (first input included) in one pass.
  On CPU, bmm of n tiny [f, d] matrices runs far below the GEMM rate: at d 64, batch 2048, the
  native forward + backward took 14 ms against bmm's 24 ms on one core of this machine.
`executor.sparse.kernels` dispatches between them with the other native kernels (PICASSO_NATIVE=0,
use_reference()); the native path takes CPU fp32 inputs and leaves the rest to the reference.
"""

from __future__ import annotations

from typing import Any

import torch


class LowerTriangleDots(torch.autograd.Function):
    """Pairwise dot products t_i . t_j (i > j) of the rows of t [n, f, d], flattened [n, f(f-1)/2].

    The generic backward of picking the triangle out of bmm(t, t^T) scatters with
    accumulation, which dominated DLRM's dense step on CPU. Here the gradient is S t, with S
    the symmetric [f, f] matrix holding each pair's gradient at (i, j) and (j, i) and zeros on
    the diagonal, gathered in one index_select from the pairs' gradients (no zero fill, no
    scatter). `sym` maps each of the f*f entries to its pair + 1, the diagonal to 0."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, tri: torch.Tensor, sym: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(t, sym)
        z = torch.bmm(t, t.transpose(1, 2))
        return z.flatten(1).index_select(1, tri)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        t, sym = ctx.saved_tensors
        n, f, _ = t.shape
        src = torch.cat([torch.zeros(n, 1, dtype=t.dtype, device=t.device), grad.to(t.dtype)], dim=1)
        s = src.index_select(1, sym).view(n, f, f)
        return torch.bmm(s, t), None, None


def triangle_maps(f: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tri, sym) for LowerTriangleDots: the flat positions of the pairs i > j in an f x f
    matrix, and for every flat position its pair + 1 (0 on the diagonal)."""
    li, lj = torch.tril_indices(f, f, offset=-1)
    sym = torch.zeros(f, f, dtype=torch.int64)
    pair = torch.arange(1, len(li) + 1)
    sym[li, lj] = pair
    sym[lj, li] = pair
    return li * f + lj, sym.flatten()


_MAPS: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}


def _maps(f: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    key = (f, str(device))
    if key not in _MAPS:
        _MAPS[key] = tuple(m.to(device) for m in triangle_maps(f))  # type: ignore[assignment]
    return _MAPS[key]


def dot_interaction_ref(xs: list[torch.Tensor]) -> torch.Tensor:
    """[n, d + f(f-1)/2]: xs[0], then x_i . x_j for i > j in row-major lower-triangle order."""
    dev = xs[0].device
    tri, sym = _maps(len(xs), dev)
    t = torch.stack(xs, dim=1)
    if torch.is_autocast_enabled(dev.type):
        # autocast reaches the forward's bmm but not a custom Function's backward: cast the
        # stacked features to the autocast dtype here, so the backward's bmm runs at it too
        # (tensor cores under bf16) and only the cast's backward returns to the inputs' dtype
        t = t.to(torch.get_autocast_dtype(dev.type))
    return torch.cat([xs[0], LowerTriangleDots.apply(t, tri, sym)], dim=1)


class _NativeDots(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, lib: Any, *xs: torch.Tensor) -> torch.Tensor:
        ctx.lib = lib
        ctx.save_for_backward(*xs)
        return lib.dot_interaction_forward(list(xs))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        first, rest = ctx.lib.dot_interaction_backward(grad, list(ctx.saved_tensors))
        return (None, first, *rest.unbind(0))


def dot_interaction_on(lib: Any, xs: list[torch.Tensor]) -> torch.Tensor:
    """dot_interaction_ref's function on csrc's kernel (`lib`, the loaded library), in fp32, for
    CPU inputs of fp32 (or a bf16 bottom output under CPU bf16 autocast, which the reference
    would promote to fp32 as well); anything else goes to the reference."""
    x0 = xs[0]
    ok = (torch.float32, torch.bfloat16) if x0.device.type == "cpu" else ()
    if x0.dim() != 2 or any(x.dtype not in ok or x.shape != x0.shape for x in xs):
        return dot_interaction_ref(xs)
    return _NativeDots.apply(lib, *(x.float().contiguous() for x in xs))
