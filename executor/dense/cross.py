"""DCN-v2's cross layer x' = x0 * (W h + b) + x (h = x, or V x for a low-rank W = U V) with its
elementwise work folded into the GEMMs' neighbours.

Forward: one GEMM for u = W h + b, then x' in one addcmul (not a multiply and an add). Backward:
gu = g * x0 once; with a full-rank W at fp32/tf32 the residual's gradient rides in the data
GEMM (dx = g + gu W as one addmm, not a GEMM and an add); dW = gu^T h and db = sum(gu) as usual;
dx0 = g * u. Under autocast the GEMMs run at its dtype as nn.Linear's would, the rest at the
inputs' dtype. `executor.dense.mlp.fused_for` decides where it runs (CUDA by default).
"""

from __future__ import annotations

import torch
from torch import nn

from executor.dense.mlp import fused_for


class CrossLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x0: torch.Tensor, x: torch.Tensor, h: torch.Tensor | None, weight: torch.Tensor,
                bias: torch.Tensor) -> torch.Tensor:
        gemm_in = x if h is None else h
        dt = gemm_in.dtype
        if torch.is_autocast_enabled(x.device.type):
            dt = torch.get_autocast_dtype(x.device.type)
        with torch.autocast(x.device.type, enabled=False):
            hc, w = gemm_in.to(dt), weight.to(dt)
            u = torch.addmm(bias.to(dt), hc, w.t())
            y = torch.addcmul(x, x0, u)
        ctx.save_for_backward(x0, hc, w, u)
        ctx.full_rank = h is None
        ctx.dtypes = (x0.dtype, gemm_in.dtype, weight.dtype, bias.dtype)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g: torch.Tensor):
        x0, hc, w, u = ctx.saved_tensors
        x0_dt, h_dt, w_dt, b_dt = ctx.dtypes
        with torch.autocast(g.device.type, enabled=False):
            gu = (g * x0).to(u.dtype)
            dx0 = (g * u).to(x0_dt)
            dw = (gu.t() @ hc).to(w_dt)
            db = gu.sum(0).to(b_dt)
            if ctx.full_rank and u.dtype == g.dtype:  # the residual's gradient added by the GEMM itself
                return dx0, torch.addmm(g, gu, w), None, dw, db
            if ctx.full_rank:  # 16-bit GEMM: the residual stays at its own precision
                return dx0, g + (gu @ w).to(g.dtype), None, dw, db
            dh = (gu @ w).to(h_dt)
            return dx0, g, dh, dw, db


def cross(x0: torch.Tensor, x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    """One cross layer of DCN (model.DCN's `layer`: a Linear, or Sequential(V without bias, U))."""
    if not fused_for(x):
        return x0 * layer(x) + x
    if isinstance(layer, nn.Linear):
        return CrossLayer.apply(x0, x, None, layer.weight, layer.bias)
    v, u = layer[0], layer[1]
    return CrossLayer.apply(x0, x, v(x), u.weight, u.bias)
