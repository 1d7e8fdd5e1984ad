"""Table-row-wise packs pooled at the owners, reduced inside the node first, all fused.

Plan.exchange "fused_pooled" (the executor: executor.sparse.pooled_twrw). Every table-row-wise pack
with PackPlan.exchange "pooled" (its tables row-wise over one node's g ranks) joins one
exchange group; the group's packs of equal attributes exchange in one collective per stage,
so the busiest rank of the whole group, not of each pack, sets each collective's time.

Forward of a micro-batch, W ranks in W/g nodes, B samples per rank:
1. a2a_ids (all ranks): each cold lookup's ID to its owner, with the number of IDs each bag
   sends each owner (the bag lengths, one int64 per bag and owner: g per bag);
2. cold_pool (owner): the owner gathers its rows and sums them per (requester, bag): W*B
   partial sums of every table of its node;
3. a2a_pooled (node): a reduce-scatter of those partial sums over the node's ranks (NVLink):
   local rank j keeps the node's sums for the requesters of local index j (W/g of them);
4. a2a_pooled_x (peers: the ranks of one local index, one per node): each rank sends every
   peer the node's sums of that peer's bags; a requester gets one vector per bag and table;
5. pool: the requester adds its locally pooled hot part (hot rows replicated as for any pack).
Backward: a2a_pooled_grad_x (peers) sends each bag's gradient to the peer of the table's
node, a2a_pooled_grad (node) all-gathers them inside the node, so each owner has the
gradient of every bag it read rows for, and expands it to its lookups.

Across nodes a requester receives one vector per bag and table (B * width) whatever the
bag length; a flat pooled exchange would have each owner send W*B partial sums over the NIC.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from planner import op_names as on
from planner.modes import Exchange, PlanExchange
from planner.plan import PackPlan, Plan, fused_pooled_member, wire_id_bytes
from planner.program_ops import POOL_STAGE, Op, collective, compute
from planner.sharding import Sharding
from planner.volumes import ID_BYTES, PackVolumes, fuse_table_wise
from simulator.measured import GROUP_LANES

GROUP = "pooled"  # the scope of the fused group's ops: fwd/pooled/a2a_ids, ...


def fused_pooled(plan: Plan) -> bool:
    return plan.exchange == PlanExchange.FUSED_POOLED


member = fused_pooled_member  # whether a pack joins the plan's fused pooled exchange (Plan's rule)


def group_key(plan: Plan, pack: PackPlan) -> tuple:
    """Packs of one key exchange in one collective: equal row attributes, placement, hot sync."""
    return plan.model.table(pack.tables[0]).attributes() + (pack.placement, pack.hot_sync)


def groups(plan: Plan) -> list[list[PackPlan]]:
    """The fused groups of a plan, in the order of their first pack (one per key)."""
    out: dict[tuple, list[PackPlan]] = {}
    for p in plan.packs:
        if member(plan, p):
            out.setdefault(group_key(plan, p), []).append(p)
    return list(out.values())


def group_name(index: int) -> str:
    return GROUP if index == 0 else f"{GROUP}{index}"


@dataclass
class GroupVolumes(PackVolumes):
    """One fused group's volumes: the members' sums (owned_width: per rank, the width of the
    tables of its node), with the members kept for per-member questions."""

    members: list[PackVolumes] = field(default_factory=list)

    @property
    def hierarchical(self) -> bool:
        return True


def fuse(plan: Plan, packs: list[PackVolumes]) -> list[PackVolumes]:
    """Each fused group's packs replaced by one GroupVolumes, at its first member's place."""
    if not fused_pooled(plan):
        return packs
    names = {p.name: i for i, g in enumerate(groups(plan)) for p in g}
    out: list[PackVolumes] = []
    done: set[int] = set()
    for pv in packs:
        gi = names.get(pv.name)
        if gi is None:
            out.append(pv)
            continue
        if gi in done:
            continue
        done.add(gi)
        members = [q for q in packs if names.get(q.name) == gi]
        merged = fuse_table_wise(members)
        kw = {f.name: getattr(merged, f.name) for f in fields(PackVolumes)}
        kw.update(name=group_name(gi), exchange=Exchange.POOLED, hot_sync=members[0].hot_sync)
        out.append(GroupVolumes(**kw, members=members))
    return out


def is_group(pv: PackVolumes) -> bool:
    return isinstance(pv, GroupVolumes)


# ---- volumes -----------------------------------------------------------------------------


def tables_owned(pv: PackVolumes) -> np.ndarray:
    """Tables of each rank's node the rank holds rows of (zero off the owners)."""
    return np.asarray(pv.owned_width) / pv.dim


def ids_bytes(pv: PackVolumes) -> np.ndarray:
    """ID all-to-all per rank, max(send, recv): cold IDs and g lengths per bag out; at an
    owner, every rank's IDs and lengths for its node's tables in."""
    g, w = pv.gpus_per_node, pv.world
    b = pv.id_bytes
    send = pv.cold_unique * b + g * pv.bags * b
    recv = pv.recv_ids * b + w * pv.samples * tables_owned(pv) * b
    return np.maximum(send, recv)


def partial_bytes(pv: PackVolumes) -> np.ndarray:
    """An owner's partial sums for every requester (the node reduce-scatter's buffer)."""
    return pv.world * pv.samples * np.asarray(pv.owned_width) * 4.0


def peer_bytes(pv: PackVolumes) -> np.ndarray:
    """Across nodes per rank, max(send, recv): the node's sums for its W/g peers out, one
    vector per bag and table in."""
    send = pv.world / pv.gpus_per_node * pv.samples * np.asarray(pv.owned_width) * 4.0
    recv = np.full(pv.world, pv.samples * pv.pooled_width * 4.0)
    return np.maximum(send, recv)


def exchange_bytes(pv: PackVolumes, micro_batches: int) -> float:
    """Bytes a rank moves per iteration in the group's exchanges (IDs, sums, gradients)."""
    return float(np.max(ids_bytes(pv) + partial_bytes(pv) + 2 * peer_bytes(pv)
                        + partial_bytes(pv) / pv.gpus_per_node)) * micro_batches


# ---- lowering ----------------------------------------------------------------------------


def fwd(plan: Plan, pv: PackVolumes, mb: int | None, count_steps: float) -> list[Op]:
    """Forward of a fused group for one micro-batch (module docstring)."""
    def n(op: str) -> str:
        return on.op_name("fwd", pv.name, on.pack_op(op, "pooled"), mb)

    out_b = pv.samples * pv.pooled_width * 4.0
    owners = np.nonzero(pv.recv_ids > 0)[0]
    ops = [compute(n("dedup"), [], hbm=pv.lookups * ID_BYTES * 4 + pv.bags * ID_BYTES * 2, flops=pv.lookups,
                   stage=0),
           compute(n("route"), [n("dedup")], hbm=pv.lookups * ID_BYTES * 6,
                   flops=pv.lookups * max(np.log2(max(pv.lookups, 2.0)), 1.0), stage=1)]
    if pv.hot_rows:
        ops.append(compute(n("hot_gather"), [n("route")], hbm=pv.hot_lookups * (pv.row_bytes + ID_BYTES * 2)
                           + out_b, flops=pv.hot_lookups * pv.dim, stage=2))
    ops.append(collective(n("a2a_ids"), [ops[-1].name], "all_to_all", ids_bytes(pv), stage=3, lat_steps=count_steps))
    rows = pv.recv_ids
    part = partial_bytes(pv)
    ops.append(compute(n("cold_gather"), [n("a2a_ids")], hbm=rows * (pv.slice_bytes + ID_BYTES * 2) + part,
                       flops=rows * pv.dim, ranks=owners, stage=4))
    ops.append(collective(n("a2a_emb"), [n("cold_gather")], "reduce_scatter", part, group="node", stage=5))
    ops.append(collective(on.op_name("fwd", pv.name, "a2a_pooled_x", mb), [n("a2a_emb")], "all_to_all",
                          peer_bytes(pv), group="peers", stage=5))
    _own_lanes(ops[-2:])
    nodes = pv.world // pv.gpus_per_node
    ops.append(compute(n("pool"), [ops[-1].name], hbm=(nodes + 2) * out_b, flops=nodes * pv.samples * pv.pooled_width,
                       stage=POOL_STAGE))
    return ops


def bwd(plan: Plan, pv: PackVolumes, mb: int | None, after: str) -> list[Op]:
    """Backward of a fused group: bag gradients to the tables' nodes, then inside each node."""
    def n(op: str) -> str:
        return on.op_name("bwd", pv.name, on.pack_op(op, "pooled"), mb)

    out_b = pv.samples * pv.pooled_width * 4.0
    ops = [compute(n("pool"), [after], hbm=out_b * 2 + pv.hot_lookups * pv.grad_row_bytes * 3,
                   flops=pv.hot_lookups * pv.dim, stage=0)]
    ops.append(collective(on.op_name("bwd", pv.name, "a2a_pooled_grad_x", mb), [n("pool")], "all_to_all",
                          peer_bytes(pv), group="peers", stage=1))
    share = partial_bytes(pv) / pv.gpus_per_node  # each rank's part of the node's bag gradients
    ops.append(collective(n("a2a_grad"), [ops[-1].name], "all_gather", share, group="node", stage=1))
    _own_lanes(ops[-2:])
    return ops


def _own_lanes(ops: list[Op]) -> None:
    """The group's collectives inside the node and among peers queue on their process
    groups' lanes (simulator.measured.GROUP_LANES), not behind the default group's."""
    for op in ops:
        op.lane = GROUP_LANES[op.group]


# ---- the search's layouts and --explain ----------------------------------------------------


SMALL_PACK, ROWS_PACK = "small", "rows"  # layout's packs outside the group (names end so)


def pooled_cost(t: Any, pooling: float) -> float:
    """Bytes per sample a table costs in the group's exchange: its pooled vector across
    nodes both ways (4 B per float) and its IDs (no dedup) to the owners."""
    return 8.0 * t.dim + wire_id_bytes(t.num_rows) * pooling


def layout(plan_tables: list[Any], pooling: dict[str, float], nodes: int, g: int,
           small: list[str], prefix: str = "", rows: list[str] = ()) -> list[PackPlan]:
    """TorchRec's structure with picasso's exchange: the `small` tables in one row-wise pack
    (the search makes all their rows hot: data parallel), the `rows` tables in another
    row-wise pack over every rank (exchanged apart from the group), the others in one
    table-row-wise pack per node, balanced by `pooled_cost` (greedy, largest first), every
    one pooled."""
    big = [t for t in plan_tables if t.name not in small and t.name not in rows]
    load = [0.0] * nodes
    bins: list[list[str]] = [[] for _ in range(nodes)]
    for t in sorted(big, key=lambda t: (-pooled_cost(t, pooling[t.name]), t.name)):
        i = min(range(nodes), key=lambda i: (load[i], i))
        load[i] += pooled_cost(t, pooling[t.name])
        bins[i].append(t.name)
    order = {t.name: i for i, t in enumerate(plan_tables)}
    packs = [PackPlan(f"{prefix}{SMALL_PACK}", list(small), Sharding.ROW_WISE)] if small else []
    packs += [PackPlan(f"{prefix}{ROWS_PACK}", list(rows), Sharding.ROW_WISE)] if rows else []
    packs += [PackPlan(f"{prefix}node{j}", sorted(b, key=order.__getitem__), Sharding.TABLE_ROW_WISE, list(range(j * g, j * g + g)),
                       exchange=Exchange.POOLED) for j, b in enumerate(bins) if b]
    return packs


def explain_lines(plan: Plan, packs: list[PackVolumes]) -> list[str]:
    """--explain: what each fused group carries per micro-batch, and why it beats per-pack pooling."""
    out = []
    for pv in packs:
        if not is_group(pv):
            continue
        mb = 1e6
        out.append(f"fused pooled exchange {pv.name}: packs {', '.join(m.name for m in pv.members)} (table-row-wise, "
                   f"each on one node of {pv.gpus_per_node} ranks) exchange as one collective per stage; per "
                   f"micro-batch and rank: IDs {np.max(ids_bytes(pv)) / mb:.2f} MB (all ranks), partial sums "
                   f"{np.max(partial_bytes(pv)) / mb:.2f} MB reduce-scattered inside the node, then "
                   f"{np.max(peer_bytes(pv)) / mb:.2f} MB across nodes (one vector per bag and table, whatever the "
                   "bag length); backward the same across nodes, then an all-gather inside the node")
        flat = pv.world * pv.samples * float(np.max(pv.owned_width)) * 4.0 / mb
        out.append(f"  (pooling at the owner without the node reduce would send {flat:.2f} MB per owner across "
                   "the NIC; one collective for all packs waits for the busiest rank of the group, not of each pack)")
    return out
