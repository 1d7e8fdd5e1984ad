"""Per-op cost: roofline plus launch overhead; collectives by algorithm (closed forms).

Every op costs `fixed_us + flow_us`: a fixed part (launch overhead, collective latency terms)
that does not use bandwidth, then a flow part during which it keeps resources busy. `busy[k]`
is the time the op would occupy resource k running alone (flow_us = max over k for ordinary
ops: the roofline). When ops overlap, the engines share each resource among them.

Resources, one set per rank (RESOURCES): compute (FLOP/s of `dtype`), hbm (device memory; DRAM
for kind "cpu"), host (host DRAM: the node's bandwidth split evenly among its devices, since all
ranks of a step load it alike), pcie (per direction), intra (NVLink/NVSwitch, PCIe P2P, loopback),
nic (per device, or the node's NIC split among its devices). On kind "cpu" host and "hbm" demands
both occupy the worker's DRAM ("hbm") one after the other, at its measured rate (host memory is
the worker's memory), and pcie demands cost nothing (no bus: host and device tensors are one).

Collective closed forms (p ranks, n = bytes_per_rank, g ranks per node, m nodes, a = latency,
B = bandwidth of the link used; `intra` inside a node, `nic` across nodes):
  ring all_reduce     2(p-1) a + 2 (p-1)/p n / B
  tree all_reduce     2 ceil(log2 p) a + 2 n / B
  hierarchical all_reduce (m > 1, g > 1; the default there): intra reduce-scatter, inter ring
                      all-reduce of n/g over m nodes, intra all-gather:
                      2(g-1) a_i + 2(m-1) a_e + 2 (g-1)/g n / B_i + 2 (m-1)/m (n/g) / B_e
  all_to_all          a + max(n (g-1)/p / B_i, n (p-g)/p / B_e)    (intra and inter parts overlap)
  all_gather (ring)   (p-1) a + (p-1) n / B
  reduce_scatter      (p-1) a + (p-1)/p n / B
  broadcast           ceil(log2 p) a + n / B
Flat algorithms across nodes use B = min(B_i, B_e) and a = a_e.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from simulator.device_perf import RANDOM_KEY
from simulator.hardware import HardwareSpec
from simulator.opgraph import Collective

RESOURCES = ("compute", "hbm", "host", "pcie", "intra", "nic")
R_COMPUTE, R_HBM, R_HOST, R_PCIE, R_INTRA, R_NIC = range(6)
N_RES = len(RESOURCES)


def resource_capacity(hw: HardwareSpec) -> dict[str, float]:
    """Peak rate of each per-rank resource (B/s; compute in FLOP/s of fp32), efficiencies applied."""
    hbm = hw.hbm_rate()
    cpu = hw.kind == "cpu"
    return {
        "compute": hw.flops_for("fp32") * hw.eff("compute"),
        "hbm": hbm,
        # a CPU worker's "host" memory is its own DRAM (the same gather at the same measured
        # rate), and nothing crosses a PCIe bus: the executor's copies to and from the
        # "device" are no-ops there
        "host": hbm if cpu else hw.host.dram_bw / hw.gpus_per_node * hw.eff("host"),
        "pcie": math.inf if cpu else hw.pcie_bw * hw.eff("pcie") * hw.perf.pcie,
        "intra": hw.intra_bw() * hw.eff("intra"),
        "nic": hw.nic_bw_per_device() * hw.eff("nic"),
    }


def link_latency_us(hw: HardwareSpec) -> float:
    """The latency one `lat_steps` step costs: the NIC's when the spec spans nodes."""
    return hw.nic_latency_us if hw.world_size > hw.gpus_per_node else hw.intra_latency_us


def own_fixed_us(args: Mapping[str, Any], hw: HardwareSpec) -> float:
    """The fixed demands an op carries besides its launch and its collective algorithm:
    `lat_steps` link latencies, `fixed_hbm_bytes` at the streaming memory rate (its elementwise
    passes, sorts), `run_bytes` at one parallel unit's share of it (the longest run of one row in a
    segment sum, which one unit streams alone: skew's cost), `fixed_us` as given."""
    out = float(args.get("fixed_us", 0.0))
    if args.get("lat_steps"):
        out += float(args["lat_steps"]) * link_latency_us(hw)
    if args.get("fixed_hbm_bytes"):
        out += float(args["fixed_hbm_bytes"]) / hw.hbm_rate() * 1e6
    if args.get("run_bytes"):
        out += float(args["run_bytes"]) * hw.perf.parallel_units / hw.hbm_rate() * 1e6
    return out


def launches(args: Mapping[str, Any]) -> float:
    """Kernels an op launches: its `launch` (a count; True is one, False none)."""
    n = args.get("launch", True)
    return float(n) if not isinstance(n, bool) else (1.0 if n else 0.0)


def fixed_us(attrs: Mapping[str, Any], hw: HardwareSpec) -> float:
    """An op's fixed time under the base model (launch + own fixed demands); a calibration's
    per-class fits are applied on top by simulator.compiled.costs."""
    args = attrs.get("args") or {}
    return launches(args) * hw.gpu.launch_us + own_fixed_us(args, hw)


def op_busy(attrs: Mapping[str, Any], hw: HardwareSpec) -> tuple[float, float, list[float]]:
    """(fixed_us, flow_us, busy_us per resource in RESOURCES order) for one op, under the base
    model (no calibrated op-class fits: those are applied by simulator.compiled.costs)."""
    coll = attrs.get("collective")
    eff_key = (attrs.get("args") or {}).get("eff_key")
    if coll is not None:
        lat, bw, busy = collective_cost(coll, hw, eff_key)
        return fixed_us(attrs, hw) + lat, bw, busy
    cap = resource_capacity(hw)
    k = hw.eff(eff_key)
    flops_rate = hw.flops_rate(attrs.get("dtype", "fp32"), eff_key) * k
    a = attrs.get("args") or {}
    span = float(a.get("span_bytes", 0.0))
    # the table's rows among its bytes wait for page walks beyond the TLB's reach (simulator.device_perf)
    walks = float(a.get("table_bytes", 0.0)) * (hw.perf.random_slowdown(span) - 1.0) if eff_key == RANDOM_KEY else 0.0
    busy = [
        attrs.get("flops", 0.0) / flops_rate * 1e6,
        (attrs.get("hbm_bytes", 0.0) + walks) / (hw.hbm_rate(eff_key) * k) * 1e6,
        attrs.get("host_bytes", 0.0) / (cap["host"] * k) * 1e6,
        attrs.get("pcie_bytes", 0.0) / (cap["pcie"] * k) * 1e6,
        0.0,
        attrs.get("nic_bytes", 0.0) / (cap["nic"] * k) * 1e6,
    ]
    if hw.kind == "cpu":  # host and "HBM" bytes are the same DRAM on a CPU worker (pcie: none, cost 0)
        busy = [busy[0], busy[1] + busy[2] + busy[3], 0.0, 0.0, 0.0, busy[5]]
    return fixed_us(attrs, hw), max(busy), busy


def op_cost_us(attrs: Mapping[str, Any], hw: HardwareSpec) -> float:
    """Time of one op running alone: launch + max(compute, memory, transfer) or a collective's closed form."""
    f, flow, _ = op_busy(attrs, hw)
    return f + flow


def _topology(group: tuple[int, ...], hw: HardwareSpec) -> tuple[int, int, int]:
    """(p, g, m): ranks, most ranks on one node, nodes spanned."""
    per_node = Counter(r // hw.gpus_per_node for r in group)
    return len(group), max(per_node.values()), len(per_node)


def collective_cost(c: Collective, hw: HardwareSpec, eff_key: str | None = None, rate: float | None = None,
                    latency_scale: float | None = None) -> tuple[float, float, list[float]]:
    """(latency_us, bandwidth_us, busy_us per resource) of one collective, for each of its ranks.

    The op's `eff_key` divides the bandwidth term (as for any op); a calibrated collective
    class (simulator.calibration_spec.ClassFit) gives `rate` in its place and
    `latency_scale`, which multiplies the latency terms."""
    lat, bw, busy = _collective_cost(c, hw, eff_key, rate)
    if latency_scale is not None:
        lat *= latency_scale
    if hw.kind == "cpu" and bw > 0:
        # a CPU worker moves a collective's bytes with its own cores and memory (gloo's
        # threads copy and reduce them): while it flies, the rank's compute shares them
        busy[R_COMPUTE] = busy[R_HBM] = bw
    return lat, bw, busy


def _collective_cost(c: Collective, hw: HardwareSpec, eff_key: str | None,
                     rate: float | None) -> tuple[float, float, list[float]]:
    p, g, m = _topology(c.group, hw)
    busy = [0.0] * N_RES
    if p <= 1:
        return 0.0, 0.0, busy
    k = hw.eff(c.type) * (hw.eff(eff_key) if rate is None else rate)
    bi = hw.intra_bw() * hw.eff("intra") * k / 1e6  # bytes per us
    be = hw.nic_bw_per_device() * hw.eff("nic") * k / 1e6
    ai, ae = hw.intra_latency_us, hw.nic_latency_us
    n = float(c.bytes_per_rank)
    algo = c.algorithm
    if algo is None:
        algo = "hierarchical" if (m > 1 and g > 1 and c.type in ("all_reduce", "all_gather", "reduce_scatter")) else (
            "direct" if c.type == "all_to_all" else "ring")
    if m > 1:
        b_flat, a_flat = (min(bi, be) if g > 1 else be), ae
    else:
        b_flat, a_flat = bi, ai

    def flat(t: float) -> None:  # a flat algorithm keeps every link it crosses busy for t
        if m > 1:
            busy[R_NIC] = t
            if g > 1:
                busy[R_INTRA] = t * b_flat / bi
        else:
            busy[R_INTRA] = t

    t = c.type
    if t == "all_to_all":
        ti = n * (g - 1) / p / bi
        te = n * (p - g) / p / be if m > 1 else 0.0
        busy[R_INTRA], busy[R_NIC] = ti, te
        return (ae if m > 1 else ai), max(ti, te), busy
    if algo == "hierarchical" and m > 1 and g > 1:
        if t == "all_reduce":
            ti = 2 * (g - 1) / g * n / bi
            # across nodes NCCL takes the faster of a ring (bandwidth-optimal, 2(m-1) steps) and
            # a double binary tree (2 log2 m steps, about twice the bytes): trees for small sums
            ring = (2 * (m - 1) * ae, 2 * (m - 1) / m * (n / g) / be)
            tree = (2 * math.ceil(math.log2(m)) * ae, 2 * (n / g) / be)
            inter_lat, te = min(ring, tree, key=sum)
            lat = 2 * (g - 1) * ai + inter_lat
        elif t == "reduce_scatter":
            ti = (g - 1) / g * n / bi
            te = (m - 1) / m * (n / g) / be
            lat = (g - 1) * ai + (m - 1) * ae
        elif t == "all_gather":
            ti = (g - 1) * m * n / bi
            te = (m - 1) * n / be
            lat = (g - 1) * ai + (m - 1) * ae
        else:  # broadcast: tree over nodes, then inside
            ti, te = n / bi, n / be
            lat = math.ceil(math.log2(m)) * ae + math.ceil(math.log2(g)) * ai
        busy[R_INTRA], busy[R_NIC] = ti, te
        return lat, ti + te, busy  # phases run one after the other
    if t == "all_reduce":
        if algo == "tree":
            lat, bw = 2 * math.ceil(math.log2(p)) * a_flat, 2 * n / b_flat
        else:
            lat, bw = 2 * (p - 1) * a_flat, 2 * (p - 1) / p * n / b_flat
    elif t == "all_gather":
        lat, bw = (p - 1) * a_flat, (p - 1) * n / b_flat
    elif t == "reduce_scatter":
        lat, bw = (p - 1) * a_flat, (p - 1) / p * n / b_flat
    else:  # broadcast
        lat, bw = math.ceil(math.log2(p)) * a_flat, n / b_flat
    flat(bw)
    return lat, bw, busy
