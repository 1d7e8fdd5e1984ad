"""How a rank reaches the rows of a pack placed in host memory: the one rule lowering costs and
the executor follows.

- STAGED: the rows a step needs are gathered on the host into a staging buffer and copied to the
  device (two ops: `cold_gather` in host memory, `cold_h2d` over PCIe); their gradients cross
  back and the update runs in host memory. On a CPU worker host memory is the worker's own
  memory, so the copy is free.
- MAPPED (a GPU): the host shard is pinned where it lies and mapped into the GPU's address space,
  as FBGEMM's UVM tables are; the lookup and update kernels read and write the rows in place over
  PCIe. Nothing waits on the host, no staging buffer is allocated, and the step stays one CUDA
  graph.
"""

from __future__ import annotations

from planner.modes import Mode


class HostAccess(Mode):
    STAGED = "staged"
    MAPPED = "mapped"


def host_access(device_kind: str) -> HostAccess:
    """The access a rank of this kind ("gpu"/"cuda" or "cpu") uses for host-placed rows."""
    return HostAccess.MAPPED if device_kind in ("gpu", "cuda") else HostAccess.STAGED
