"""An OpGraph flattened into numpy arrays, shared by both engines.

Structure (independent of the hardware, cached on the graph until it changes; built with numpy
from the columns OpGraph keeps, without walking networkx): op order, ranks, lanes,
the previous op on each lane, explicit dependencies, and "units": a unit is one ordinary op,
or all held ops of one collective (they start and end together). Costs (per hardware):
fixed and flow time per unit, the resource busy times of each unit, and a collective's
release wait (`uwait`: how long after its data is ready the slowest rank of its group
arrives; simulator.calibration_spec). Both engines start a unit at
max(lane free and data ready, data ready + uwait): the wait is counted from the unit's
data dependencies (`udep`), not from its lane predecessor, so a collective queued behind
a busy lane does not pay it again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulator.calibration_spec import ClassFit, Resolved, class_key
from simulator.cost import N_RES, collective_cost, link_latency_us, resource_capacity
from simulator.device_perf import RANDOM_KEY
from simulator.hardware import HardwareSpec
from simulator.opgraph import _INT_COLUMNS, OpGraph, OpGraphError


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
    udep_ptr: np.ndarray  # CSR unit -> units its explicit dependencies end in (collective units only)
    udep: np.ndarray
    mem: np.ndarray  # (n, 2): alloc, free
    dtypes: list[str]  # dtype code -> name
    eff_keys: list[Any]  # eff_key code -> key
    classes: list[Any]  # cls code -> op class (None: an op without one)
    version: int  # the graph's version it was compiled from
    memo: dict[str, Any] = field(default_factory=dict)  # engine-specific views of the structure

    def column(self, key: str) -> np.ndarray:
        """One per-op column of the graph (demands, "dtype"/"eff_key" codes, "launch", "fixed_us")
        as a view, not a copy: use it at once, the graph cannot grow while a view is alive."""
        if self.graph._version != self.version:
            raise OpGraphError("graph changed after it was compiled: simulate it again")
        dtype = np.int64 if key in _INT_COLUMNS else np.float64
        a = self.graph._cols[key]
        return np.frombuffer(a, dtype) if len(a) else np.zeros(0, dtype)


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


def _stable_order(keys: np.ndarray, n_keys: int) -> np.ndarray:
    """argsort(keys, stable) for keys in [0, n_keys): 16-bit keys take numpy's radix sort."""
    if n_keys <= np.iinfo(np.int16).max:
        keys = keys.astype(np.int16)
    return np.argsort(keys, kind="stable")


def _build_structure(graph: OpGraph) -> Structure:
    # One vectorised pass over the graph's columns (kept by add_op/add_dep): no per-op Python work.
    cols, codes = graph._cols, graph._codes
    ids = list(graph._ids)
    n = len(ids)
    rank = _col(cols, "rank", np.int64)
    held = graph.ranks()
    slot_of = np.full(graph.world_size, -1, np.int64)
    slot_of[held] = np.arange(len(held))
    slot = slot_of[rank]
    if n and (slot < 0).any():
        raise OpGraphError("symmetric graph: ops on ranks missing from rank_weights")
    rw = graph.rank_weights
    weights = np.array([rw[r] for r in held], np.float64)

    # lanes: (rank slot, lane name) -> id in key order; previous op on the lane from a stable sort by lane
    names = list(codes["lane"])
    n_names = max(len(names), 1)
    lane_key = slot * n_names + _col(cols, "lane", np.int64)
    present = np.bincount(lane_key, minlength=len(held) * n_names) > 0
    lut = np.cumsum(present) - 1
    lane = lut[lane_key]
    lane_keys = [(held[k // n_names], names[k % n_names]) for k in np.flatnonzero(present).tolist()]
    order = _stable_order(lane, len(lane_keys))
    lane_prev = np.full(n, -1, np.int64)
    if n > 1:
        same = lane[order[1:]] == lane[order[:-1]]
        lane_prev[order[1:][same]] = order[:-1][same]

    # units: collectives 0..C-1 by (name, group); then one unit per ordinary op, in op order
    coll = _col(cols, "coll", np.int64)
    C = len(codes["coll"])
    ordinary = coll < 0
    n_ord = int(ordinary.sum())
    unit = coll.copy()
    unit[ordinary] = C + np.arange(n_ord)
    n_units = C + n_ord
    counts = np.bincount(unit, minlength=n_units)
    unit_coll = list(graph._coll_info)
    if C:
        held_set = set(held)
        per_group: dict[tuple[int, ...], int] = {}
        expect = np.array([per_group[g] if g in per_group else
                           per_group.setdefault(g, sum(1 for r in g if r in held_set)) for _, g in codes["coll"]])
        bad_u = np.flatnonzero(counts[:C] != expect)
        if len(bad_u):  # a held rank of the group lacks the op: the others would wait forever
            u = int(bad_u[0])
            name, group = list(codes["coll"])[u]
            miss = sorted((set(group) & held_set) - set(rank[unit == u].tolist()))
            raise OpGraphError(f"collective {name!r}: rank {miss[0] if miss else '?'} of its group has no op {name!r}")
        # members of collective units grouped by unit, then the ordinary ops (already in unit order)
        is_coll = np.flatnonzero(~ordinary)
        members = np.concatenate([is_coll[_stable_order(coll[is_coll], C)], np.flatnonzero(ordinary)])
    else:
        members = np.arange(n, dtype=np.int64)

    # explicit dependencies, op level (CSR by destination); views of the graph's edge columns, no copies
    src = np.frombuffer(graph._esrc, np.int64) if len(graph._esrc) else np.zeros(0, np.int64)
    dst = np.frombuffer(graph._edst, np.int64) if len(graph._edst) else np.zeros(0, np.int64)
    order = np.argsort(dst, kind="stable")  # edges arrive nearly sorted by destination: cheap
    dep_src = src[order]
    dep_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=dep_ptr[1:])

    # unit-level successor graph: deps plus lane order, as sorted unique keys src * n_units + dst
    has_prev = np.flatnonzero(lane_prev >= 0)
    nu = max(n_units, 1)
    key = np.concatenate([unit[src] * nu + unit[dst], unit[lane_prev[has_prev]] * nu + unit[has_prev]])
    # a collective's data predecessors (deps only, not the lane): its release wait counts from them
    into_coll = unit[dst] < C
    dkey = np.unique(unit[dst[into_coll]] * nu + unit[src[into_coll]])
    del src, dst, into_coll  # release the views: the graph may grow again
    d_dst, udep = np.divmod(dkey, nu)
    udep_ptr = np.zeros(n_units + 1, np.int64)
    np.cumsum(np.bincount(d_dst, minlength=n_units), out=udep_ptr[1:])
    key.sort()
    if key.size:  # drop duplicates (a dependency that is also the lane order)
        keep = np.empty(key.size, bool)
        keep[0] = True
        np.not_equal(key[1:], key[:-1], out=keep[1:])
        key = key[keep]
    e_src, e_dst = np.divmod(key, nu)
    same = np.flatnonzero(e_src == e_dst)
    if same.size:
        bad = int(np.nonzero(unit == e_src[same[0]])[0][0])
        raise OpGraphError(f"collective {ids[bad].partition(':')[2]!r}: one of its ops waits for another op "
                           "of the same collective (dependency or same lane)")
    usucc_ptr = np.zeros(n_units + 1, np.int64)
    np.cumsum(np.bincount(e_src, minlength=n_units), out=usucc_ptr[1:])
    uindeg = np.bincount(e_dst, minlength=n_units)

    members_ptr = np.zeros(n_units + 1, np.int64)
    np.cumsum(counts, out=members_ptr[1:])
    mem = np.empty((n, 2))
    for j, k in enumerate(("mem_alloc", "mem_free")):
        if len(cols[k]):
            mem[:, j] = np.frombuffer(cols[k], np.float64)
    return Structure(
        ids=ids, graph=graph, rank=rank, slot=slot, held=held, weights=weights, lane=lane,
        lane_keys=lane_keys, lane_prev=lane_prev, unit=unit, n_units=n_units,
        unit_coll=unit_coll, coll_units=np.arange(C, dtype=np.int64),
        members_ptr=members_ptr, members=members, dep_ptr=dep_ptr, dep_src=dep_src,
        usucc_ptr=usucc_ptr, usucc=e_dst, uindeg=uindeg, udep_ptr=udep_ptr, udep=udep, mem=mem, dtypes=list(codes["dtype"]),
        eff_keys=list(codes["eff_key"]), classes=list(codes["cls"]), version=graph._version,
    )


@dataclass
class Costs:
    busy: np.ndarray  # (n_ops, N_RES) solo busy time of each op on each resource of its rank, us
    ufixed: np.ndarray  # per unit
    uflow: np.ndarray  # per unit
    ures_ptr: np.ndarray  # CSR unit -> (global resource index, busy us)
    ures: np.ndarray
    ubusy: np.ndarray
    uop: np.ndarray  # per entry: the op it comes from
    fixed: np.ndarray | None = None  # per op: its fixed time, us (calibration applied)
    flow: np.ndarray | None = None  # per op: its flow time alone, us
    uwait: np.ndarray | None = None  # per unit: release wait after its data is ready, us (collectives; else 0)


def _collective_kinds(st: Structure) -> tuple[np.ndarray, list[tuple[Any, Any]]]:
    """Per collective unit its kind: distinct (Collective, eff_key) pairs (layers repeat one
    collective), so each kind is costed once per hardware. Hardware-independent: memoised."""
    hit = st.memo.get("coll_kinds")
    if hit is None:
        by_id: dict[tuple[int, Any], int] = {}  # cheap: most units share one Collective object
        by_value: dict[tuple[Any, Any], int] = {}
        kinds: list[tuple[Any, Any]] = []
        kind_u = []
        for c, ek in st.unit_coll:
            k = by_id.get((id(c), ek))
            if k is None:
                k = by_id[(id(c), ek)] = by_value.setdefault((c, ek), len(kinds))
                if k == len(kinds):
                    kinds.append((c, ek))
            kind_u.append(k)
        hit = st.memo["coll_kinds"] = (np.array(kind_u, np.int64), kinds)
    return hit


def costs(st: Structure, hw: HardwareSpec) -> Costs:
    """Fixed and flow time and resource use of every unit under `hw`: the base model, with the
    op-class fits and host gaps of the spec's calibration (for its world size,
    simulator.calibration_spec) applied on top, and the collectives' release waits."""
    cal = hw.calibration.resolve(hw.world_size) if hw.calibration is not None else None
    if cal is not None and cal.empty:
        cal = None
    busy, fixed, flow, own = _base_ops(st, hw)
    launch_us = hw.gpu.launch_us
    C = len(st.coll_units)
    ms = st.members[:st.members_ptr[C]] if C else np.zeros(0, np.int64)  # collectives' ops lead st.members
    comm = ClassFit()
    wait = np.zeros(len(st.ids))
    if cal is not None:
        is_coll = st.column("coll") >= 0
        pre = pre_collective_compute(st, fixed + flow, is_coll) if cal.coll_wait else None
        _apply_classes(st, cal, busy, fixed, ~is_coll, hw)
        flow = busy.max(axis=1)
        comm = cal.classes.get(class_key(None, True)) or comm
        if comm.fixed_launches is not None:
            fixed[ms] = comm.fixed_launches * launch_us + own[ms] * (comm.latency_scale or 1.0)
        # waits for slower ranks delay the collective's release, they do not occupy its lane
        wait[ms] = cal.coll_wait_launches * launch_us + (cal.coll_wait * pre[ms] if pre is not None else 0.0)
        if cal.step_gap:  # a rank's first op pays the step's untimed host work
            fixed[np.diff(st.dep_ptr) == 0] += cal.step_gap * launch_us
    if hw.perf.step_host_us:  # likewise the host time per step of the device's figures
        fixed[np.diff(st.dep_ptr) == 0] += hw.perf.step_host_us
    if C:
        kind_u, kinds = _collective_kinds(st)
        lat = np.empty(len(kinds))
        bw = np.empty(len(kinds))
        cb = np.empty((len(kinds), N_RES))
        for k, (c, key) in enumerate(kinds):
            lat[k], bw[k], cb[k] = collective_cost(c, hw, key, comm.rate, comm.latency_scale)
        mk = kind_u[st.unit[ms]]
        busy[ms] = cb[mk]
        fixed[ms] += lat[mk]
        flow[ms] = bw[mk]
    # per unit: fixed/flow of its first member (members agree)
    first = st.members[st.members_ptr[:-1]]
    ufixed = fixed[first]
    uflow = flow[first]
    # resource list per unit: every member's non-zero busy entries on its rank's resources, grouped
    # by unit (ordinary units follow op order already; only collective entries need sorting)
    op_i, res_k = np.nonzero(busy)
    u_of = st.unit[op_i]
    in_coll = u_of < C
    if C:
        ci = np.flatnonzero(in_coll)
        order = np.concatenate([ci[np.argsort(u_of[ci], kind="stable")], np.flatnonzero(~in_coll)])
        op_i, res_k = op_i[order], res_k[order]
    ures_ptr = np.zeros(st.n_units + 1, np.int64)
    np.cumsum(np.bincount(u_of, minlength=st.n_units), out=ures_ptr[1:])
    return Costs(busy=busy, ufixed=ufixed, uflow=uflow, ures_ptr=ures_ptr, ures=st.slot[op_i] * N_RES + res_k,
                 ubusy=busy[op_i, res_k], uop=op_i, fixed=fixed, flow=flow, uwait=wait[first])


def _base_ops(st: Structure, hw: HardwareSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per op under the base model (simulator.cost): busy per resource, fixed time (launch and
    own fixed demands; a collective's algorithm is costed per unit), flow, and the own fixed
    demands alone."""
    n = len(st.ids)
    cap = resource_capacity(hw)
    # FLOP/s per (dtype, eff_key): a GEMM's rate is its dtype's and shape class's (DevicePerf)
    rate = np.array([[hw.flops_rate(d, k) for k in st.eff_keys] or [hw.flops_rate(d)] for d in st.dtypes]
                    or [[1.0]])
    hbm = np.array([hw.hbm_rate(k) for k in st.eff_keys] or [hw.hbm_rate()])
    ek = np.array([hw.eff(k) for k in st.eff_keys] or [1.0])
    ek_code = st.column("eff_key")
    scale = 1e6 / ek[ek_code]
    busy = np.zeros((n, N_RES), order="F")  # column-major: per-resource columns and the row max are fast
    np.divide(st.column("flops"), rate[st.column("dtype"), ek_code], out=busy[:, 0])
    span = st.column("span_bytes")
    if hw.perf.tlb_reach_bytes and span.any():  # a table's rows beyond the TLB's reach (simulator.device_perf)
        random = np.array([k == RANDOM_KEY for k in st.eff_keys] or [False])[ek_code]
        miss = np.where(random & (span > hw.perf.tlb_reach_bytes),
                        1.0 - hw.perf.tlb_reach_bytes / np.maximum(span, 1.0), 0.0)
        np.divide(st.column("hbm_bytes") + st.column("table_bytes") * hw.perf.tlb_miss_cost * miss, hbm[ek_code],
                  out=busy[:, 1])
    else:
        np.divide(st.column("hbm_bytes"), hbm[ek_code], out=busy[:, 1])
    for k, (col, res) in enumerate((("host_bytes", "host"), ("pcie_bytes", "pcie")), 2):
        np.divide(st.column(col), cap[res], out=busy[:, k])
    np.divide(st.column("nic_bytes"), cap["nic"], out=busy[:, 5])
    busy *= scale[:, None]
    if hw.kind == "cpu":  # see cost.py: one DRAM serves host and "hbm" traffic (pcie: none)
        busy[:, 1] += busy[:, 2] + busy[:, 3]
        busy[:, 2:4] = 0.0
    own = st.column("fixed_us").copy()
    lat_steps = st.column("lat_steps")
    if lat_steps.any():
        own += lat_steps * link_latency_us(hw)
    mem = st.column("fixed_hbm_bytes")
    if mem.any():
        own += mem / hw.hbm_rate() * 1e6
    run = st.column("run_bytes")
    if run.any():  # one unit streams a segment alone (simulator.cost.own_fixed_us)
        own += run * hw.perf.parallel_units / hw.hbm_rate() * 1e6
    fixed = st.column("launch") * hw.gpu.launch_us + own
    return busy, fixed, busy.max(axis=1), own


def _apply_classes(st: Structure, cal: Resolved, busy: np.ndarray, fixed: np.ndarray, ordinary: np.ndarray,
                   hw: HardwareSpec) -> None:
    """The fitted class coefficients on the ordinary (non-collective) ops, in place: a class's
    rate factor in place of the op's eff_key factor, its fixed cost (in launches) in place of
    the launch and own fixed part, and the host gap per op on every op."""
    n_cls = max(len(st.classes), 1)
    f_of = np.full(n_cls, np.nan)
    r_of = np.full(n_cls, np.nan)
    for code, name in enumerate(st.classes):
        cf = cal.classes.get(class_key(name, False)) if name is not None else None
        if cf is not None:
            f_of[code] = np.nan if cf.fixed_launches is None else cf.fixed_launches
            r_of[code] = np.nan if cf.rate is None else cf.rate
    code = st.column("cls")
    rate = r_of[code]
    sel = ordinary & ~np.isnan(rate)
    if sel.any():
        ek = np.array([hw.eff(k) for k in st.eff_keys] or [1.0])
        busy[sel] *= (ek[st.column("eff_key")[sel]] / rate[sel])[:, None]
    fl = f_of[code]
    sel = ordinary & ~np.isnan(fl)
    fixed[sel] = fl[sel] * hw.gpu.launch_us
    if cal.op_gap:  # the host's time between two ops is paid by the op it leads to
        fixed[ordinary] += cal.op_gap * hw.gpu.launch_us


def pre_collective_compute(st: Structure, solo_us: np.ndarray, is_coll: np.ndarray) -> np.ndarray:
    """Per op (collectives only; 0 elsewhere): the solo time `solo_us` of the ordinary ops its
    rank runs, in program order, since its previous collective (see
    simulator.calibration.compute_before_collectives for why it matters)."""
    n = len(st.ids)
    out = np.zeros(n)
    if not is_coll.any():
        return out
    order = np.lexsort((np.arange(n), st.rank))  # by rank, then program order
    cs = np.cumsum(np.where(is_coll, 0.0, solo_us)[order])
    r = st.rank[order]
    first = np.r_[True, r[1:] != r[:-1]]
    start = np.maximum.accumulate(np.where(first, np.arange(n), 0))  # where each position's rank begins
    pos = np.flatnonzero(is_coll[order])
    prev = np.r_[-1, pos[:-1]]
    same = prev >= start[pos]
    before_rank = np.where(start[pos] > 0, cs[np.maximum(start[pos] - 1, 0)], 0.0)
    base = np.where(same, cs[np.maximum(prev, 0)], before_rank)
    out[order[pos]] = cs[pos] - base
    return out


def op_costs(graph: OpGraph, hw: HardwareSpec) -> dict[str, tuple[float, float]]:
    """Per op id: (fixed us, flow us) of the op running alone under `hw`, as the engines cost
    it (its calibration applied)."""
    st = structure(graph)
    c = costs(st, hw)
    return {nid: (float(f), float(w)) for nid, f, w in zip(st.ids, c.fixed, c.flow)}
