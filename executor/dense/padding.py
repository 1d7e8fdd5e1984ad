"""GEMM operands widened to tensor-core alignment, with the logical weights in every state dict.

A Linear layer whose input width breaks cuBLAS's alignment (DLRM's 13 dense features, its
367-wide top-MLP input) runs on fp32 SIMT kernels even under TF32 or bf16. On CUDA the layer
is widened to `planner.dense.gemm_width` inputs: its weight gets zero columns and its input zero
columns (the interaction writes them, the bottom MLP's input is padded once). The gradient of a
padding column is the zero input times the output gradient, exactly zero, so no optimizer
(SGD, Adagrad, Adam: none decays weights) moves it off zero.

Checkpoints, exports and the reference see the logical model: the module's state dict narrows a
widened weight to its logical shape and loading pads it again (old checkpoints load as they
are), and the dense optimizer keeps its state tensors' logical shapes the same way
(`DenseOptimizer(logical_shapes=...)`). CPU runs stay unpadded (oneDNN has no such cliff);
`PICASSO_PAD_GEMM=0` turns widening off on CUDA (A/B).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
from torch import nn

from planner.dense import gemm_width
from planner.modes import DenseDtype

ENV = "PICASSO_PAD_GEMM"


_forced: list[DenseDtype] = []  # innermost `forced` last


@contextlib.contextmanager
def forced(dtype: DenseDtype) -> Iterator[None]:
    """Runs built while inside widen for `dtype` on any device (CPU tests of the CUDA layout)."""
    _forced.append(dtype)
    try:
        yield
    finally:
        _forced.pop()


def run_dtype(device: torch.device, used: DenseDtype) -> DenseDtype | None:
    """The dtype whose alignment a run on `device` whose dense layers run at `used` widens its
    GEMM operands to (see the module doc); None: no widening."""
    if _forced:
        return _forced[-1]
    return used if device.type == "cuda" and os.environ.get(ENV, "1") != "0" else None


def narrow_to(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """`t`'s leading block of `shape`, contiguous (what a checkpoint stores)."""
    if tuple(t.shape) == tuple(shape):
        return t
    return t[tuple(slice(0, s) for s in shape)].contiguous()


def pad_to(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """`t` in the leading block of a zero tensor of `shape` (`t` itself when already that shape,
    or when it does not fit inside: the caller's shape check reports it)."""
    if tuple(t.shape) == tuple(shape) or t.dim() != len(shape) or any(a > b for a, b in zip(t.shape, shape)):
        return t
    out = t.new_zeros(shape)
    out[tuple(slice(0, s) for s in t.shape)] = t
    return out


def widen_inputs(layer: nn.Linear, width: int) -> None:
    """`layer` takes `width` >= in_features inputs; the new weight columns are zeros."""
    k = layer.in_features
    if width <= k:
        return
    w = layer.weight
    layer.weight = nn.Parameter(pad_to(w.detach(), (w.shape[0], width)), requires_grad=w.requires_grad)
    layer.in_features = width


def logical_shapes(module: nn.Module) -> list[tuple[int, ...]] | None:
    """Per parameter of `module` (in parameters() order) its logical shape, where widened; None
    when nothing is."""
    shapes = getattr(module, "_logical_shapes", None)
    if not shapes:
        return None
    return [shapes.get(n, tuple(p.shape)) for n, p in module.named_parameters()]


def pad_module(module: nn.Module, layers: dict[str, int], dtype: DenseDtype | str) -> dict[str, int]:
    """Widen each Linear `module.<name>` of `layers` (name -> logical input width) to its
    gemm_width for `dtype`, once; state dicts keep the logical shapes. Returns name -> width
    of the layers widened."""
    if getattr(module, "_logical_shapes", None):
        raise ValueError("the dense model's GEMM operands are widened already")
    widened: dict[str, int] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for name, k in layers.items():
        layer = module.get_submodule(name)
        width = gemm_width(k, dtype)
        if width > layer.in_features:
            shapes[f"{name}.weight"] = tuple(layer.weight.shape)
            widen_inputs(layer, width)
            widened[name] = width
    if shapes:
        module._logical_shapes = shapes
        module.register_state_dict_post_hook(_narrow_hook)
        module.register_load_state_dict_pre_hook(_pad_hook)
    return widened


def _narrow_hook(module: nn.Module, state: dict, prefix: str, local_metadata: dict) -> None:
    for name, shape in module._logical_shapes.items():
        if prefix + name in state:
            state[prefix + name] = narrow_to(state[prefix + name], shape)


def _pad_hook(module: nn.Module, state: dict, prefix: str, *_: object) -> None:
    own = dict(module.named_parameters())
    for name in module._logical_shapes:
        t = state.get(prefix + name)
        if isinstance(t, torch.Tensor):
            state[prefix + name] = pad_to(t, tuple(own[name].shape))
