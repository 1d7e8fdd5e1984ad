"""The embedding step's kernels with fixed output shapes: nothing here reads a size back.

On a GPU, an op whose output size depends on the data (`torch.unique`, `nonzero`, boolean
masks, `bincount`, `.item()`) makes the host wait for the device, so the step can no longer
be queued ahead of the kernels. These versions keep every shape a function of the input
shapes: deduplicated IDs are padded to the input length with the number of valid entries
kept on the device, routing returns a permutation and per-owner counts on the device, and
updates sum duplicate rows through a sort instead of a unique. The trainer reads all counts
of a step in one transfer (`Trainer._exchange_sizes`), the only host synchronisation.

Where the native CPU library is live and the tensors are on the CPU, the same contracts
are served by it (a CPU has nothing to synchronise, and the native kernels are faster);
`executor.sparse.kernels.use_reference()` forces the torch versions everywhere, which is what the
sync-budget test runs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from executor.sparse import kernels


class Dedup(NamedTuple):
    """Unique IDs of a batch. `uniq[:n]` are valid (n = `n_valid`, a 0-dim device tensor, or
    all of `uniq` when `n_valid` is None); `uniq[inverse]` gives back the IDs."""

    uniq: torch.Tensor
    inverse: torch.Tensor
    n_valid: torch.Tensor | None


class Route(NamedTuple):
    """Positions of the unique IDs in send order: cold ones grouped by owner (owner index
    ascending, stable), then hot ones, then padding. `value[i]` is the owner's local row of
    a cold position and the hot slot of a hot one. `counts` [num_owners + 1] (device): cold
    IDs per owner, then hot IDs."""

    order: torch.Tensor
    value: torch.Tensor
    counts: torch.Tensor


def _native(t: torch.Tensor) -> bool:
    """The native CPU kernels serve this call (the library is live and the data is on the CPU)."""
    kernels.load_native(warn=False)
    return t.device.type == "cpu" and kernels.bag_forward is kernels.bag_forward_native


# ---- dedup ----------------------------------------------------------------------------------


def dedup_fixed(ids: torch.Tensor) -> Dedup:
    """Sort-based unique padded to len(ids) (padding holds 0, never read)."""
    n = ids.numel()
    if n == 0:
        return Dedup(ids, ids.clone(), torch.zeros((), dtype=torch.int64, device=ids.device))
    srt, perm = torch.sort(ids)
    head = torch.ones(n, dtype=torch.bool, device=ids.device)
    head[1:] = srt[1:] != srt[:-1]
    seg = torch.cumsum(head, 0) - 1
    inverse = torch.empty_like(seg).scatter_(0, perm, seg)
    uniq = torch.zeros_like(ids).scatter_(0, seg, srt)
    return Dedup(uniq, inverse, seg[-1] + 1)


def dedup(ids: torch.Tensor) -> Dedup:
    if _native(ids):
        uniq, inverse, _ = kernels.unique(ids)
        return Dedup(uniq, inverse, None)
    return dedup_fixed(ids)


# ---- route ----------------------------------------------------------------------------------


def route_fixed(uniq: torch.Tensor, n_valid: torch.Tensor | None, hot_map: torch.Tensor | None,
                num_owners: int) -> Route:
    """Cold rows are owned cyclically (owner = row % num_owners, local row = row // num_owners)."""
    n = uniq.numel()
    owner = uniq % num_owners
    value = uniq // num_owners
    key = owner
    if hot_map is not None:
        slot = hot_map[uniq].to(torch.int64)
        hot = slot >= 0
        key = torch.where(hot, num_owners, owner)
        value = torch.where(hot, slot, value)
    if n_valid is not None:
        key = torch.where(torch.arange(n, device=uniq.device) < n_valid, key, num_owners + 1)
    order = torch.sort(key, stable=True).indices
    counts = torch.zeros(num_owners + 2, dtype=torch.int64, device=uniq.device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    return Route(order, value[order], counts[: num_owners + 1])


def route(uniq: torch.Tensor, n_valid: torch.Tensor | None, hot_map: torch.Tensor | None, num_owners: int) -> Route:
    if n_valid is None and _native(uniq):
        r = kernels.route_ids(uniq, hot_map, num_owners)
        hot = torch.tensor([len(r.hot_pos)], dtype=torch.int64)
        return Route(torch.cat([r.cold_pos, r.hot_pos]), torch.cat([r.cold_local, r.hot_slot]),
                     torch.cat([r.counts.to(torch.int64), hot]))
    return route_fixed(uniq, n_valid, hot_map, num_owners)


# ---- pooling --------------------------------------------------------------------------------


def bag_forward(weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, mode: str) -> torch.Tensor:
    """Pooled bags. Off the CPU this is torch's embedding_bag: the native CUDA kernel checks
    its indices with a flag read back per call (a synchronisation); the step's indices
    come from its own dedup and cannot be out of range."""
    if _native(weight):
        return kernels.bag_forward(weight, indices, offsets, mode)
    return kernels.bag_forward_ref(weight, indices, offsets, mode)


# ---- backward -------------------------------------------------------------------------------


def bag_grad_rows_fixed(grad_out: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor, mode: str,
                        num_rows: int) -> torch.Tensor:
    """Gradient of every row of a [num_rows, D] table from the bags' output gradient."""
    lengths = offsets[1:] - offsets[:-1]
    bags = torch.arange(len(lengths), device=grad_out.device)
    bag_of = torch.repeat_interleave(bags, lengths, output_size=inverse.numel())
    g = grad_out[bag_of]
    if mode == "mean":
        g = g / lengths.clamp(min=1)[bag_of].unsqueeze(1).to(g.dtype)
    out = torch.zeros(num_rows, grad_out.shape[1], dtype=grad_out.dtype, device=grad_out.device)
    return out.index_add_(0, inverse, g)


def bag_grad_rows(grad_out: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor, mode: str,
                  num_rows: int) -> torch.Tensor:
    if _native(grad_out):
        rows, g = kernels.bag_backward(grad_out, inverse, offsets, mode)
        if len(rows) == num_rows:  # sorted unique rows of [0, num_rows), all of them: arange
            return g
        out = torch.zeros(num_rows, grad_out.shape[1], dtype=grad_out.dtype)
        out[rows] = g
        return out
    return bag_grad_rows_fixed(grad_out, inverse, offsets, mode, num_rows)


# ---- updates --------------------------------------------------------------------------------


def segment_sum_fixed(rows: torch.Tensor, grads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Duplicate rows summed: (rows padded, summed gradients, valid mask), all of len(rows)."""
    d = dedup_fixed(rows)
    acc = torch.zeros(len(rows), grads.shape[1], dtype=grads.dtype, device=grads.device)
    acc.index_add_(0, d.inverse, grads)
    valid = torch.arange(len(rows), device=rows.device) < d.n_valid
    return d.uniq, acc, valid


def adagrad_step(acc: torch.Tensor, state_rows: torch.Tensor, eps: float) -> torch.Tensor:
    """Row-wise Adagrad's step g / (sqrt(s) + eps); 0 where the denominator is 0 (no gradient)."""
    denom = (state_rows.sqrt() + eps).unsqueeze(1)
    return torch.where(denom > 0, acc / denom, torch.zeros_like(acc))


def sparse_update_fixed(weight: torch.Tensor, state: torch.Tensor | None, rows: torch.Tensor, grads: torch.Tensor,
                        optimizer: str, lr: float, eps: float) -> None:
    """kernels.sparse_update's contract (duplicates summed first) without reading a size back."""
    if rows.numel() == 0:
        return
    if optimizer == "sgd":
        weight.index_add_(0, rows, grads.to(weight.dtype), alpha=-lr)
        return
    if optimizer != "rowwise_adagrad":
        raise ValueError(f"unknown sparse optimizer {optimizer!r}")
    if state is None:
        raise ValueError("rowwise_adagrad needs a state tensor")
    uniq, acc, valid = segment_sum_fixed(rows, grads)
    state.index_add_(0, uniq, torch.where(valid, (acc * acc).mean(dim=1), torch.zeros((), dtype=acc.dtype,
                                                                                     device=acc.device)))
    weight.index_add_(0, uniq, adagrad_step(acc, state[uniq], eps), alpha=-lr)


def sparse_update(weight: torch.Tensor, state: torch.Tensor | None, rows: torch.Tensor, grads: torch.Tensor,
                  optimizer: str, lr: float, eps: float) -> None:
    if _native(weight):
        kernels.sparse_update(weight, state, rows, grads, optimizer, lr, eps)
        return
    sparse_update_fixed(weight, state, rows, grads, optimizer, lr, eps)


def sparse_update_indexed(weight: torch.Tensor, state: torch.Tensor | None, rows: torch.Tensor, grads: torch.Tensor,
                          grad_index: torch.Tensor, optimizer: str, lr: float, eps: float) -> None:
    """`sparse_update` with row i's gradient at grads[grad_index[i]]: on the native CPU path
    the shared gradients are read in place (a pooled bag's by each of its lookups)."""
    if _native(weight):
        kernels.sparse_update_indexed(weight, state, rows, grads, grad_index, optimizer, lr, eps)
        return
    sparse_update_fixed(weight, state, rows, grads.index_select(0, grad_index), optimizer, lr, eps)


def dense_rows_update(weight: torch.Tensor, state: torch.Tensor | None, grads: torch.Tensor, optimizer: str,
                      lr: float, eps: float) -> None:
    """Update every row of `weight` by its gradient row. A zero row changes neither weight nor
    state, so this equals a sparse update of the touched rows without finding them."""
    if optimizer == "sgd":
        weight.add_(grads.to(weight.dtype), alpha=-lr)
        return
    if optimizer != "rowwise_adagrad":
        raise ValueError(f"unknown sparse optimizer {optimizer!r}")
    if state is None:
        raise ValueError("rowwise_adagrad needs a state tensor")
    state.add_((grads * grads).mean(dim=1))
    weight.add_(adagrad_step(grads, state, eps), alpha=-lr)
