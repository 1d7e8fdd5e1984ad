"""Synthetic operator graphs (model-agnostic) for tests and benchmarks.

`layered_graph`: every rank runs `micro_batches` x `layers` steps; a step is a memory-bound
op, an all-to-all over all ranks, a compute-bound op (one compute lane, one comm lane) and a
PCIe prefetch on a copy lane; an all-reduce ends the iteration. 4 ops per step per rank.
"""

from __future__ import annotations

from simulator.opgraph import Collective, OpGraph


def layered_graph(world_size: int, layers: int = 4, micro_batches: int = 2, *, symmetric: bool = False,
                  flops: float = 2e9, hbm_bytes: float = 5e7, a2a_bytes: float = 4e6, pcie_bytes: float = 2e6,
                  allreduce_bytes: float = 1e8, mem: float = 1e6, interleave: bool = False) -> OpGraph:
    """Identical work on every rank; `symmetric` keeps rank 0 only, standing for all ranks.
    `interleave`: the memory-bound op gets its own lane (so it overlaps other micro-batches' compute),
    also reads over PCIe, and the compute-bound op reads HBM too: flows then share HBM and PCIe."""
    ranks = [0] if symmetric else list(range(world_size))
    g = OpGraph(world_size, symmetric=symmetric, rank_weights={0: world_size} if symmetric else None)
    everyone = tuple(range(world_size))
    a2a = Collective("all_to_all", everyone, a2a_bytes)
    ar = Collective("all_reduce", everyone, allreduce_bytes)
    for r in ranks:
        last = []
        for b in range(micro_batches):
            prev = None
            for layer in range(layers):
                p = f"mb{b}/l{layer}"
                h2d = g.add_op(f"{p}/h2d", r, "copy", "copy", pcie_bytes=pcie_bytes, mem_alloc=mem)
                gat = g.add_op(f"{p}/gather", r, "memory" if interleave else "compute", "memory",
                               hbm_bytes=hbm_bytes, pcie_bytes=pcie_bytes if interleave else 0.0,
                               deps=[h2d] + ([prev] if prev else []), eff_key="gather")
                sh = g.add_op(f"{p}/a2a", r, "comm", collective=a2a, deps=[gat])
                prev = g.add_op(f"{p}/mlp", r, "compute", "compute", flops=flops, deps=[sh], mem_free=mem,
                                hbm_bytes=hbm_bytes / 2 if interleave else 0.0, eff_key="gemm")
            last.append(prev)
        g.add_op("allreduce", r, "comm", collective=ar, deps=last)
    return g
