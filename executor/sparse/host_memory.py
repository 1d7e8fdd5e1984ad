"""Host memory for a pack placed there (planner.host_access says which access a rank uses).

`torch.Tensor.pin_memory()` copies a tensor into torch's caching host allocator, which rounds
each block up to a power of two: an 18 GB shard held 18 GB unpinned plus 32 GB pinned at its
peak. Here the shard is allocated once in plain memory and registered with CUDA where it lies
(cudaHostRegister): no copy, no rounding. For MAPPED access the same pages are mapped into the
GPU's address space and wrapped as a CUDA tensor (through `__cuda_array_interface__`), so the
pack's lookup and update kernels read and write the rows over PCIe with no host work.
"""

from __future__ import annotations

import functools
import weakref

import torch

from planner.host_access import HostAccess, host_access

_PORTABLE, _MAPPED = 1, 2  # cudaHostRegister flags


class MappingError(RuntimeError):
    """Host memory could not be registered or mapped on this GPU."""


def _register(t: torch.Tensor, flags: int, owner: object) -> None:
    """Pin `t`'s pages in place, unpinned again when `owner` (the object whose life is the
    pages' use: the host tensor, or the mapping a CUDA tensor's storage holds) is freed."""
    if t.numel() == 0:
        return
    ptr, size = t.data_ptr(), t.numel() * t.element_size()
    err = int(torch.cuda.cudart().cudaHostRegister(ptr, size, flags))
    if err != 0:
        raise MappingError(f"cudaHostRegister of {size:,} bytes failed (cudaError {err})")
    weakref.finalize(owner, torch.cuda.cudart().cudaHostUnregister, ptr)


def _owned(t: torch.Tensor) -> torch.Tensor:
    """`t` as a contiguous CPU tensor with storage of its own (a view or a file mapping could
    not be registered safely): copied only when it is not already one."""
    t = t.detach()
    if t.device.type == "cpu" and t.is_contiguous() and t.storage_offset() == 0 \
            and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.contiguous().cpu().clone()


class _DeviceArray:
    """A host buffer registered as mapped, described for torch.as_tensor on the GPU. With unified
    addressing the host pointer of mapped registered memory is valid on the device. The CUDA
    tensor's storage holds this object, and this object the host tensor: the pages stay (and
    stay registered) for as long as any tensor on them."""

    def __init__(self, host: torch.Tensor, raw: torch.Tensor):
        self.host, self.raw = host, raw
        typestr = {torch.float32: "<f4", torch.float16: "<f2", torch.int64: "<i8", torch.int32: "<i4",
                   torch.int16: "<i2"}[raw.dtype]
        self.__cuda_array_interface__ = {"shape": tuple(raw.shape), "typestr": typestr,
                                         "data": (raw.data_ptr(), False), "version": 3, "strides": None}


def mapped(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CUDA tensor whose rows live in host memory: `t`'s pages (or a copy of them), pinned,
    mapped and checked by one read through the device. MappingError when this GPU cannot."""
    host = _owned(t)
    if host.numel() == 0:
        return torch.empty(host.shape, dtype=host.dtype, device=device)
    dtype = host.dtype
    raw = host.view(torch.int16) if dtype == torch.bfloat16 else host  # bf16 has no array-interface type
    array = _DeviceArray(host, raw)
    _register(host, _PORTABLE | _MAPPED, array)
    with torch.cuda.device(device):
        view = torch.as_tensor(array, device=device)
    if dtype == torch.bfloat16:
        view = view.view(torch.bfloat16)
    # the device must see the host's bytes: a GPU without host-pointer access to registered
    # memory would read other addresses
    probe = min(host.shape[0], 2)
    if not torch.equal(view[:probe].cpu(), host[:probe]):
        raise MappingError("this GPU does not read registered host memory at its host address")
    return view


def host_tensor(t: torch.Tensor, device: torch.device, access: HostAccess) -> torch.Tensor:
    """A host-placed shard tensor as the pack computes on it: on a CPU worker `t` itself; on a
    GPU with MAPPED access its mapped CUDA view; with STAGED access on a GPU, pinned in place
    (the staging copies need pinned pages)."""
    if device.type != "cuda":
        return t.contiguous()
    if access == HostAccess.MAPPED:
        return mapped(t, device)
    host = _owned(t)
    _register(host, _PORTABLE, host)
    return host


def access_on(device: torch.device) -> HostAccess:
    """The access this rank uses: the planner's rule for its device kind, STAGED where a GPU
    cannot map host memory (then the step is not captured as a graph either)."""
    access = host_access(device.type)
    if access == HostAccess.MAPPED and not _mapping_works(str(device)):
        return HostAccess.STAGED
    return access


@functools.cache
def _mapping_works(device: str) -> bool:
    """Whether MAPPED access works on `device` (a small buffer mapped and read back)."""
    try:
        mapped(torch.arange(4, dtype=torch.float32).reshape(2, 2), torch.device(device))
    except (MappingError, RuntimeError, TypeError, AssertionError):
        return False
    return True
