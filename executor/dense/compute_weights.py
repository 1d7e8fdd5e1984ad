"""16-bit dense weights kept in the compute dtype, updated from their fp32 masters.

Under bf16 autocast every GEMM casts its fp32 weight and bias to bf16 (a copy kernel each, every
step) and the backward casts each bf16 gradient back (another). With `ComputeWeights` the
model's fp32 parameters stay the masters (the optimizer, the gradient all-reduce and checkpoints
see only them), while the forward runs on bf16 copies of them (`torch.nn.utils.stateless`
swaps them in for the call), so autocast finds its operands already in bf16. After the
backward the bf16 gradients go to the masters in one multi-tensor copy, and after the update
the masters go to the bf16 copies in another: two launches a step instead of two per tensor,
with the same numbers (the same round-to-nearest of each master, the same bf16 gradients).

Used where the dense layers run at bf16 on CUDA, with one micro-batch and no gradient buckets
launched during the backward (both read the gradients before the step is over);
`PICASSO_BF16_WEIGHTS=0` keeps autocast's casts (A/B).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
from torch import nn

from planner.modes import DenseDtype

ENV = "PICASSO_BF16_WEIGHTS"


def wanted(device: torch.device, used_dtype: DenseDtype, micro_batches: int, early_buckets: bool) -> bool:
    """Whether a run keeps bf16 weight copies (see the module doc)."""
    return (device.type == "cuda" and used_dtype == DenseDtype.BF16 and micro_batches == 1 and not early_buckets
            and os.environ.get(ENV, "1") != "0")


class ComputeWeights:
    def __init__(self, module: nn.Module, dtype: torch.dtype = torch.bfloat16) -> None:
        self.module = module
        self.names = [n for n, p in module.named_parameters() if p.dtype.is_floating_point]
        self.masters = [p for n, p in module.named_parameters() if p.dtype.is_floating_point]
        self.copies = [p.detach().to(dtype).requires_grad_(p.requires_grad) for p in self.masters]
        self._by_name = dict(zip(self.names, self.copies))
        # a checkpoint loaded into the masters refreshes the copies
        module.register_load_state_dict_post_hook(lambda *_: self.refresh())

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """The module's forward runs on the 16-bit copies while inside."""
        with torch.nn.utils.stateless._reparametrize_module(self.module, self._by_name):
            yield

    @torch.no_grad()
    def grads_to_masters(self) -> None:
        """The copies' gradients (summed by this step's backward) into the masters' gradients,
        the copies' zeroed for the next step; a weight the step did not reach gets zeros."""
        have = [(c.grad, m) for c, m in zip(self.copies, self.masters) if c.grad is not None]
        for m in self.masters:
            if m.grad is None:
                m.grad = torch.zeros_like(m)
        if have:
            torch._foreach_copy_([m.grad for _, m in have], [g for g, _ in have])
            torch._foreach_zero_([g for g, _ in have])
        missing = [m.grad for c, m in zip(self.copies, self.masters) if c.grad is None]
        if missing:
            torch._foreach_zero_(missing)

    @torch.no_grad()
    def refresh(self) -> None:
        """The masters (just updated, or loaded) into the 16-bit copies, rounded to nearest."""
        torch._foreach_copy_(self.copies, [m.detach() for m in self.masters])
