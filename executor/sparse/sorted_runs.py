"""The one sort behind deduplication and segment sums, with shapes fixed by the input's."""

from __future__ import annotations

import torch


def sorted_runs(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort `keys` once: (positions in key order, run number of each sorted position, the key of
    each run padded to len(keys) with 0). Nothing is read back to the host."""
    srt, perm = torch.sort(keys)
    head = torch.ones_like(srt, dtype=torch.bool)
    head[1:] = srt[1:] != srt[:-1]
    seg = torch.cumsum(head, 0) - 1
    uniq = torch.zeros_like(srt).scatter_(0, seg, srt)
    return perm, seg, uniq
