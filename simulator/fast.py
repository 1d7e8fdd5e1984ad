"""Fast evaluator: list scheduling over arrays (for plan search).

Units (ops, or whole collectives) are started in order of their ready time (all predecessors
and the previous op on the lane done). Shared resources are approximated work-conservingly:
each resource keeps the time its accepted work runs out, and an op finishes no earlier than
its own solo time nor than the backlog it joins on any resource. For flows that overlap this
gives the same makespan as fair sharing (the work on a link is the same), though individual
ops may end at different times than in the discrete-event engine.
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
    indeg = st.uindeg.tolist()
    sp = st.usucc_ptr.tolist()
    succ = st.usucc.tolist()
    rp = c.ures_ptr.tolist()
    rres = c.ures.tolist()
    rbusy = c.ubusy.tolist()
    ufixed = c.ufixed.tolist()
    uflow = c.uflow.tolist()
    ready = [0.0] * U
    ustart = [0.0] * U
    uend = [-1.0] * U
    res_free = [0.0] * (len(st.held) * N_RES)
    heap = [(0.0, u) for u in range(U) if indeg[u] == 0]
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush
    done = 0
    while heap:
        s, u = pop(heap)
        done += 1
        fs = s + ufixed[u]
        fin = fs + uflow[u]
        for j in range(rp[u], rp[u + 1]):
            r = rres[j]
            rf = res_free[r]
            e = (rf if rf > fs else fs) + rbusy[j]
            res_free[r] = e
            if e > fin:
                fin = e
        ustart[u] = s
        uend[u] = fin
        for j in range(sp[u], sp[u + 1]):
            v = succ[j]
            if fin > ready[v]:
                ready[v] = fin
            indeg[v] -= 1
            if indeg[v] == 0:
                push(heap, (ready[v], v))
    if done < U:
        raise _deadlock(st, np.asarray(uend))
    us, ue = np.asarray(ustart), np.asarray(uend)
    return us[st.unit], ue[st.unit]


def _deadlock(st: Structure, uend: np.ndarray) -> OpGraphError:
    stuck = np.nonzero(uend[st.unit] < 0)[0]
    names = ", ".join(st.ids[i] for i in stuck[:4])
    return OpGraphError(f"graph cannot run: {len(stuck)} ops wait forever (cycle through lane order or "
                        f"collective order across ranks), e.g. {names}")
