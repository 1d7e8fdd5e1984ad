"""The embedding hot path as functions with a pure-PyTorch reference implementation.

csrc/ provides native versions of the same functions (same signatures, same results);
`executor.kernels` dispatches to them when they are loaded. Conventions: `indices` are
rows of the (packed, local) `weight`; `offsets` has B+1 entries (CSR), so bag b is
`indices[offsets[b]:offsets[b+1]]`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


def bag_forward_ref(
    weight: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    mode: str = "sum",
    per_sample_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pooled embeddings [B, D] of each bag (sum or mean; empty bags give zeros)."""
    return F.embedding_bag(
        indices, weight, offsets, mode=mode, per_sample_weights=per_sample_weights, include_last_offset=True
    )


def bag_backward_ref(
    grad_out: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    mode: str = "sum",
    per_sample_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse gradient of `bag_forward`: (unique rows sorted ascending, grad per row [U, D])."""
    lengths = offsets[1:] - offsets[:-1]
    bag_of = torch.repeat_interleave(torch.arange(len(lengths), device=indices.device), lengths)
    g = grad_out[bag_of]
    if mode == "mean":
        g = g / lengths.clamp(min=1)[bag_of].unsqueeze(1).to(g.dtype)
    if per_sample_weights is not None:
        g = g * per_sample_weights.unsqueeze(1)
    rows, inverse = torch.unique(indices, sorted=True, return_inverse=True)
    out = torch.zeros(len(rows), grad_out.shape[1], dtype=grad_out.dtype, device=grad_out.device)
    out.index_add_(0, inverse, g)
    return rows, out


class Routing(NamedTuple):
    """Where each ID of a batch goes: hot slots read locally, cold rows sent to owners."""

    hot_pos: torch.Tensor  # positions (into ids) of hot IDs
    hot_slot: torch.Tensor  # their slots in the replicated hot cache
    cold_pos: torch.Tensor  # positions of cold IDs, grouped by owner (stable within an owner)
    cold_local: torch.Tensor  # local row at the owner, same order as cold_pos
    counts: torch.Tensor  # number of cold IDs per owner [num_owners]


def route_ids_ref(ids: torch.Tensor, hot_map: torch.Tensor | None, num_owners: int) -> Routing:
    """Split packed rows into hot and cold; cold rows owned cyclically (owner = row % n).

    `hot_map[row]` is the hot slot of a packed row or -1 when the row is cold; None means
    no hot rows.
    """
    if hot_map is None:
        slot = torch.full_like(ids, -1)
    else:
        slot = hot_map[ids].to(torch.int64)
    is_hot = slot >= 0
    hot_pos = torch.nonzero(is_hot).flatten()
    cold_pos = torch.nonzero(~is_hot).flatten()
    cold = ids[cold_pos]
    owner = cold % num_owners
    order = torch.sort(owner, stable=True).indices
    cold_pos = cold_pos[order]
    cold_local = (cold // num_owners)[order]
    counts = torch.bincount(owner, minlength=num_owners)
    return Routing(hot_pos, slot[hot_pos], cold_pos, cold_local, counts)


def unique_ref(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(unique sorted, inverse, counts): dedup before sending IDs to their owners."""
    return torch.unique(ids, sorted=True, return_inverse=True, return_counts=True)


def sparse_update_ref(
    weight: torch.Tensor,
    state: torch.Tensor | None,
    rows: torch.Tensor,
    grads: torch.Tensor,
    optimizer: str,
    lr: float,
    eps: float = 1e-8,
) -> None:
    """Apply a sparse gradient in place; duplicate rows are summed first.

    sgd: w -= lr * g. rowwise_adagrad: s += mean(g^2) over the row; w -= lr * g / (sqrt(s) + eps),
    with one accumulator per row (`state` has shape [rows]).
    """
    if len(rows) == 0:
        return
    uniq, inverse = torch.unique(rows, sorted=True, return_inverse=True)
    g = torch.zeros(len(uniq), grads.shape[1], dtype=grads.dtype, device=grads.device)
    g.index_add_(0, inverse, grads)
    if optimizer == "sgd":
        weight.index_add_(0, uniq, g, alpha=-lr)
    elif optimizer == "rowwise_adagrad":
        if state is None:
            raise ValueError("rowwise_adagrad needs a state tensor")
        state.index_add_(0, uniq, (g * g).mean(dim=1))
        step = g / (state[uniq].sqrt() + eps).unsqueeze(1)
        weight.index_add_(0, uniq, step, alpha=-lr)
    else:
        raise ValueError(f"unknown sparse optimizer {optimizer!r}")


# Dispatch targets: csrc swaps in native versions when its library loads.
bag_forward = bag_forward_ref
bag_backward = bag_backward_ref
route_ids = route_ids_ref
unique = unique_ref
sparse_update = sparse_update_ref
