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

On CUDA the pooling, the bag backward, the segment sums and the sparse update run as the Triton
kernels of `executor.sparse.triton_tbe` (no atomics on a row, the optimizer fused with the
sums) when Triton loads; `PICASSO_TRITON=0` keeps the torch versions (A/B benchmarks), and
`PICASSO_TRITON=all` or `triton_on()` routes CPU tensors to them too (the interpreter, in tests).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from types import ModuleType
from typing import NamedTuple

import torch

from executor.sparse import kernels, row_optimizers
from executor.sparse.sorted_runs import sorted_runs

TRITON_ENV = "PICASSO_TRITON"
_tbe: ModuleType | None = None
_dots: ModuleType | None = None  # executor.dense.interaction_triton, loaded and checked with _tbe
_tbe_tried = False
_tbe_reason: str | None = None
_force_triton = False


class Dedup(NamedTuple):
    """Unique IDs of a batch. `uniq[:n]` are valid (n = `n_valid`, a 0-dim device tensor, or
    all of `uniq` when `n_valid` is None); `uniq[inverse]` gives back the IDs. The sort behind
    it, when kept: `perm[k]` is the k-th ID's position in sorted order, `seg[k]` its unique row
    (the backward's segment sums reuse it instead of sorting again)."""

    uniq: torch.Tensor
    inverse: torch.Tensor
    n_valid: torch.Tensor | None
    perm: torch.Tensor | None = None
    seg: torch.Tensor | None = None


class Route(NamedTuple):
    """Positions of the unique IDs in send order: cold ones grouped by owner (owner index
    ascending, stable), then hot ones, then padding. `value[i]` is the owner's local row of
    a cold position and the hot slot of a hot one. `counts` [num_owners + 1] (device): cold
    IDs per owner, then hot IDs."""

    order: torch.Tensor
    value: torch.Tensor
    counts: torch.Tensor


def triton_status() -> str | None:
    """Why the Triton kernels are not live (None when they load)."""
    global _tbe, _dots, _tbe_tried, _tbe_reason
    if not _tbe_tried:
        _tbe_tried = True
        if os.environ.get(TRITON_ENV, "1") == "0":
            _tbe_reason = f"{TRITON_ENV}=0"
        else:
            try:
                from executor.sparse import triton_tbe
                if torch.cuda.is_available():
                    triton_tbe.self_check(torch.device("cuda"))
                _tbe = triton_tbe
                _dots = _interaction_kernels()
            except Exception as e:  # a missing or broken Triton leaves the torch path, never a failed run
                first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
                _tbe_reason = f"triton unavailable: {type(e).__name__}: {first}"
                warnings.warn(f"embedding kernels: {_tbe_reason}; using the torch path", stacklevel=2)
    return _tbe_reason


@contextlib.contextmanager
def triton_on(on: bool = True) -> Iterator[None]:
    """Route tensors on any device to the Triton kernels (CPU: the interpreter) while inside."""
    global _force_triton
    before, _force_triton = _force_triton, on
    try:
        yield
    finally:
        _force_triton = before


def _triton(t: torch.Tensor) -> bool:
    """The Triton kernels serve this call (CUDA tensors; forced, CPU tensors too where Triton
    interprets, which is only on machines without CUDA) and they load."""
    on_cpu = _forced() and os.environ.get("TRITON_INTERPRET") == "1"
    return (t.is_cuda or on_cpu) and triton_status() is None


def _interaction_kernels() -> ModuleType | None:
    """The Triton dot interaction once it passes its self-check on CUDA; one that cannot build
    leaves the interaction on the torch path with one warning, the embedding kernels unaffected."""
    try:
        from executor.dense import interaction_triton
        if torch.cuda.is_available():
            interaction_triton.self_check(torch.device("cuda"))
        return interaction_triton
    except Exception as e:  # a broken kernel: the torch interaction, never a failed run
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        warnings.warn(f"interaction kernels: {type(e).__name__}: {first}; using the torch path", stacklevel=2)
        return None


def triton_interaction(t: torch.Tensor) -> ModuleType | None:
    """The Triton dot interaction (executor.dense.interaction_triton) where the Triton kernels
    serve tensors like `t`, else None."""
    return _dots if _triton(t) else None


def _forced() -> bool:
    return _force_triton or os.environ.get(TRITON_ENV) == "all"


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
    perm, seg, uniq = sorted_runs(ids)
    inverse = torch.empty_like(seg).scatter_(0, perm, seg)
    return Dedup(uniq, inverse, seg[-1] + 1, perm, seg)


def dedup(ids: torch.Tensor) -> Dedup:
    if _native(ids) and not _forced():
        uniq, inverse, _ = kernels.unique(ids)
        return Dedup(uniq, inverse, None)
    return dedup_fixed(ids)


# ---- route ----------------------------------------------------------------------------------


def route_fixed(uniq: torch.Tensor, n_valid: torch.Tensor | None, hot_map: torch.Tensor | None,
                num_owners: int) -> Route:
    """Cold rows are owned cyclically (planner.geometry: owner = row % num_owners, local row =
    row // num_owners)."""
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


def bag_forward(weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, mode: str,
                pad_every: int = 0) -> torch.Tensor:
    """Pooled bags. Off the CPU this is torch's embedding_bag: the native CUDA kernel checks
    its indices with a flag read back per call (a synchronisation); the step's indices
    come from its own dedup and cannot be out of range. `pad_every`: every pad_every-th bag
    is padding that nobody reads (Batch.pad_bags); the Triton kernel skips it (zeros), the
    other paths pool it."""
    if _triton(weight) and mode in ("sum", "mean"):
        return _tbe.pool(weight, indices, offsets, mode, pad_every)
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
                  num_rows: int, d: Dedup | None = None) -> torch.Tensor:
    """`d`: the dedup `inverse` came from; with its sort kept, the Triton path sums without atomics."""
    if d is not None and d.perm is not None and _triton(grad_out):
        return _tbe.bag_grad_rows(grad_out, d.perm, d.seg, offsets, mode, num_rows)
    if _native(grad_out):
        rows, g = kernels.bag_backward(grad_out, inverse, offsets, mode)
        if len(rows) == num_rows:  # sorted unique rows of [0, num_rows), all of them: arange
            return g
        out = torch.zeros(num_rows, grad_out.shape[1], dtype=grad_out.dtype)
        out[rows] = g
        return out
    return bag_grad_rows_fixed(grad_out, inverse, offsets, mode, num_rows)


# ---- updates --------------------------------------------------------------------------------


def segment_sum(rows: torch.Tensor, grads: torch.Tensor) -> tuple[Dedup, torch.Tensor]:
    """Duplicate rows summed in fp32: the rows' dedup (unique rows padded to len(rows), the
    unique index of each row, the count on the device) and the sums [len(rows), D]."""
    d = dedup_fixed(rows)
    if _triton(grads):
        return d, _tbe.segment_sums(grads, d.perm, d.seg)
    acc = torch.zeros(len(rows), grads.shape[1], dtype=torch.float32, device=grads.device)
    return d, acc.index_add_(0, d.inverse, grads.float())


def segment_sum_fixed(rows: torch.Tensor, grads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Duplicate rows summed: (rows padded, summed gradients, valid mask), all of len(rows)."""
    d, acc = segment_sum(rows, grads)
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
                  optimizer: str, lr: float, eps: float, step: int = 0) -> None:
    if optimizer in row_optimizers.TORCH_ONLY:  # no kernel fuses them: the torch path
        row_optimizers.sparse_update(weight, state, rows, grads, optimizer, lr, eps, step)
        return
    if _triton(weight) and weight.dtype == torch.float32:
        _tbe.sparse_update(weight, state, rows, grads, optimizer, lr, eps)
        return
    if _native(weight):
        kernels.sparse_update(weight, state, rows, grads, optimizer, lr, eps)
        return
    sparse_update_fixed(weight, state, rows, grads, optimizer, lr, eps)


def sparse_update_indexed(weight: torch.Tensor, state: torch.Tensor | None, rows: torch.Tensor, grads: torch.Tensor,
                          grad_index: torch.Tensor, optimizer: str, lr: float, eps: float, step: int = 0) -> None:
    """`sparse_update` with row i's gradient at grads[grad_index[i]]: on the native CPU path
    the shared gradients are read in place (a pooled bag's by each of its lookups)."""
    if optimizer in row_optimizers.TORCH_ONLY:
        row_optimizers.sparse_update(weight, state, rows, grads.index_select(0, grad_index), optimizer, lr, eps, step)
        return
    if _triton(weight) and weight.dtype == torch.float32:
        _tbe.sparse_update(weight, state, rows, grads, optimizer, lr, eps, grad_index)
        return
    if _native(weight) and not _forced():
        kernels.sparse_update_indexed(weight, state, rows, grads, grad_index, optimizer, lr, eps)
        return
    sparse_update_fixed(weight, state, rows, grads.index_select(0, grad_index), optimizer, lr, eps)


def dense_rows_update(weight: torch.Tensor, state: torch.Tensor | None, grads: torch.Tensor, optimizer: str,
                      lr: float, eps: float, step: int = 0) -> None:
    """Update every row of `weight` by its gradient row. A zero row changes neither weight nor
    state, so this equals a sparse update of the touched rows without finding them."""
    if optimizer in row_optimizers.TORCH_ONLY:  # Adam's moments would move a zero row: the touched ones only
        row_optimizers.dense_update(weight, state, grads, optimizer, lr, eps, step)
        return
    if optimizer == "sgd":
        weight.add_(grads.to(weight.dtype), alpha=-lr)
        return
    if optimizer != "rowwise_adagrad":
        raise ValueError(f"unknown sparse optimizer {optimizer!r}")
    if state is None:
        raise ValueError("rowwise_adagrad needs a state tensor")
    state.add_((grads * grads).mean(dim=1))
    weight.add_(adagrad_step(grads, state, eps), alpha=-lr)


def add_unique_rows(dst: torch.Tensor, idx: torch.Tensor, src: torch.Tensor) -> None:
    """dst[idx[i]] += src[i] where idx[i] >= 0; the non-negative entries are distinct (hot slots
    of unique rows), so neither path needs atomics on a row or a mask read back."""
    if _triton(dst):
        _tbe.add_rows(dst, idx, src)
        return
    hot = (idx >= 0).unsqueeze(1)
    dst.index_add_(0, idx.clamp(min=0), torch.where(hot, src, 0.0))


def fuses_update(weight: torch.Tensor, low: bool = False) -> bool:
    """The backward's segment sums can apply the optimizer to `weight` directly: fp32 rows
    (`bag_update`), or with `low` 16-bit ones too (`update_low_rows`)."""
    ok = weight.dtype == torch.float32 or (low and weight.dtype in (torch.float16, torch.bfloat16))
    return ok and _triton(weight)


def update_low_rows(weight: torch.Tensor, state: torch.Tensor | None, rows: torch.Tensor, grads: torch.Tensor,
                    keys: torch.Tensor, optimizer: str, lr: float, eps: float, step: int, seed: int,
                    col0: int = 0) -> None:
    """lowp.update_rows as one Triton pass (where `fuses_update(weight, low=True)`)."""
    _tbe.sparse_update(weight, state, rows, grads, optimizer, lr, eps, keys=keys, step=step, seed=seed, col0=col0)


def bag_update(grad_out: torch.Tensor, d: Dedup, offsets: torch.Tensor, mode: str, weight: torch.Tensor,
               state: torch.Tensor | None, optimizer: str, lr: float, eps: float) -> None:
    """The pooled lookup's backward fused with its rows' update (where `fuses_update`): the
    unique rows `d.uniq` of `weight` take their bags' summed gradients in one pass."""
    _tbe.bag_update(grad_out, d.perm, d.seg, offsets, mode, d.uniq, weight, state, optimizer, lr, eps)
