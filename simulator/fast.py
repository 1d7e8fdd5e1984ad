"""Fast evaluator: list scheduling over arrays (for plan search).

Units (ops, or whole collectives) are started in order of their ready time (all predecessors
and the previous op on the lane done), from a heap of (time, unit) pairs over flat lists
(per-unit numbers come from the compiled arrays with one numpy pass, no per-op objects).
Shared resources: each resource keeps the time its accepted work runs out and the flow that
holds it last. A unit joining a resource still busy with work W shares it with that flow as
fair sharing would for two flows: both run at half rate while both are on, so the new one
ends at start + b + min(b, W) and the old one is pushed back by min(b, W). Pushing an old
flow back is safe in time order: its successors have not started yet, and a successor popped
with a stale ready time is put back with the new one. Exact for one or two flows on a link;
an approximation with more (the discrete-event engine is the reference).

A collective with a release wait (Costs.uwait: the slowest rank of its group arrives that
long after its data is ready) starts at max(ready, data ready + wait), data ready being the
end of its dependencies alone (Structure.udep), not of its lane predecessor: queued behind a
busy lane, it has waited meanwhile. Its event starts at `ready` (what the lane shows: the
part of the wait the queue did not hide, then the collective).
"""

from __future__ import annotations

import heapq

import numpy as np

from simulator.compiled import Costs, Structure
from simulator.cost import N_RES
from simulator.opgraph import OpGraphError


def _unit_resources(st: Structure, c: Costs) -> tuple[list[int], list[float], list[int], list[float], dict[int, list]]:
    """Per unit its first two (resource, busy) entries as flat lists (most units use one or two
    resources: no per-unit Python objects), and the full list for units with more. First resource
    -1: none; -2: more than two, see the dict.

    Entries on a resource that only one lane uses are left out: the lane runs its ops one after
    another, so such a resource is never shared and its bookkeeping cannot change a result (kept
    where the entry's busy time exceeds the unit's flow time, which then sets its end)."""
    U = st.n_units
    ptr = c.ures_ptr
    ures, ubusy = c.ures, c.ubusy
    entry_unit = np.repeat(np.arange(U), ptr[1:] - ptr[:-1])
    if len(ures):
        lane = st.lane[c.uop]
        ref = np.full(len(st.held) * N_RES, -1, np.int64)
        ref[ures] = lane  # some lane that uses each resource
        shared = np.zeros(len(ref), bool)
        shared[ures[lane != ref[ures]]] = True
        keep = shared[ures] | (ubusy > c.uflow[entry_unit])
        ures, ubusy, entry_unit = ures[keep], ubusy[keep], entry_unit[keep]
    cnt = np.bincount(entry_unit, minlength=U)
    p0 = np.zeros(U, np.int64)
    np.cumsum(cnt[:-1], out=p0[1:])
    nz = len(ures)
    res = np.append(ures, -1)  # index nz: "no resource"
    bus = np.append(ubusy, 0.0)
    small = cnt <= 2
    i1 = np.where(cnt >= 1, p0, nz)
    i2 = np.where(small & (cnt == 2), p0 + 1, nz)
    ur = np.where(small, res[i1], -2).tolist()
    more = np.flatnonzero(~small)
    multi: dict[int, list] = {}
    if len(more):  # only these units' entries become Python pairs
        sel = np.repeat(~small, cnt)
        pairs = list(zip(ures[sel].tolist(), ubusy[sel].tolist()))
        mp = np.cumsum(cnt[more]).tolist()
        multi = dict(zip(more.tolist(), [pairs[a:b] for a, b in zip([0] + mp[:-1], mp)]))
    return ur, bus[i1].tolist(), res[i2].tolist(), bus[i2].tolist(), multi


def schedule(st: Structure, c: Costs) -> tuple[np.ndarray, np.ndarray]:
    """Per op (start_us, end_us)."""
    U = st.n_units
    lists = st.memo.get("fast")
    if lists is None:  # hardware-independent: kept for the next hardware (sweeps)
        sp = st.usucc_ptr.tolist()
        lists = st.memo["fast"] = (tuple(st.usucc.tolist()), st.uindeg.tolist(),
                                   np.flatnonzero(st.uindeg == 0).tolist(), sp)
    succ_flat = lists[0]
    sp = lists[3]
    indeg = lists[1].copy()
    ur, ub, ur2, ub2, multi = _unit_resources(st, c)
    ufixed = c.ufixed.tolist()
    uflow = c.uflow.tolist()
    uwait = c.uwait.tolist() if c.uwait is not None and c.uwait.any() else None
    udp, udep = st.udep_ptr.tolist(), st.udep.tolist()
    ready = [0.0] * U
    ustart = [0.0] * U
    uend = [-1.0] * U
    nres = len(st.held) * N_RES
    res_free = [0.0] * nres
    res_last = [-1] * nres
    heap = [(0.0, u) for u in lists[2]]  # sorted: already a heap
    pop, push, replace = heapq.heappop, heapq.heappush, heapq.heapreplace

    def share(r: int, b: float, fs: float, u: int) -> float:
        """u joins resource r while the flow holding it still has work: both run at half rate
        while both are on. Returns u's end on r; pushes the old flow's end back."""
        rf = res_free[r]
        w = rf - fs
        m = b if b < w else w
        a = res_last[r]
        ae = rf + m
        if ae > uend[a]:
            uend[a] = ae
            for v in succ_flat[sp[a]:sp[a + 1]]:
                if ae > ready[v]:
                    ready[v] = ae
        res_free[r] = rf + b
        if b > w:
            res_last[r] = u
        return fs + b + m

    # The unit being run stays at heap[0] until the first successor it makes ready replaces it
    # (one sift instead of a pop and a push). The common cases (resource idle, one or two
    # resources) are inlined: this loop is the evaluator's cost.
    while heap:
        s, u = heap[0]
        t = ready[u]
        if uwait is not None and uwait[u] > 0:  # released `wait` after its data deps end
            d = 0.0
            for p in udep[udp[u]:udp[u + 1]]:
                if uend[p] > d:
                    d = uend[p]
            d += uwait[u]
            if d > t:
                t = d
        if t > s:  # a predecessor was slowed down after u became ready, or u waits for slower ranks
            replace(heap, (t, u))
            continue
        fs = s + ufixed[u]
        fin = fs + uflow[u]
        r = ur[u]
        if r >= 0:
            if res_free[r] > fs:
                e = share(r, ub[u], fs, u)
            else:
                e = res_free[r] = fs + ub[u]
                res_last[r] = u
            if e > fin:
                fin = e
            r = ur2[u]
            if r >= 0:
                if res_free[r] > fs:
                    e = share(r, ub2[u], fs, u)
                else:
                    e = res_free[r] = fs + ub2[u]
                    res_last[r] = u
                if e > fin:
                    fin = e
        elif r == -2:
            for r, b in multi[u]:
                if res_free[r] > fs:
                    e = share(r, b, fs, u)
                else:
                    e = res_free[r] = fs + b
                    res_last[r] = u
                if e > fin:
                    fin = e
        ustart[u] = ready[u]
        uend[u] = fin
        at_top = True
        for v in succ_flat[sp[u]:sp[u + 1]]:
            if fin > ready[v]:
                ready[v] = fin
            d = indeg[v] - 1
            indeg[v] = d
            if d == 0:
                if at_top:
                    replace(heap, (ready[v], v))
                    at_top = False
                else:
                    push(heap, (ready[v], v))
        if at_top:
            pop(heap)
    us, ue = np.asarray(ustart), np.asarray(uend)
    if U and ue.min() < 0:  # units never ready: a cycle through lanes or collectives
        raise _deadlock(st, ue)
    return us[st.unit], ue[st.unit]


def _deadlock(st: Structure, uend: np.ndarray) -> OpGraphError:
    stuck = np.nonzero(uend[st.unit] < 0)[0]
    names = ", ".join(st.ids[i] for i in stuck[:4])
    return OpGraphError(f"graph cannot run: {len(stuck)} ops wait forever (cycle through lane order or "
                        f"collective order across ranks), e.g. {names}")
