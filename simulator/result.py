"""SimResult: what a simulation predicts; the Timeline and statistics are built on first use."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulator.compiled import Costs, Structure
from simulator.cost import RESOURCES
from simulator.timeline import Timeline

_DEMAND_KEYS = ("flops", "hbm_bytes", "host_bytes", "pcie_bytes", "nic_bytes")


@dataclass
class SimResult:
    iteration_us: float
    engine: str
    start_us: np.ndarray = field(repr=False)  # per op, in graph order
    end_us: np.ndarray = field(repr=False)
    st: Structure = field(repr=False)
    costs: Costs = field(repr=False)
    hardware: str = ""
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def timeline(self) -> Timeline:
        """One event per op (collectives: one per held rank), args with its demands."""
        tl = self._cache.get("timeline")
        if tl is None:
            tl = Timeline(meta={"source": "simulated", "engine": self.engine, "hardware": self.hardware,
                                "rank_weights": {str(r): int(w) for r, w in zip(self.st.held, self.st.weights)}})
            starts, ends = self.start_us.tolist(), self.end_us.tolist()
            nodes = self.st.graph.g.nodes
            for i, nid in enumerate(self.st.ids):
                a = nodes[nid]
                args: dict[str, Any] = {"kind": a["kind"]}
                for k in _DEMAND_KEYS:
                    if a[k]:
                        args[k] = a[k]
                c = a["collective"]
                if c is not None:
                    args.update(collective=c.type, bytes_per_rank=c.bytes_per_rank, group_size=len(c.group))
                if a["args"]:
                    args.update(a["args"])
                tl.add(a["rank"], a["lane"], a["name"], starts[i], ends[i] - starts[i], **args)
            self._cache["timeline"] = tl
        return tl

    @property
    def utilisation(self) -> dict[str, float]:
        """Busy fraction per resource (averaged over ranks, by rank weight) and per lane name."""
        u = self._cache.get("utilisation")
        if u is None:
            T = max(self.iteration_us, 1e-12)
            w = self.st.weights[self.st.slot]  # per op
            total_w = max(float(self.st.weights.sum()), 1.0)
            busy = (self.costs.busy * w[:, None]).sum(axis=0)
            u = {name: float(busy[k] / (total_w * T)) for k, name in enumerate(RESOURCES)}
            dur = (self.end_us - self.start_us) * w
            lane_names = np.array([lk[1] for lk in self.st.lane_keys], dtype=object)
            for name in sorted(set(lane_names.tolist())):
                sel = lane_names[self.st.lane] == name
                u[f"lane:{name}"] = float(dur[sel].sum() / (total_w * T))
            self._cache["utilisation"] = u
        return u

    @property
    def critical_path(self) -> list[str]:
        """Op ids from the first to the last op of the chain that set the iteration time."""
        cp = self._cache.get("critical_path")
        if cp is None:
            path = _critical_path(self.st, self.start_us, self.end_us)
            cp = [self.st.ids[j] for j in path]
            self._cache["critical_path"] = cp
            self._cache["critical_path_idx"] = path
        return cp

    @property
    def peak_mem(self) -> dict[int, float]:
        """Peak of allocated minus freed bytes per held rank (frees at an instant before allocations)."""
        pm = self._cache.get("peak_mem")
        if pm is None:
            pm = {}
            alloc, free = self.st.mem[:, 0], self.st.mem[:, 1]
            for s, r in enumerate(self.st.held):
                sel = np.nonzero((self.st.slot == s) & ((alloc > 0) | (free > 0)))[0]
                if not len(sel):
                    pm[r] = 0.0
                    continue
                t = np.concatenate([self.start_us[sel], self.end_us[sel]])
                d = np.concatenate([alloc[sel], -free[sel]])
                order = np.lexsort((d, t))  # by time, then frees (negative) first
                pm[r] = float(max(np.cumsum(d[order]).max(), 0.0))
            self._cache["peak_mem"] = pm
        return pm

    def summary(self) -> dict[str, Any]:
        cp = self.critical_path
        idx = {self.st.ids[i]: i for i in self._cache["critical_path_idx"]}
        per_s = 1e6 / self.iteration_us if self.iteration_us > 0 else None
        util = self.utilisation
        res_util = {k: util[k] for k in RESOURCES}
        return {
            "engine": self.engine,
            "hardware": self.hardware,
            "iteration_us": self.iteration_us,
            "iterations_per_s": per_s,
            "bottleneck": max(res_util, key=res_util.get) if self.iteration_us > 0 else None,
            "ops": len(self.st.ids),
            "ranks_simulated": len(self.st.held),
            "ranks_represented": int(self.st.weights.sum()),
            "utilisation": util,
            "peak_mem_bytes": max(self.peak_mem.values(), default=0.0),
            "critical_path": cp,
            "critical_path_top": sorted(([k, float(self.end_us[j] - self.start_us[j])] for k, j in idx.items()),
                                        key=lambda kv: -kv[1])[:20],  # its longest ops
        }


def _critical_path(st: Structure, start: np.ndarray, end: np.ndarray) -> list[int]:
    """Walk back from the last op through the predecessor (dependency, lane, collective partner's
    dependency) that finished last."""
    if not len(st.ids):
        return []
    i = int(np.argmax(end))
    path = [i]
    seen = {i}
    while True:
        # predecessors: explicit deps and lane predecessor of every member of the op's unit
        u = st.unit[i]
        ms = st.members[st.members_ptr[u]:st.members_ptr[u + 1]]
        preds = []
        for m in ms.tolist():
            preds.extend(st.dep_src[st.dep_ptr[m]:st.dep_ptr[m + 1]].tolist())
            if st.lane_prev[m] >= 0:
                preds.append(int(st.lane_prev[m]))
        preds = [p for p in preds if p not in seen]
        if not preds:
            break
        best = max(preds, key=lambda p: end[p])
        path.append(best)
        seen.add(best)
        i = best
    return path[::-1]
