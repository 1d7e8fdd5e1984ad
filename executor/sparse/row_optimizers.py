"""The per-element sparse optimizers, Adagrad and Adam, on the torch path.

The Triton and C++ update kernels fuse SGD and row-wise Adagrad (one fp32 accumulator per row);
Adagrad keeps one sum per element and Adam two moments per element (`state` holds [m | v]), so
their rows are updated here, with torch ops, wherever the rows live. Both are lazy: a step
updates the rows that have a gradient in it (Adam's moments of an untouched row do not decay),
with Adam's bias correction at the trainer's step count, as TensorFlow's LazyAdam and FBGEMM's
sparse Adam do. The --verify reference runs the same functions.
"""

from __future__ import annotations

import torch

from planner.model_spec import PER_ELEMENT_OPTIMIZERS

TORCH_ONLY = PER_ELEMENT_OPTIMIZERS
ADAM_BETAS = (0.9, 0.999)
# --verify's tolerance with these tables: both divide a step by the gradient's own size, so a
# rounding difference in a near-zero gradient (another summation order) becomes a step
# difference of up to the learning rate; measured up to 1.0e-4 over 3 steps on 2 ranks
VERIFY_TOL = 1e-3


def new_state(optimizer: str, rows: int, dim: int, device: torch.device | str = "cpu") -> torch.Tensor | None:
    """The optimizer state of `rows` rows of `dim` elements (None for SGD)."""
    if optimizer == "rowwise_adagrad":
        return torch.zeros(rows, device=device)
    if optimizer == "adagrad":
        return torch.zeros(rows, dim, device=device)
    if optimizer == "adam":
        return torch.zeros(rows, 2 * dim, device=device)
    return None


def update_rows(weight: torch.Tensor, state: torch.Tensor, rows: torch.Tensor, grads: torch.Tensor, optimizer: str,
                lr: float, eps: float, step: int) -> None:
    """Apply one gradient per row to distinct `rows` (`step`: the trainer's, from 0)."""
    g = grads.float()
    if optimizer == "adagrad":
        s = state.index_select(0, rows) + g * g
        state.index_copy_(0, rows, s)
        weight.index_add_(0, rows, g / (s.sqrt() + eps), alpha=-lr)
        return
    if optimizer != "adam":
        raise ValueError(f"{optimizer!r} is not a per-element optimizer")
    b1, b2 = ADAM_BETAS
    d = weight.shape[1]
    mv = state.index_select(0, rows)
    m = mv[:, :d].mul_(b1).add_(g, alpha=1 - b1)
    v = mv[:, d:].mul_(b2).addcmul_(g, g, value=1 - b2)
    state.index_copy_(0, rows, mv)
    t = step + 1
    m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
    weight.index_add_(0, rows, m_hat / (v_hat.sqrt() + eps), alpha=-lr)


def sparse_update(weight: torch.Tensor, state: torch.Tensor, rows: torch.Tensor, grads: torch.Tensor, optimizer: str,
                  lr: float, eps: float, step: int) -> None:
    """Duplicate rows summed first, then each distinct row updated once."""
    if rows.numel() == 0:
        return
    uniq, inverse = torch.unique(rows, return_inverse=True)
    acc = torch.zeros(len(uniq), grads.shape[1], dtype=torch.float32, device=grads.device)
    acc.index_add_(0, inverse, grads.float())
    update_rows(weight, state, uniq, acc, optimizer, lr, eps, step)


def dense_update(weight: torch.Tensor, state: torch.Tensor, grads: torch.Tensor, optimizer: str, lr: float,
                 eps: float, step: int) -> None:
    """Every row of `weight` by its gradient row; rows whose gradient is zero are untouched (lazy)."""
    rows = (grads != 0).any(dim=1).nonzero().flatten()
    update_rows(weight, state, rows, grads.index_select(0, rows), optimizer, lr, eps, step)
