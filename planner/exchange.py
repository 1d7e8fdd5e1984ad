"""The exchange of a pack's cold lookups: rows back to the requester, or pooled at the owner.

PackPlan.exchange "rows" (PICASSO's): a rank deduplicates its IDs, owners return the
distinct rows, the requester pools; the backward returns one gradient per distinct row.
"pooled" (TorchRec's): every cold lookup's ID goes to its owner with the bag lengths, the
owner pools its part of every bag and returns one partial sum per bag; the backward sends
the pooled gradient of every bag to each owner, which expands it to its lookups. Hot IDs
are pooled locally either way and the two partial sums added (exact for sum pooling; a mean
bag is summed, then divided by its whole length at the requester).

Rows win when bags are short and IDs repeat (dedup); pooled wins for long bags (multi-hot)
of large dims, where one vector per bag replaces tens of rows. `exchange_costs` predicts
both for a pack from the same volumes and collective costs lowering uses, and
`choose_exchange` sets each pack to the cheaper; `pooled_fwd`/`pooled_bwd` are lowering's ops
of a pooled pack (op names: planner.op_names.POOLED_OPS).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from planner import op_names as on
from planner.access import TableAccess
from planner.host_access import HostAccess
from planner.modes import Exchange, Placement
from planner.plan import POOLED_SHARDINGS, PackPlan, Plan
from planner.program_ops import POOL_STAGE, Op, collective, compute
from planner.volumes import ID_BYTES, PackVolumes, pack_volumes
from simulator.device_perf import RANDOM_KEY

if TYPE_CHECKING:  # types only: the seams' own classes, not loaded at import
    from simulator.hardware import HardwareSpec



def poolable(plan: Plan, pack: PackPlan) -> bool:
    """Whether a pack may exchange pooled vectors (Plan.validate's rule, asked without raising)."""
    return (plan.world_size > 1 and pack.sharding in POOLED_SHARDINGS
            and all(plan.model.table(t).pooling != "none" for t in pack.tables))


# ---- lowering of a pooled pack -------------------------------------------------------------


def pooled_fwd(plan: Plan, pv: PackVolumes, mb: int | None, count_steps: float) -> list[Any]:
    """Forward of one pooled pack for one micro-batch (planner.lowering's stages)."""
    def n(op: str) -> str:
        return on.op_name("fwd", pv.name, on.pack_op(op, "pooled"), mb)

    out_b = pv.samples * pv.pooled_width * 4.0  # one pooled vector per bag, fp32
    ops = [compute(n("dedup"), [], hbm=pv.lookups * ID_BYTES * 4 + pv.bags * ID_BYTES * 2,
                    flops=pv.lookups, stage=0),
           compute(n("route"), [n("dedup")], hbm=pv.lookups * ID_BYTES * 6,
                    flops=pv.lookups * max(np.log2(max(pv.lookups, 2.0)), 1.0), stage=1)]
    if pv.hot_rows:
        ops.append(compute(n("hot_gather"), [n("route")], hbm=pv.hot_lookups * (pv.row_bytes + ID_BYTES * 2)
                            + out_b, flops=pv.hot_lookups * pv.dim, stage=2))
        ops[-1].demand["table_bytes"] = pv.hot_lookups * pv.row_bytes
    ops.append(collective(n("a2a_ids"), [ops[-1].name], "all_to_all", pv.pooled_ids_bytes, stage=3,
                           lat_steps=count_steps))
    rows = pv.recv_ids
    owners = np.nonzero(rows > 0)[0]
    produced = pv.world * out_b  # an owner's partial sums for every rank
    if pv.placement == Placement.HOST and pv.host_access == HostAccess.MAPPED:  # read in place over PCIe
        ops.append(compute(n("cold_gather"), [n("a2a_ids")], hbm=rows * ID_BYTES * 2 + produced,
                            pcie=rows * pv.slice_bytes, flops=rows * pv.dim, ranks=owners, stage=4))
    elif pv.placement == Placement.HOST:  # host gather of the rows, then their copy over PCIe and the pooling
        ops.append(compute(n("cold_gather"), [n("a2a_ids")], host=rows * (pv.slice_bytes * 2 + ID_BYTES),
                            ranks=owners, stage=4))
        ops.append(Op(on.op_name("fwd", pv.name, "cold_h2d", mb), "copy", "copy",
                      {"pcie_bytes": rows * pv.slice_bytes, "hbm_bytes": rows * pv.slice_bytes * 2 + produced},
                      [n("cold_gather")], ranks=owners, args={"stage": 4}))
    else:
        ops.append(compute(n("cold_gather"), [n("a2a_ids")], hbm=rows * (pv.slice_bytes + ID_BYTES * 2) + produced,
                            flops=rows * pv.dim, ranks=owners, stage=4))
        ops[-1].demand["table_bytes"] = rows * pv.slice_bytes  # of its bytes, the table's rows
    ops.append(collective(n("a2a_emb"), [ops[-1].name], "all_to_all", pv.pooled_out_bytes, stage=5))
    ops.append(compute(n("pool"), [n("a2a_emb")], hbm=(pv.owners_heard + 2) * out_b,
                        flops=pv.owners_heard * pv.samples * pv.pooled_width, stage=POOL_STAGE))
    return ops


def pooled_bwd(plan: Plan, pv: PackVolumes, mb: int | None, after: str) -> list[Any]:
    """Backward of one pooled pack: the bags' gradients (hot ones into the cache's gradient),
    then the pooled gradients to every owner."""
    def n(op: str) -> str:
        return on.op_name("bwd", pv.name, on.pack_op(op, "pooled"), mb)

    out_b = pv.samples * pv.pooled_width * 4.0
    ops = [compute(n("pool"), [after], hbm=out_b * 2 + pv.hot_lookups * pv.grad_row_bytes * 3,
                    flops=pv.hot_lookups * pv.dim, stage=0)]
    ops.append(collective(n("a2a_grad"), [n("pool")], "all_to_all", pv.pooled_out_bytes, stage=1))
    return ops


# ---- the choice -------------------------------------------------------------------------------


def a2a_line(hw: HardwareSpec, world: int) -> tuple[float, float]:
    """(latency us, us per byte) of an all-to-all over every rank (the simulator's cost is
    linear in the buffer: two evaluations give it, so a search need not ask per pack)."""
    from simulator.cost import collective_cost
    from simulator.opgraph import Collective

    group = tuple(range(world))
    lat, bw, _ = collective_cost(Collective("all_to_all", group, 64e6), hw)
    return lat, bw / 64e6


def exchange_costs(plan: Plan, pack: PackPlan, hw: HardwareSpec, access: dict[str, TableAccess],
                   samples: float, line: tuple[float, float] | None = None) -> dict[str, float]:
    """Predicted microseconds per iteration of the pack's cold exchange each way: its
    all-to-alls (IDs, rows or pooled vectors, gradients; the largest buffer of any rank, as
    lowering charges a collective) and the owner's reads and update (its busiest rank), from
    the volumes lowering uses. Only what differs between the two is counted."""
    k, w = plan.micro_batches, plan.world_size
    lat, per_byte = line or a2a_line(hw, w)
    hbm_us = 1e6 / hw.hbm_rate(RANDOM_KEY)  # the owner's reads and updates are of scattered rows
    pcie_us = 1e6 / (hw.pcie_bw * hw.perf.pcie)

    def a2a(nbytes: Any) -> float:
        return lat + float(np.max(nbytes)) * per_byte

    out = {}
    for ex in ("rows", "pooled"):
        pv = pack_volumes(plan, replace(pack, exchange=ex), access, samples, hw.gpus_per_node)
        rows = float(np.max(pv.recv_ids))
        read_us = rows * pv.slice_bytes * (pcie_us if pv.placement == Placement.HOST else 2 * hbm_us)
        if ex == "pooled":
            coll = a2a(pv.pooled_ids_bytes) + 2 * a2a(pv.pooled_out_bytes)
            owner = (pv.world * pv.samples * pv.pooled_width * 4 + rows * pv.grad_row_bytes * 3) * hbm_us
            requester = (pv.owners_heard + 2) * pv.samples * pv.pooled_width * 4 * hbm_us
        else:
            coll = a2a(pv.a2a_ids_bytes) + a2a(pv.a2a_emb_bytes) + a2a(pv.a2a_grad_bytes)
            owner = rows * pv.grad_row_bytes * hbm_us
            requester = (pv.lookups * (ID_BYTES * 6 + pv.row_bytes * 3)) * hbm_us  # dedup, pool, its backward
        out[ex] = float(k * (coll + read_us + owner + requester))
    return out


def choose_exchange(plan: Plan, hw: HardwareSpec, access: dict[str, TableAccess], samples: float,
                    memo: dict | None = None) -> dict[str, dict[str, float]]:
    """Set each pack's exchange to the cheaper by `exchange_costs` (rows where pooled cannot run);
    returns the costs per poolable pack (--explain recomputes them from the plan). `memo` (one
    per search, same hardware and access) keeps the costs of packs seen before."""
    costs: dict[str, dict[str, float]] = {}
    memo = {} if memo is None else memo
    line = memo.get("line") or (a2a_line(hw, plan.world_size) if plan.world_size > 1 else None)
    memo["line"] = line
    from planner.pooled_twrw import member

    for pack in plan.packs:
        if member(plan, pack):  # in the plan's fused pooled exchange (planner.pooled_twrw): stays
            continue
        pack.exchange = Exchange.ROWS
        if poolable(plan, pack):
            key = (tuple(pack.tables), pack.sharding, tuple(pack.ranks or ()), pack.placement, pack.hot_sync,
                   tuple(plan.hot_rows.get(t, 0) for t in pack.tables), plan.micro_batches, samples)
            c = memo.get(key)
            if c is None:
                c = memo[key] = exchange_costs(plan, pack, hw, access, samples, line)
            costs[pack.name] = {k: round(v, 1) for k, v in c.items()}
            pack.exchange = Exchange.POOLED if c["pooled"] < c["rows"] else Exchange.ROWS
    return costs
