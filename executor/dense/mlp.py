"""The dense MLPs: nn.Sequential stacks of Linear and ReLU whose Linear + ReLU pairs run as one
GEMM with the bias and the activation in its epilogue (`torch._addmm_activation`: cuBLASLt's
RELU_BIAS epilogue on CUDA) instead of a GEMM, a bias pass and an activation pass.

The backward of a fused pair masks the incoming gradient by the saved output once (the ReLU's
backward) and feeds it to the two GEMMs and the bias sum. The modules and their parameters are
nn.Sequential's, so state dicts and checkpoints are the same with or without fusion. Fusion is
on for CUDA tensors; `PICASSO_FUSED_MLP=0` turns it off (A/B), `fusion(Fusion.ON)` forces it
for any device (CPU tests); on CPU the unfused path stays the default (no epilogue to gain).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from enum import Enum

import torch
from torch import nn

FUSED_ENV = "PICASSO_FUSED_MLP"


class Fusion(Enum):
    AUTO = "auto"  # fused on CUDA unless PICASSO_FUSED_MLP=0
    ON = "on"
    OFF = "off"


_mode = Fusion.AUTO


@contextlib.contextmanager
def fusion(mode: Fusion) -> Iterator[None]:
    """Run the MLPs with `mode` while inside (tests, A/B benchmarks)."""
    global _mode
    before, _mode = _mode, mode
    try:
        yield
    finally:
        _mode = before


def fused_for(x: torch.Tensor) -> bool:
    if _mode != Fusion.AUTO:
        return _mode == Fusion.ON
    return x.is_cuda and os.environ.get(FUSED_ENV, "1") != "0"


class LinearReLU(torch.autograd.Function):
    """relu(x W^T + b) as one GEMM with the bias and ReLU epilogue, at the autocast dtype when
    autocast is on (as addmm would run under it)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        dt = x.dtype
        if torch.is_autocast_enabled(x.device.type):
            dt = torch.get_autocast_dtype(x.device.type)
        x, w, b = x.to(dt), weight.to(dt), bias.to(dt)
        with torch.autocast(x.device.type, enabled=False):
            y = torch._addmm_activation(b, x, w.t())
        ctx.save_for_backward(x, w, y)
        ctx.dtypes = (weight.dtype, bias.dtype)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, w, y = ctx.saved_tensors
        gz = torch.ops.aten.threshold_backward(grad.to(y.dtype), y, 0)
        dx = gz @ w if ctx.needs_input_grad[0] else None
        dw = (gz.t() @ x).to(ctx.dtypes[0]) if ctx.needs_input_grad[1] else None
        db = gz.sum(0).to(ctx.dtypes[1]) if ctx.needs_input_grad[2] else None
        return dx, dw, db


class MLP(nn.Sequential):
    """nn.Sequential of Linear and ReLU layers whose Linear + ReLU pairs run fused where
    `fused_for` says so."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not fused_for(x):
            return super().forward(x)
        mods = list(self)
        i = 0
        while i < len(mods):
            m = mods[i]
            pair = isinstance(m, nn.Linear) and m.bias is not None and i + 1 < len(mods) \
                and isinstance(mods[i + 1], nn.ReLU)
            if pair:
                x = LinearReLU.apply(x, m.weight, m.bias)
                i += 2
            else:
                x = m(x)
                i += 1
        return x
