"""An OpGraph flattened into numpy arrays, shared by both engines.

Structure (independent of the hardware, cached per graph version): op order, ranks, lanes,
the previous op on each lane, explicit dependencies, and "units": a unit is one ordinary op,
or all held ops of one collective (they start and end together). Costs (per hardware):
fixed and flow time per unit and the resource busy times of each unit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulator.cost import N_RES, collective_cost, resource_capacity
from simulator.hardware import HardwareSpec
from simulator.opgraph import OpGraph, OpGraphError


@dataclass(eq=False)
class Structure:
    ids: list[str]
    graph: OpGraph  # for per-op attributes (timeline export)
    rank: np.ndarray  # per op
    slot: np.ndarray  # per op: index of its rank among held ranks
    held: list[int]  # held ranks, slot order
    weights: np.ndarray  # per slot: ranks it stands for
    lane: np.ndarray  # per op: global lane id
    lane_keys: list[tuple[int, str]]  # lane id -> (rank, lane name)
    lane_prev: np.ndarray  # per op: previous op on its lane, -1 first
    unit: np.ndarray  # per op: its unit
    n_units: int
    unit_coll: list[tuple[Any, Any]]  # per collective unit: (Collective, eff_key); ordinary units absent
    coll_units: np.ndarray  # unit ids that are collectives
    members_ptr: np.ndarray  # CSR unit -> member ops
    members: np.ndarray
    dep_ptr: np.ndarray  # CSR op -> explicit predecessor ops
    dep_src: np.ndarray
    usucc_ptr: np.ndarray  # CSR unit -> successor units (deps and lane order)
    usucc: np.ndarray
    uindeg: np.ndarray
    demand: np.ndarray  # (n, 5): flops, hbm, host, pcie, nic
    mem: np.ndarray  # (n, 2): alloc, free
    dtypes: list[str]
    dtype_code: np.ndarray
    eff_keys: list[Any]
    eff_code: np.ndarray
    launch: np.ndarray  # 1.0 where the op pays launch overhead
    fixed_extra: np.ndarray
    memo: dict[str, Any] = field(default_factory=dict)  # engine-specific views of the structure


def structure(graph: OpGraph) -> Structure:
    """Compile (or fetch from the graph's cache) the hardware-independent arrays."""
    st = graph._cache.get("structure")
    if st is None:
        st = _build_structure(graph)
        graph._cache["structure"] = st
    return st


def _col(cols: dict[str, Any], key: str, dtype: Any) -> np.ndarray:
    """A column as a numpy array (a copy: the graph may still grow)."""
    a = cols[key]
    return np.frombuffer(a, dtype).copy() if len(a) else np.zeros(0, dtype)


def _build_structure(graph: OpGraph) -> Structure:
    cols, codes = graph._cols, graph._codes
    ids = list(graph._ids)
    n = len(ids)
    rank = _col(cols, "rank", np.int64)
    held = graph.ranks()
    slot_of = np.full(graph.world_size, -1, np.int64)
    slot_of[held] = np.arange(len(held))
    if n and (slot_of[rank] < 0).any():
        raise OpGraphError("symmetric graph: ops on ranks missing from rank_weights")
    rw = graph.rank_weights
    weights = np.array([rw[r] for r in held], np.float64)

    # lanes: (rank, lane name) -> id; previous op on the lane from a stable sort by lane
    n_names = max(len(codes["lane"]), 1)
    lane_key = rank * n_names + _col(cols, "lane", np.int64)
    lk_unique, lane = np.unique(lane_key, return_inverse=True)
    lane = lane.reshape(-1)
    names = list(codes["lane"])
    lane_keys = [(int(k // n_names), names[int(k % n_names)]) for k in lk_unique.tolist()]
    order = np.argsort(lane, kind="stable")
    lane_prev = np.full(n, -1, np.int64)
    if n > 1:
        same = lane[order[1:]] == lane[order[:-1]]
        lane_prev[order[1:][same]] = order[:-1][same]

    # units: collectives 0..C-1 by (name, group); then one unit per ordinary op
    coll = _col(cols, "coll", np.int64)
    C = len(codes["coll"])
    ordinary = coll < 0
    unit = coll.copy()
    unit[ordinary] = C + np.arange(int(ordinary.sum()))
    n_units = C + int(ordinary.sum())
    coll_keys = list(codes["coll"])
    counts = np.bincount(unit, minlength=n_units)
    held_set = set(held)
    expect: dict[tuple[int, ...], int] = {}
    first = np.full(n_units, -1, np.int64)
    first[unit[::-1]] = np.arange(n - 1, -1, -1)  # first op of each unit
    unit_coll = []
    for u, (name, group) in enumerate(coll_keys):
        e = expect.get(group)
        if e is None:
            e = expect[group] = sum(1 for r in group if r in held_set)
        if counts[u] != e:  # a held rank of the group lacks the op: the others would wait forever
            have = set(rank[unit == u].tolist())
            miss = sorted((set(group) & held_set) - have)
            raise OpGraphError(f"collective {name!r}: rank {miss[0] if miss else '?'} of its group has no op {name!r}")
        a = graph.g.nodes[ids[first[u]]]
        unit_coll.append((a["collective"], a["args"].get("eff_key")))

    # explicit dependencies, op level (CSR by destination)
    src = np.frombuffer(graph._esrc, np.int64).copy() if len(graph._esrc) else np.zeros(0, np.int64)
    dst = np.frombuffer(graph._edst, np.int64).copy() if len(graph._edst) else np.zeros(0, np.int64)
    order = np.argsort(dst, kind="stable")
    dep_src = src[order]
    dep_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=dep_ptr[1:])

    # unit-level successor graph: deps plus lane order
    has_prev = lane_prev >= 0
    e_src = np.concatenate([unit[src], unit[lane_prev[has_prev]]])
    e_dst = np.concatenate([unit[dst], unit[np.nonzero(has_prev)[0]]])
    same = e_src == e_dst
    if same.any():
        k = int(np.nonzero(same)[0][0])
        bad = int(np.nonzero(unit == e_src[k])[0][0])
        raise OpGraphError(f"collective {ids[bad].partition(':')[2]!r}: one of its ops waits for another op "
                           "of the same collective (dependency or same lane)")
    # sort by source and drop duplicates (a dependency that is also the lane order)
    key = np.sort(e_src * n_units + e_dst)
    if key.size:
        key = key[np.concatenate(([True], key[1:] != key[:-1]))]
    e_src, e_dst = key // max(n_units, 1), key % max(n_units, 1)
    usucc_ptr = np.zeros(n_units + 1, np.int64)
    np.cumsum(np.bincount(e_src, minlength=n_units), out=usucc_ptr[1:])
    uindeg = np.bincount(e_dst, minlength=n_units)

    members_ptr = np.zeros(n_units + 1, np.int64)
    np.cumsum(counts, out=members_ptr[1:])
    demand = np.stack([_col(cols, k, np.float64) for k in ("flops", "hbm_bytes", "host_bytes", "pcie_bytes",
                                                         "nic_bytes")], axis=1)
    mem = np.stack([_col(cols, "mem_alloc", np.float64), _col(cols, "mem_free", np.float64)], axis=1)
    return Structure(
        ids=ids, graph=graph, rank=rank, slot=slot_of[rank], held=held, weights=weights, lane=lane,
        lane_keys=lane_keys, lane_prev=lane_prev, unit=unit, n_units=n_units,
        unit_coll=unit_coll, coll_units=np.arange(C, dtype=np.int64),
        members_ptr=members_ptr, members=np.argsort(unit, kind="stable"), dep_ptr=dep_ptr, dep_src=dep_src,
        usucc_ptr=usucc_ptr, usucc=e_dst, uindeg=uindeg, demand=demand, mem=mem,
        dtypes=list(codes["dtype"]), dtype_code=_col(cols, "dtype", np.int64),
        eff_keys=list(codes["eff_key"]), eff_code=_col(cols, "eff_key", np.int64),
        launch=_col(cols, "launch", np.float64), fixed_extra=_col(cols, "fixed_us", np.float64),
    )


@dataclass
class Costs:
    busy: np.ndarray  # (n_ops, N_RES) solo busy time of each op on each resource of its rank, us
    ufixed: np.ndarray  # per unit
    uflow: np.ndarray  # per unit
    ures_ptr: np.ndarray  # CSR unit -> (global resource index, busy us)
    ures: np.ndarray
    ubusy: np.ndarray


def costs(st: Structure, hw: HardwareSpec) -> Costs:
    n = len(st.ids)
    cap = resource_capacity(hw)
    dt_rate = np.array([hw.flops_for(d) * hw.eff("compute") for d in st.dtypes] or [1.0])
    ek = np.array([hw.eff(k) for k in st.eff_keys] or [1.0])
    k = ek[st.eff_code]
    busy = np.zeros((n, N_RES))
    busy[:, 0] = st.demand[:, 0] / dt_rate[st.dtype_code]
    busy[:, 1] = st.demand[:, 1] / cap["hbm"]
    busy[:, 2] = st.demand[:, 2] / cap["host"]
    busy[:, 3] = st.demand[:, 3] / cap["pcie"]
    busy[:, 5] = st.demand[:, 4] / cap["nic"]
    busy *= (1e6 / k)[:, None]
    if hw.kind == "cpu":  # see cost.py: one DRAM serves host, "hbm" and copy traffic
        busy[:, 1] += busy[:, 2] + busy[:, 3]
        busy[:, 2:4] = 0.0
    fixed = st.launch * hw.gpu.launch_us + st.fixed_extra
    flow = busy.max(axis=1)
    C = len(st.coll_units)
    if C:  # collectives are units 0..C-1, so their members lead st.members
        memo: dict[tuple[Any, Any], tuple[float, float, list[float]]] = {}  # layers repeat one collective
        lat = np.empty(C)
        bw = np.empty(C)
        cb = np.empty((C, N_RES))
        for u, key in enumerate(st.unit_coll):
            hit = memo.get(key)
            if hit is None:
                hit = memo[key] = collective_cost(key[0], hw, key[1])
            lat[u], bw[u], cb[u] = hit
        ms = st.members[:st.members_ptr[C]]
        mu = st.unit[ms]
        busy[ms] = cb[mu]
        fixed[ms] += lat[mu]
        flow[ms] = bw[mu]
    # per unit: fixed/flow of its first member (members agree)
    first = st.members[st.members_ptr[:-1]]
    ufixed = fixed[first]
    uflow = flow[first]
    # resource list per unit: every member's non-zero busy entries on its rank's resources
    op_i, res_k = np.nonzero(busy)
    gres = st.slot[op_i] * N_RES + res_k
    u_of = st.unit[op_i]
    order = np.argsort(u_of, kind="stable")
    ures_ptr = np.zeros(st.n_units + 1, np.int64)
    np.cumsum(np.bincount(u_of, minlength=st.n_units), out=ures_ptr[1:])
    return Costs(busy=busy, ufixed=ufixed, uflow=uflow, ures_ptr=ures_ptr, ures=gres[order],
                 ubusy=busy[op_i, res_k][order])
