"""The embedding hot path as functions with a pure-PyTorch reference implementation.

csrc/ provides native versions of the same functions (same signatures, same results);
`executor.sparse.kernels` dispatches to them when they are loaded. Conventions: `indices` are
rows of the (packed, local) `weight`; `offsets` has B+1 entries (CSR), so bag b is
`indices[offsets[b]:offsets[b+1]]`.

Dispatch: call the module-level names (`kernels.bag_forward(...)`, ...). The first call builds
or loads the native library (csrc/build.py, cached) and swaps those names for the native
versions; if it cannot load, one warning is issued and the *_ref functions stay in place.
`PICASSO_NATIVE=0` forces the reference path. `native_status()` says which path is live.
The native versions fall back to the reference per call for what they do not cover (gradients
for per-sample weights, tensors off the CPU, non-float dtypes); autograd through
`weight` is native and gives the reference's dense gradient.
"""

from __future__ import annotations

import os
import threading
import warnings
from types import ModuleType
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from executor.dense.interaction import dot_interaction_on, dot_interaction_ref
from executor.sparse import row_optimizers


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


def bag_owner_counts_ref(ids: torch.Tensor, offsets: torch.Tensor, hot_map: torch.Tensor | None,
                         num_owners: int) -> torch.Tensor:
    """Per bag of the CSR `offsets`: its cold IDs per owner (owner = id % num_owners), then its
    hot IDs (`hot_map[id] >= 0`), as [num_owners + 1, num_bags] int64 (the pooled exchange's
    lengths). Sizes come from shapes: nothing is read back from the device."""
    nbags = len(offsets) - 1
    lengths = offsets[1:] - offsets[:-1]
    bag = torch.repeat_interleave(torch.arange(nbags, device=ids.device), lengths, output_size=len(ids))
    owner = ids % num_owners
    if hot_map is not None:
        owner = torch.where(hot_map[ids] >= 0, num_owners, owner)
    cnt = torch.zeros((num_owners + 1) * nbags, dtype=torch.int64, device=ids.device)
    cnt.scatter_add_(0, owner * nbags + bag, torch.ones_like(owner))
    return cnt.view(num_owners + 1, nbags)


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
    step: int = 0,
) -> None:
    """Apply a sparse gradient in place; duplicate rows are summed first.

    sgd: w -= lr * g. rowwise_adagrad: s += mean(g^2) over the row; w -= lr * g / (sqrt(s) + eps),
    with one accumulator per row (`state` has shape [rows]). adagrad, adam: per element
    (executor.sparse.row_optimizers; Adam's bias correction at `step`, from 0).
    """
    if len(rows) == 0:
        return
    uniq, inverse = torch.unique(rows, sorted=True, return_inverse=True)
    g = torch.zeros(len(uniq), grads.shape[1], dtype=grads.dtype, device=grads.device)
    g.index_add_(0, inverse, grads)
    if optimizer in row_optimizers.TORCH_ONLY:
        row_optimizers.update_rows(weight, state, uniq, g, optimizer, lr, eps, step)
    elif optimizer == "sgd":
        weight.index_add_(0, uniq, g, alpha=-lr)
    elif optimizer == "rowwise_adagrad":
        if state is None:
            raise ValueError("rowwise_adagrad needs a state tensor")
        state.index_add_(0, uniq, (g * g).mean(dim=1))
        step = g / (state[uniq].sqrt() + eps).unsqueeze(1)
        weight.index_add_(0, uniq, step, alpha=-lr)
    else:
        raise ValueError(f"unknown sparse optimizer {optimizer!r}")


def sparse_update_indexed_ref(
    weight: torch.Tensor,
    state: torch.Tensor | None,
    rows: torch.Tensor,
    grads: torch.Tensor,
    grad_index: torch.Tensor,
    optimizer: str,
    lr: float,
    eps: float = 1e-8,
) -> None:
    """`sparse_update` where row i's gradient is grads[grad_index[i]] (a gradient shared by
    several rows, e.g. a pooled bag's by each of its lookups)."""
    sparse_update_ref(weight, state, rows, grads.index_select(0, grad_index), optimizer, lr, eps)


# ---- native dispatch -----------------------------------------------------------------------

NATIVE_ENV = "PICASSO_NATIVE"
_FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

_lock = threading.Lock()
_lib: ModuleType | None = None
_tried = False
_reason: str | None = None  # why the native path is not live


def _lib_handles(*tensors: torch.Tensor | None) -> bool:
    """True when every tensor sits where the loaded library runs: the CPU."""
    assert _lib is not None
    return all(t is None or t.device.type == "cpu" for t in tensors)


class _NativeBag(torch.autograd.Function):
    """Native gather + pool with the reference's dense gradient for `weight` (autograd users)."""

    @staticmethod
    def forward(
        ctx: Any, weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, mode: str, psw: Any
    ) -> torch.Tensor:
        assert _lib is not None
        ctx.save_for_backward(indices, offsets, psw)
        ctx.mode = mode
        ctx.weight_shape = weight.shape
        return _lib.bag_forward(weight.detach(), indices, offsets, mode, psw)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        assert _lib is not None
        indices, offsets, psw = ctx.saved_tensors
        rows, grads = _lib.bag_backward(grad_out.contiguous(), indices, offsets, ctx.mode, psw)
        grad_weight = grad_out.new_zeros(ctx.weight_shape)
        grad_weight[rows] = grads
        return grad_weight, None, None, None, None


def bag_forward_native(
    weight: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    mode: str = "sum",
    per_sample_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Native bag_forward; with autograd through `weight` it returns the same dense gradient."""
    if weight.dtype not in _FLOAT_DTYPES or not _lib_handles(weight, indices, offsets, per_sample_weights):
        return bag_forward_ref(weight, indices, offsets, mode, per_sample_weights)
    assert _lib is not None
    if torch.is_grad_enabled():
        if per_sample_weights is not None and per_sample_weights.requires_grad:
            return bag_forward_ref(weight, indices, offsets, mode, per_sample_weights)  # d/d(psw) not native
        if weight.requires_grad:
            return _NativeBag.apply(weight, indices, offsets, mode, per_sample_weights)
    return _lib.bag_forward(weight, indices, offsets, mode, per_sample_weights)


def bag_backward_native(
    grad_out: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    mode: str = "sum",
    per_sample_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if grad_out.dtype not in _FLOAT_DTYPES or not _lib_handles(grad_out, indices, offsets):
        return bag_backward_ref(grad_out, indices, offsets, mode, per_sample_weights)
    assert _lib is not None
    with torch.no_grad():
        return _lib.bag_backward(grad_out, indices, offsets, mode, per_sample_weights)


def route_ids_native(ids: torch.Tensor, hot_map: torch.Tensor | None, num_owners: int) -> Routing:
    if ids.dtype.is_floating_point or not _lib_handles(ids, hot_map):
        return route_ids_ref(ids, hot_map, num_owners)
    assert _lib is not None
    return Routing(*_lib.route_ids(ids, hot_map, num_owners))


def bag_owner_counts_native(ids: torch.Tensor, offsets: torch.Tensor, hot_map: torch.Tensor | None,
                            num_owners: int) -> torch.Tensor:
    if ids.dtype.is_floating_point or any(t is not None and t.device.type != "cpu" for t in (ids, offsets, hot_map)):
        return bag_owner_counts_ref(ids, offsets, hot_map, num_owners)
    assert _lib is not None
    return _lib.bag_owner_counts(ids, offsets, hot_map, num_owners)


def unique_native(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or not _lib_handles(ids):
        return unique_ref(ids)
    assert _lib is not None
    return _lib.unique(ids)


def _update_native_ok(weight: torch.Tensor, state: torch.Tensor | None, grads: torch.Tensor,
                      *others: torch.Tensor) -> bool:
    """The native update takes these tensors: float, contiguous, one dtype, where the library runs."""
    return (
        weight.dtype in _FLOAT_DTYPES
        and weight.is_contiguous()
        and grads.dtype == weight.dtype
        and (state is None or (state.is_contiguous() and state.dtype == weight.dtype))
        and _lib_handles(weight, state, grads, *others)
    )


def sparse_update_native(
    weight: torch.Tensor,
    state: torch.Tensor | None,
    rows: torch.Tensor,
    grads: torch.Tensor,
    optimizer: str,
    lr: float,
    eps: float = 1e-8,
) -> None:
    if not _update_native_ok(weight, state, grads, rows):
        return sparse_update_ref(weight, state, rows, grads, optimizer, lr, eps)
    assert _lib is not None
    with torch.no_grad():
        _lib.sparse_update(weight, state, rows, grads, optimizer, float(lr), float(eps))


def sparse_update_indexed_native(
    weight: torch.Tensor,
    state: torch.Tensor | None,
    rows: torch.Tensor,
    grads: torch.Tensor,
    grad_index: torch.Tensor,
    optimizer: str,
    lr: float,
    eps: float = 1e-8,
) -> None:
    """The shared gradients are read in place (CPU); elsewhere they are expanded first."""
    if weight.device.type != "cpu" or not _update_native_ok(weight, state, grads, rows, grad_index):
        return sparse_update_native(weight, state, rows, grads.index_select(0, grad_index), optimizer, lr, eps)
    assert _lib is not None
    with torch.no_grad():
        _lib.sparse_update_indexed(weight, state, rows, grads, grad_index, optimizer, float(lr), float(eps))


def dot_interaction_native(xs: list[torch.Tensor]) -> torch.Tensor:
    """DLRM's dot interaction on the native CPU kernel (executor.dense.interaction)."""
    assert _lib is not None
    return dot_interaction_on(_lib, xs)


_REF = {
    "dot_interaction": dot_interaction_ref,
    "bag_forward": bag_forward_ref,
    "bag_backward": bag_backward_ref,
    "route_ids": route_ids_ref,
    "bag_owner_counts": bag_owner_counts_ref,
    "unique": unique_ref,
    "sparse_update": sparse_update_ref,
    "sparse_update_indexed": sparse_update_indexed_ref,
}
_NATIVE = {
    "dot_interaction": dot_interaction_native,
    "bag_forward": bag_forward_native,
    "bag_backward": bag_backward_native,
    "route_ids": route_ids_native,
    "bag_owner_counts": bag_owner_counts_native,
    "unique": unique_native,
    "sparse_update": sparse_update_native,
    "sparse_update_indexed": sparse_update_indexed_native,
}


def _install(table: dict[str, Any]) -> None:
    globals().update(table)


def load_native(warn: bool = True) -> bool:
    """Build/load the native library once and swap the dispatch names; False keeps the reference.

    Only the first call does the work; a failure warns once (unless PICASSO_NATIVE=0 asked for it).
    """
    global _lib, _tried, _reason
    with _lock:
        if _tried:
            return _lib is not None
        _tried = True
        if os.environ.get(NATIVE_ENV, "").strip().lower() in ("0", "false", "no", "off"):
            _reason = f"disabled by {NATIVE_ENV}=0"
            _install(_REF)
            return False
        try:
            from csrc import build

            _lib = build.load()
        except Exception as exc:  # noqa: BLE001 - any build/import failure means the reference path
            _reason = f"native kernels unavailable: {exc}"
            _install(_REF)
            if warn:
                warnings.warn(
                    f"picasso: {_reason}; using the pure-PyTorch path", RuntimeWarning, stacklevel=3
                )
            return False
        _reason = None
        _install(_NATIVE)
        return True


def use_reference() -> None:
    """Route the dispatch names to the *_ref functions (benchmarks, A/B checks)."""
    load_native(warn=False)
    _install(_REF)


def use_native() -> bool:
    """Route the dispatch names to the native functions when the library is loaded."""
    if load_native():
        _install(_NATIVE)
        return True
    return False


def native_status() -> dict[str, Any]:
    """What `picasso doctor` reports; does not trigger a build."""
    from csrc import build

    live = globals()["bag_forward"] is bag_forward_native
    return {
        "tried": _tried,
        "loaded": _lib is not None,
        "active": live,
        "path": getattr(_lib, "__file__", None),
        "build_seconds": build.build_seconds,
        "reason": _reason if _tried else "not loaded yet (loads on first kernel call)",
        "env": os.environ.get(NATIVE_ENV),
    }


def _lazy(name: str) -> Any:
    """First-call trampoline: load the library, then forward to whatever the name now points to."""

    def call(*args: Any, **kwargs: Any) -> Any:
        load_native()
        return globals()[name](*args, **kwargs)

    call.__name__ = name
    call.__doc__ = _REF[name].__doc__
    return call


# Dispatch targets: the executor calls kernels.<name>; they resolve on first use.
bag_forward = _lazy("bag_forward")
bag_backward = _lazy("bag_backward")
route_ids = _lazy("route_ids")
bag_owner_counts = _lazy("bag_owner_counts")
unique = _lazy("unique")
sparse_update = _lazy("sparse_update")
sparse_update_indexed = _lazy("sparse_update_indexed")
dot_interaction = _lazy("dot_interaction")
