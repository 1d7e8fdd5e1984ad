"""Measured memory of a rank: its peak so far and what it holds now.

CPU: the process's resident-set high-water mark (VmHWM), which is what the OOM killer
and the planner's per-rank budget are about. GPU: torch's max_memory_allocated (the
caching allocator's peak; the CUDA context is the planner's fixed reserve).
"""

from __future__ import annotations

import resource

import torch

_KIB = 1024


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_rss_bytes() -> int:
    """This process's resident-set high-water mark in bytes."""
    kib = _status_kib("VmHWM")
    if kib is None:  # not Linux: getrusage gives KiB on Linux, bytes on macOS
        import sys

        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(r if sys.platform == "darwin" else r * _KIB)
    return kib * _KIB


def rss_bytes() -> int:
    """This process's resident set now, in bytes (0 where /proc is missing)."""
    kib = _status_kib("VmRSS")
    return (kib or 0) * _KIB


def peak_bytes(device: torch.device) -> dict[str, int]:
    """The rank's peak memory on `device` ("device": what the plan's per-rank budget covers)
    and its host RSS peak."""
    host = peak_rss_bytes()
    if device.type == "cuda":
        return {"device": int(torch.cuda.max_memory_allocated(device)), "host_rss": host}
    return {"device": host, "host_rss": host}
