"""Discrete-event engine (simpy) with flow-level fair sharing.

One simpy process per lane runs its ops in order: wait for the op's dependencies, for a
collective wait until every held rank of the group has arrived and its release wait
(Costs.uwait, counted from when the last member's dependencies ended, not from when its
lanes came free) has passed, then spend the fixed part (launch, latency) and run the flow
part. Running flows share every resource they use: rates
are max-min fair in progress (all flows crossing a saturated resource slow down by the same
factor; none runs faster than alone) and are recomputed whenever a flow starts or ends, over
the flows connected to it through shared resources.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import simpy

from simulator.compiled import Costs, Structure
from simulator.opgraph import OpGraphError

_EPS = 1e-9


class FlowSharing:
    """The running flows and their rates. A flow's work is in solo-microseconds: at rate 1 it
    takes its solo time; `frac[r]` is the share of resource r it uses when running alone."""

    def __init__(self, env: simpy.Environment, n_res: int):
        self.env = env
        self.users: list[dict[int, float]] = [dict() for _ in range(n_res)]  # resource -> {flow: frac}
        self.res: dict[int, list[int]] = {}
        self.rem: dict[int, float] = {}
        self.rate: dict[int, float] = {}
        self.t: dict[int, float] = {}
        self.ver: dict[int, int] = {}
        self.ev: dict[int, simpy.Event] = {}
        self._next = 0

    def run(self, work_us: float, res: list[int], fracs: list[float]) -> simpy.Event:
        fid = self._next
        self._next += 1
        ev = self.env.event()
        self.ev[fid] = ev
        self.rem[fid] = work_us
        self.rate[fid] = 0.0
        self.t[fid] = self.env.now
        self.ver[fid] = 0
        self.res[fid] = res
        alone = True
        for r, f in zip(res, fracs):
            u = self.users[r]
            if u:
                alone = False
            u[fid] = f
        if alone:  # nothing shares its resources: full speed, nobody else changes
            self.rate[fid] = 1.0
            self.ver[fid] = 1
            self.env.timeout(work_us).callbacks.append(self._finisher(fid, 1))
        else:
            self._rebalance(self._component(res))
        return ev

    def _component(self, res: list[int]) -> set[int]:
        """Flows connected to these resources through shared resources."""
        comp: set[int] = set()
        todo = [r for r in res]
        seen_r = set(todo)
        while todo:
            r = todo.pop()
            for f in self.users[r]:
                if f not in comp:
                    comp.add(f)
                    for r2 in self.res[f]:
                        if r2 not in seen_r:
                            seen_r.add(r2)
                            todo.append(r2)
        return comp

    def _rebalance(self, comp: set[int]) -> None:
        now = self.env.now
        for f in comp:  # account progress at the old rates
            self.rem[f] -= self.rate[f] * (now - self.t[f])
            self.t[f] = now
        new = self._max_min(comp)
        for f, x in new.items():
            if abs(x - self.rate[f]) > 1e-12 or self.ver[f] == 0:
                self.rate[f] = x
                self.ver[f] += 1
                v = self.ver[f]
                delay = max(self.rem[f], 0.0) / x
                tm = self.env.timeout(delay)
                tm.callbacks.append(self._finisher(f, v))

    def _max_min(self, comp: set[int]) -> dict[int, float]:
        if len(comp) == 1:
            return {next(iter(comp)): 1.0}
        res = {r for f in comp for r in self.res[f]}
        residual = dict.fromkeys(res, 1.0)
        unfrozen = set(comp)
        out: dict[int, float] = {}
        level = 0.0
        while unfrozen:
            load = {}
            for r in res:
                s = sum(fr for f, fr in self.users[r].items() if f in unfrozen)
                if s > 0:
                    load[r] = s
            inc = 1.0 - level
            for r, s in load.items():
                inc = min(inc, residual[r] / s)
            level += inc
            for r, s in load.items():
                residual[r] -= inc * s
            if level >= 1.0 - _EPS:
                for f in unfrozen:
                    out[f] = 1.0
                break
            sat = [r for r in load if residual[r] <= _EPS]
            for r in sat:
                for f in self.users[r]:
                    if f in unfrozen:
                        unfrozen.discard(f)
                        out[f] = level
        return out

    def _finisher(self, f: int, v: int) -> Callable[[simpy.Event], None]:
        def fire(_: simpy.Event) -> None:
            if self.ver.get(f) != v:
                return  # rescheduled since
            res = self.res.pop(f)
            for r in res:
                del self.users[r][f]
            ev = self.ev.pop(f)
            for d in (self.rem, self.rate, self.t, self.ver):
                del d[f]
            if any(self.users[r] for r in res):
                self._rebalance(self._component(res))
            ev.succeed()
        return fire


def schedule(st: Structure, c: Costs) -> tuple[np.ndarray, np.ndarray]:
    """Per op (start_us, end_us)."""
    env = simpy.Environment()
    n_res = len(st.held) * 6
    flows = FlowSharing(env, n_res)
    U = st.n_units
    ustart = [0.0] * U
    uend = [-1.0] * U
    waiters: dict[int, simpy.Event] = {}  # unit -> event, made only when someone must wait for it

    def wait_for(u: int) -> simpy.Event:
        ev = waiters.get(u)
        if ev is None:
            ev = waiters[u] = env.event()
        return ev
    arrived = [0] * U
    size = np.diff(st.members_ptr).tolist()
    ufixed, uflow = c.ufixed.tolist(), c.uflow.tolist()
    uwait = c.uwait.tolist() if c.uwait is not None else [0.0] * U
    data_ready = [0.0] * U  # per unit: when its members' dependencies had all ended
    rp = c.ures_ptr.tolist()
    rres, rbusy = c.ures.tolist(), c.ubusy.tolist()
    unit = st.unit.tolist()
    dp, dsrc = st.dep_ptr.tolist(), st.dep_src.tolist()
    lanes: list[list[int]] = [[] for _ in st.lane_keys]
    for i, lid in enumerate(st.lane.tolist()):
        lanes[lid].append(i)

    def run_lane(ops: list[int]):
        for i in ops:
            u = unit[i]
            for j in range(dp[i], dp[i + 1]):
                p = unit[dsrc[j]]
                if uend[p] < 0:
                    yield wait_for(p)
                if uend[p] > data_ready[u]:
                    data_ready[u] = uend[p]
            if size[u] > 1:
                arrived[u] += 1
                if arrived[u] < size[u]:
                    yield wait_for(u)
                    continue
            ustart[u] = env.now
            release = data_ready[u] + uwait[u]
            if uwait[u] > 0 and release > env.now:
                yield env.timeout(release - env.now)
            if ufixed[u] > 0:
                yield env.timeout(ufixed[u])
            w = uflow[u]
            if w > 0:
                a, b = rp[u], rp[u + 1]
                if a < b:
                    yield flows.run(w, rres[a:b], [x / w for x in rbusy[a:b]])
                else:
                    yield env.timeout(w)
            uend[u] = env.now
            ev = waiters.pop(u, None)
            if ev is not None:
                ev.succeed()

    for ops in lanes:
        env.process(run_lane(ops))
    env.run()
    ue = np.asarray(uend)
    if (ue < 0).any():
        stuck = np.nonzero(ue[st.unit] < 0)[0]
        names = ", ".join(st.ids[i] for i in stuck[:4])
        raise OpGraphError(f"graph cannot run: {len(stuck)} ops wait forever (cycle through lane order or "
                           f"collective order across ranks), e.g. {names}")
    us = np.asarray(ustart)
    return us[st.unit], ue[st.unit]
