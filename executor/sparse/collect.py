"""Whole packs on rank 0, one at a time, for --verify (collective).

Each holder sends its shard to rank 0 with point-to-point sends; rank 0 writes it into one
full packed tensor by slicing (row-wise shards are strided rows, column-wise shards column
ranges), so verifying costs one pack and one shard beyond the reference, not every table
pickled on every rank. Replicas of a replicated pack are compared by digest; one that
differs from rank 0's is sent too and compared like a pack.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import torch
import torch.distributed as dist

from executor.sparse.embedding import ShardedPack

BLOCK_ROWS = 1 << 18  # rows per block of the block-wise comparison (no table-size temporaries)


def _digest(w: torch.Tensor) -> str:
    a = w.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()  # any dtype, 16-bit too
    return hashlib.blake2b(memoryview(a), digest_size=16).hexdigest()


def _recv(shape: tuple[int, int], src: int, dev: torch.device, dtype: torch.dtype) -> torch.Tensor:
    buf = torch.empty(shape, device=dev, dtype=dtype)  # the table's storage dtype (16-bit tables)
    if buf.numel():
        dist.recv(buf, src=src)
    return buf.cpu()


def _send(w: torch.Tensor) -> None:
    if w.numel():
        dist.send(w.contiguous(), dst=0)


def full_packs(p: ShardedPack, rank: int, world: int) -> Iterator[torch.Tensor]:
    """Yields on rank 0 the pack's full packed weight (for a replicated pack, also any other
    rank's replica that differs from rank 0's); on other ranks it only sends (collective)."""
    L, dev = p.layout, p.dev
    if p.replicated:
        digests = [None] * world
        if world > 1:
            dist.all_gather_object(digests, _digest(p.weight))
        differ = [r for r in range(1, world) if digests[r] != digests[0]] if world > 1 else []
        if rank == 0:
            yield _with_hot(p, p.weight.detach().cpu())
            for r in differ:
                yield _with_hot(p, _recv(tuple(p.weight.shape), r, dev, p.weight.dtype))
        elif rank in differ:
            _send(p.weight.detach())
        return
    if rank != 0:
        if L.index >= 0:
            _send(p.weight.detach())
        return
    full = torch.zeros(L.rows, L.dim, dtype=p.weight.dtype)
    for s in L.geometry.shards:  # a shard is a strided block of rows and a column range
        c0, c1 = s.col_range
        w = p.weight.detach().cpu() if s.rank == 0 else _recv((s.rows, s.cols), s.rank, dev, p.weight.dtype)
        if s.rows:
            full[s.row_slice, c0:c1] = w
        del w
    yield _with_hot(p, full)


def _with_hot(p: ShardedPack, full: torch.Tensor) -> torch.Tensor:
    """The hot caches hold the live copy of their rows (identical on every rank); a replica
    is copied before they are written over it."""
    if not p.num_hot:
        return full
    if p.replicated and full.data_ptr() == p.weight.data_ptr():
        full = full.clone()
    full[p.hot_packed.cpu()] = p.hot_weight.detach().cpu()
    return full


def block_rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a - b| / max|b| (b the reference), in blocks of rows."""
    diff = scale = 0.0
    for lo in range(0, len(b), BLOCK_ROWS):
        x, y = a[lo : lo + BLOCK_ROWS].float(), b[lo : lo + BLOCK_ROWS].float()
        if y.numel():
            diff = max(diff, float((x - y).abs().max()))
            scale = max(scale, float(y.abs().max()))
    return diff / scale if scale > 0 else diff
