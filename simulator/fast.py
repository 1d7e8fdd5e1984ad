"""Fast evaluator: list scheduling over arrays (for plan search).

Units (ops, or whole collectives) are started in order of their ready time (all predecessors
and the previous op on the lane done), from a heap of (time, unit) pairs over flat lists.
Shared resources: each resource keeps the time its accepted work runs out and the flow that
holds it last. A unit joining a resource still busy with work W shares it with that flow as
fair sharing would for two flows: both run at half rate while both are on, so the new one
ends at start + b + min(b, W) and the old one is pushed back by min(b, W). Pushing an old
flow back is safe in time order: its successors have not started yet, and a successor popped
with a stale ready time is put back with the new one. Exact for one or two flows on a link;
an approximation with more (the discrete-event engine is the reference).
"""

from __future__ import annotations

import heapq

import numpy as np

from simulator.compiled import Costs, Structure
from simulator.cost import N_RES
from simulator.opgraph import OpGraphError


def schedule(st: Structure, c: Costs) -> tuple[np.ndarray, np.ndarray]:
    """Per op (start_us, end_us)."""
    U = st.n_units
    lists = st.memo.get("fast")
    if lists is None:  # hardware-independent: kept for the next hardware (sweeps)
        sp = st.usucc_ptr.tolist()
        succ_flat = st.usucc.tolist()
        lists = st.memo["fast"] = ([succ_flat[a:b] for a, b in zip(sp, sp[1:])], st.uindeg.tolist())
    succ = lists[0]
    indeg = list(lists[1])
    rp = c.ures_ptr.tolist()
    pairs = list(zip(c.ures.tolist(), c.ubusy.tolist()))
    res_of = [pairs[a:b] for a, b in zip(rp, rp[1:])]
    ufixed = c.ufixed.tolist()
    uflow = c.uflow.tolist()
    ready = [0.0] * U
    ustart = [0.0] * U
    uend = [-1.0] * U
    nres = len(st.held) * N_RES
    res_free = [0.0] * nres
    res_last = [-1] * nres
    heap = [(0.0, u) for u in range(U) if indeg[u] == 0]
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        s, u = pop(heap)
        if ready[u] > s:  # a predecessor was slowed down after u became ready
            push(heap, (ready[u], u))
            continue
        fs = s + ufixed[u]
        fin = fs + uflow[u]
        for r, b in res_of[u]:
            rf = res_free[r]
            if rf > fs:  # shares r with the flow that is still on it: both run at half rate while both are on
                w = rf - fs
                m = b if b < w else w
                e = fs + b + m
                a = res_last[r]
                ae = rf + m
                if ae > uend[a]:
                    uend[a] = ae
                    for v in succ[a]:
                        if ae > ready[v]:
                            ready[v] = ae
                res_free[r] = rf + b
                if b > w:
                    res_last[r] = u
            else:
                e = fs + b
                res_free[r] = e
                res_last[r] = u
            if e > fin:
                fin = e
        ustart[u] = s
        uend[u] = fin
        for v in succ[u]:
            if fin > ready[v]:
                ready[v] = fin
            d = indeg[v] - 1
            indeg[v] = d
            if d == 0:
                push(heap, (ready[v], v))
    us, ue = np.asarray(ustart), np.asarray(uend)
    if U and ue.min() < 0:  # units never ready: a cycle through lanes or collectives
        raise _deadlock(st, ue)
    return us[st.unit], ue[st.unit]


def _deadlock(st: Structure, uend: np.ndarray) -> OpGraphError:
    stuck = np.nonzero(uend[st.unit] < 0)[0]
    names = ", ".join(st.ids[i] for i in stuck[:4])
    return OpGraphError(f"graph cannot run: {len(stuck)} ops wait forever (cycle through lane order or "
                        f"collective order across ranks), e.g. {names}")
