"""Fold identical ranks of a full graph into representatives (symmetric simulation).

Ranks whose op lists are identical (names, lanes, demands, collectives with the same group,
dependencies, annotations) behave identically, so one of them can stand for all: 1,024 GPUs
then cost about what the distinct ranks cost. Skewed ranks stay separate, so a graph whose
shards differ is simulated rank by rank. Graphs with dependencies across ranks are returned
unchanged (only collectives may couple ranks for the fold to be exact).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from simulator.opgraph import OpGraph


def _signature(graph: OpGraph, ops: list[str]) -> tuple[Any, ...]:
    G = graph.g
    sig = []
    for nid in ops:
        a = G.nodes[nid]
        c = a["collective"]
        deps = tuple(sorted(G.nodes[p]["name"] for p in G.predecessors(nid)))
        sig.append((a["name"], a["lane"], a["kind"], a["dtype"], a["flops"], a["hbm_bytes"], a["host_bytes"],
                    a["pcie_bytes"], a["nic_bytes"], a["mem_alloc"], a["mem_free"],
                    None if c is None else (c.type, c.group, c.bytes_per_rank, c.algorithm),
                    repr(sorted(a["args"].items())), deps))
    return tuple(sig)


def fold_symmetric(graph: OpGraph) -> OpGraph:
    """A symmetric graph with one representative per class of identical ranks (or `graph` itself
    when it is already symmetric, nothing folds, or ops depend on ops of other ranks)."""
    if graph.symmetric or not len(graph):
        return graph
    rank = graph._cols["rank"]
    if any(rank[s] != rank[d] for s, d in zip(graph._esrc, graph._edst)):
        return graph
    per_rank: dict[int, list[str]] = defaultdict(list)
    for nid, r in zip(graph._ids, rank):
        per_rank[r].append(nid)
    classes: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for r in sorted(per_rank):
        classes[_signature(graph, per_rank[r])].append(r)
    if len(classes) == len(per_rank):
        return graph
    reps = {members[0]: len(members) for members in classes.values()}
    out = OpGraph(graph.world_size, symmetric=True, rank_weights=reps)
    out.meta = dict(graph.meta)
    G = graph.g
    for nid in graph._ids:
        a = G.nodes[nid]
        if a["rank"] not in reps:
            continue
        out.add_op(a["name"], a["rank"], a["lane"], a["kind"], flops=a["flops"], hbm_bytes=a["hbm_bytes"],
                   host_bytes=a["host_bytes"], pcie_bytes=a["pcie_bytes"], nic_bytes=a["nic_bytes"], dtype=a["dtype"],
                   collective=a["collective"], mem_alloc=a["mem_alloc"], mem_free=a["mem_free"],
                   deps=list(G.predecessors(nid)), **a["args"])
    return out
