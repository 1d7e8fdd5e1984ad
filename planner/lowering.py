"""Lowering: model + plan + access statistics + hardware -> the OpGraph of one iteration.

Entry point: `lower(plan, hw, profile=None, access=None, symmetric=None) -> Lowered`.

The iteration, per rank (op names from planner.op_names): fwd/input/h2d once (the whole
step's input split, its gradient buffers zeroed), fwd/input/h2d_next beside the step (a batch
ahead copied to the device on a stream of its own, as the executor's DeviceFeeder does), then
per micro-batch:
  per pack: dedup, route, hot_gather, a2a_ids (after a counts exchange), cold_gather, a2a_emb, pool
  (a pack with exchange "pooled": bags, route, hot_gather, a2a_ids, cold_pool, a2a_pooled, pool;
  planner.exchange);
  fwd/dense: bottom_mlp, interaction, top_mlp, loss;
  bwd/dense: top_mlp, interaction, bottom_mlp; per pack: bwd pool, a2a_grad;
then once per iteration: bwd/dense/allreduce (the dense gradients and every pack's hot-row
gradients in one buffer), opt updates. A plan scored as TorchRec runs it (exchange
"torchrec") all-reduces its dense gradients as DDP does, in buckets launched during the last
micro-batch's backward (planner.grad_buckets: DDP's 25 MiB cap over whole stages; the last,
bwd/dense/allreduce_dense, is completed by the bottom MLP and issued after the packs' gradient
exchange), beside the packs' backward; the data-parallel tables' gradients travel in the last.
The dense ops carry the model's dense_precision (planner.modes.DenseDtype), so their FLOP rate
is the hardware's rate for it (fp32 where the preset lacks it: Lowered.notes says so).
Names carry `@mbK` only when the plan has several micro-batches; the per-iteration ops
(input copy, all-reduces, optimizer updates) never do.

With `fuse_table_wise` (how the torchrec-like baseline is scored) runs of table-wise
packs of equal attributes are lowered as one exchange, as TorchRec does it.

Table-row-wise packs exchange their rows as row-wise packs over the node's ranks do (the
executor runs them so); their fused pooled exchange is hierarchical (planner.pooled_twrw).

A plan with exchange == "torchrec" (TorchRec's own plan, planner.torchrec_bridge)
is lowered as TorchRec executes it: fused per sharding type, every lookup's ID sent, owners
look up and pool, pooled vectors back (table/column-wise: all-to-all; row-wise: a ring
reduce-scatter, backward all-gather; table-row-wise: intra-node reduce-scatter then across
nodes), data-parallel tables' whole gradients in the dense all-reduce, and the ID exchange
pipelined: it runs beside the previous ops, as TrainPipelineSparseDist overlaps the next
batch's input distribution with this one.

Overlap is expressed by dependencies and lanes ("copy", "compute", "comm"):
- no interleaving (1 micro-batch, kernel_interleaving off): every op of a rank depends on
  the previous one: the serial program of a plain model-parallel script;
- data interleaving (k > 1 micro-batches): the ops of a micro-batch are chained, different
  micro-batches are not, so one's all-to-all overlaps another's gather;
- kernel interleaving, and any k > 1 (the executor then launches every exchange
  asynchronously and issues stage by stage, `Plan.overlapped`): the packs of a micro-batch are
  not chained to each other either, and ops are issued stage by stage over packs, so the
  shuffle of one pack runs on the comm lane while the gather of the next runs on the
  compute lane.
A rank's graph is built for every rank; with `symmetric` one representative rank carries,
for each op, the largest demand over ranks (collectives make every rank wait for the
slowest, so per-op maxima are what an iteration pays).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from planner import engine_lowering, kernel_passes
from planner import op_names as on
from planner.access import TableAccess, table_access
from planner.dense import ACT_BYTES_SCALE, DenseCost, dense_cost, dense_dtype
from planner.engine_lowering import engine_dense
from planner.errors import PlanError
from planner.geometry import geometry_kind
from planner.grad_buckets import early_buckets, grad_buckets
from planner.host_access import HostAccess, host_access
from planner.memory import MemoryReport, memory_report
from planner.modes import PlanExchange, Scoring
from planner.plan import PackPlan, Plan, fused_runs, table_optimizer
from planner.pooled_twrw import bwd as group_bwd
from planner.pooled_twrw import fuse as fuse_pooled
from planner.pooled_twrw import fwd as group_fwd
from planner.pooled_twrw import is_group
from planner.program_ops import POOL_STAGE, Op
from planner.program_ops import collective as _collective
from planner.program_ops import compute as _compute
from planner.volumes import ID_BYTES, PackVolumes, fuse_table_wise, pack_volumes
from simulator.device_perf import RANDOM_KEY
from simulator.measured import BUCKET_LANE, INPUT_COPY_LANE, INPUT_LANE, SYNC_LANE

if TYPE_CHECKING:  # types only: the seams' own classes, not loaded at import
    from simulator.hardware import HardwareSpec
    from traces.profile import AccessProfile


SYMMETRIC_ABOVE = 16  # world sizes above this get a one-rank symmetric graph by default
# passes over a row's weights an update makes (read, write) and its gradient (read); row-wise
# Adagrad reads the gradient once more for its mean square. The state's own read and write are
# PackVolumes.state_bytes twice (Adam's two moments, Adagrad's per-element sums: planner.model_spec)
UPDATE_PASSES = {"sgd": 3, "rowwise_adagrad": 4, "adagrad": 3, "adam": 3}
@dataclass
class Lowered:
    plan: Plan
    graph: Any  # simulator.opgraph.OpGraph
    ops: list[Op]
    packs: list[PackVolumes]  # per pack, one micro-batch
    memory: MemoryReport
    dense: DenseCost
    symmetric: bool
    dense_dtype: str = "fp32"  # dtype the dense ops were costed at
    notes: list[str] = field(default_factory=list)  # e.g. a dense dtype fallback

    def op(self, name: str) -> Op:
        for o in self.ops:
            if o.name == name:
                return o
        raise KeyError(name)


def lower(
    plan: Plan,
    hw: HardwareSpec,
    profile: AccessProfile | None = None,
    access: dict[str, TableAccess] | None = None,
    symmetric: bool | None = None,
    check_memory: bool = True,
    fuse_table_wise: bool = False,
) -> Lowered:
    """The OpGraph of one training iteration of `plan` on `hw`.

    Raises PlanError when the plan does not fit in memory (which rank, by how much), or
    when the hardware has a different number of ranks than the plan. `fuse_table_wise`
    lowers runs of table-wise packs with equal attributes as one exchange, as TorchRec
    runs them (used to score the torchrec-like baseline; the executor runs packs apart).
    """
    if hw.world_size != plan.world_size:
        raise PlanError(
            f"plan is for {plan.world_size} ranks but hardware {hw.name} has {hw.world_size} "
            f"({hw.nodes} nodes x {hw.gpus_per_node}); use --set nodes=... --set gpus_per_node=..."
        )
    access = access if access is not None else table_access(plan.model, profile)
    for p in plan.packs:
        if geometry_kind(p.sharding).within_node and len({r // hw.gpus_per_node for r in plan.pack_ranks(p)}) > 1:
            raise PlanError(f"pack {p.name}: {p.sharding} ranks {plan.pack_ranks(p)} span several nodes of "
                            f"{hw.gpus_per_node} ranks; it must stay inside one node")
    packs, memory, dense = analyze(plan, hw, access, fuse_table_wise)
    if check_memory and (msg := memory.problem()):
        raise PlanError(msg)
    ops = build_program(plan, packs, dense, hw)
    if symmetric is None:
        symmetric = plan.world_size > SYMMETRIC_ABOVE
    graph = emit_graph(ops, plan.world_size, symmetric, hw.gpus_per_node)
    ddt, note = dense_dtype(plan.model, hw)
    return Lowered(plan, graph, ops, packs, memory, dense, symmetric, ddt, [note] if note else [])


def analyze(plan: Plan, hw: HardwareSpec, access: dict[str, TableAccess],
            fuse_table_wise: bool = False) -> tuple[list[PackVolumes], MemoryReport, DenseCost]:
    """Per-pack volumes for one micro-batch, peak memory per rank, dense costs."""
    samples = plan.batch_size_per_rank / plan.micro_batches
    tr = torchrec_exchange(plan)
    packs = [pack_volumes(plan, p, access, samples, hw.gpus_per_node, dedup=not tr) for p in plan.packs]
    if fuse_table_wise or tr:
        packs = _fuse_runs(packs, fused_runs(plan, PlanExchange.TORCHREC if tr else Scoring.FUSED_TABLE_WISE))
    packs = fuse_pooled(plan, packs)  # Plan.exchange "fused_pooled": planner.pooled_twrw
    for pv in packs:
        pv.longest_run = kernel_passes.longest_run(pv, access)
        pv.host_access = host_access(hw.kind)
    dense = engine_dense(dense_cost(plan.model), plan)
    return packs, memory_report(plan, packs, hw, dense), dense


def torchrec_exchange(plan: Plan) -> bool:
    """Whether `plan` is scored as TorchRec runs it (see the module docstring)."""
    return plan.exchange == PlanExchange.TORCHREC


def _fuse_runs(packs: list[PackVolumes], runs: list[list[PackPlan]]) -> list[PackVolumes]:
    """Each run of packs (planner.plan.fused_runs) becomes one exchange, in place of its first."""
    by_name = {pv.name: pv for pv in packs}
    first = {run[0].name: run for run in runs}
    members = {p.name for run in runs for p in run}
    return [fuse_table_wise([by_name[p.name] for p in first[pv.name]]) if pv.name in first else pv
            for pv in packs if pv.name in first or pv.name not in members]


# ---- the per-rank program ----------------------------------------------------------------


def exchanges(plan: Plan, pv: PackVolumes) -> bool:
    """Whether a pack's lookups cross ranks: not for a replica or a fully hot pack (Plan.fully_hot),
    and not on one rank."""
    return pv.geometry.is_partitioned and plan.world_size > 1 and not pv.fully_hot


def _pack_fwd(plan: Plan, pv: PackVolumes, mb: int | None, count_steps: float) -> list[Op]:
    """Forward stages of one pack for one micro-batch, each depending on the previous.

    Same order as the executor: dedup (unique IDs of the batch), route (hot/cold split,
    owners), hot_gather, then the exchange. `count_steps` (link latencies) is the exchange of every lookup's
    sizes, once per step, charged to the step's first ID exchange (as the executor times it).
    """
    if is_group(pv):  # a fused, hierarchical pooled group: planner.pooled_twrw
        return group_fwd(plan, pv, mb, count_steps)
    if pv.pooled:  # owners pool: planner.exchange
        from planner.exchange import pooled_fwd

        return pooled_fwd(plan, pv, mb, count_steps)

    def n(op: str) -> str:
        return on.op_name("fwd", pv.name, op, mb)

    unique = pv.hot_unique + pv.cold_unique
    ops = [_compute(n("dedup"), [], hbm=pv.lookups * ID_BYTES * 6,
                    flops=pv.lookups * max(np.log2(max(pv.lookups, 2.0)), 1.0), stage=0),
           _compute(n("route"), [n("dedup")], hbm=unique * ID_BYTES * 4, flops=unique * 4, stage=1)]
    if pv.hot_rows:
        ops.append(_compute(n("hot_gather"), [n("route")], hbm=pv.hot_unique * (pv.row_bytes * 2 + ID_BYTES),
                            stage=2))
        ops[-1].demand["table_bytes"] = pv.hot_unique * pv.row_bytes
    gather_dep = ops[-1].name
    if exchanges(plan, pv):
        ops.append(_collective(n("a2a_ids"), [gather_dep], "all_to_all", pv.a2a_ids_bytes, stage=3,
                               lat_steps=count_steps))
        gather_dep = ops[-1].name
    rows = pv.gather_rows
    nbytes = rows * pv.slice_bytes
    # a local pack reads its rows on every rank (the trainer times that read, rows or none)
    owners = None if pv.local else np.nonzero(rows > 0)[0]
    if pv.placement == "host" and pv.host_access == HostAccess.MAPPED:
        # as a GPU runs it: the lookup kernel reads the rows in place over PCIe, one op
        ops.append(_compute(n("cold_gather"), [gather_dep], hbm=nbytes + rows * ID_BYTES, pcie=nbytes,
                            ranks=owners, stage=4))
        last = n("cold_gather")
    elif pv.placement == "host":
        # as the executor runs it: a gather in host memory into a staging buffer, then its
        # copy over PCIe into device memory, two ops
        ops.append(_compute(n("cold_gather"), [gather_dep], host=nbytes * 2 + rows * ID_BYTES, ranks=owners,
                            stage=4))
        ops.append(Op(n("cold_h2d"), "copy", "copy", {"pcie_bytes": nbytes, "hbm_bytes": nbytes},
                      [n("cold_gather")], ranks=owners, args={"stage": 4}))
        last = n("cold_h2d")
    else:
        ops.append(_compute(n("cold_gather"), [gather_dep], hbm=nbytes * 2 + rows * ID_BYTES,
                            ranks=owners, stage=4))
        ops[-1].demand["table_bytes"] = nbytes
        last = n("cold_gather")
    if exchanges(plan, pv):
        ops.append(_collective(n("a2a_emb"), [last], "all_to_all", pv.a2a_emb_bytes, stage=5))
        last = ops[-1].name
    ops.append(_compute(n("pool"), [last], hbm=pv.lookups * pv.row_bytes + pv.samples * pv.pooled_width * 4,
                        flops=pv.lookups * pv.dim, stage=POOL_STAGE))
    return ops


def _pack_bwd(plan: Plan, pv: PackVolumes, mb: int | None, after: str) -> list[Op]:
    if is_group(pv):
        return group_bwd(plan, pv, mb, after)
    if pv.pooled:
        from planner.exchange import pooled_bwd

        return pooled_bwd(plan, pv, mb, after)

    def n(op: str) -> str:
        return on.op_name("bwd", pv.name, op, mb)

    ops = [_compute(n("pool"), [after], hbm=pv.samples * pv.pooled_width * 4 + pv.lookups * pv.row_bytes * 2,
                    flops=pv.lookups * pv.dim, stage=0)]
    if exchanges(plan, pv):
        ops.append(_collective(n("a2a_grad"), [n("pool")], "all_to_all", pv.a2a_grad_bytes, stage=1))
    return ops


def _tr_pack_fwd(plan: Plan, pv: PackVolumes, mb: int | None, count_steps: float) -> list[Op]:
    """Forward of one fused sharding group as TorchRec runs it (module docstring)."""
    def n(op: str) -> str:
        return on.op_name("fwd", pv.name, op, mb)

    out_b = pv.samples * pv.world * pv.owned_width * 4  # pooled vectors an owner computes
    if not pv.geometry.is_partitioned:  # data parallel: a local lookup and pooling
        ops = [_compute(n("cold_gather"), [], hbm=pv.lookups * (pv.row_bytes + ID_BYTES) + pv.samples
                        * pv.pooled_width * 4, flops=pv.lookups * pv.dim, stage=4)]
        ops[0].demand["table_bytes"] = pv.lookups * pv.row_bytes
    else:
        # the input distribution of this batch ran during the previous one (pipelined):
        # on the comm lane, waited for by nothing
        ops = [_collective(n("a2a_ids"), [], "all_to_all", pv.a2a_ids_bytes, stage=3, lat_steps=count_steps,
                           pipelined=True)]
        ops[0].lane = INPUT_LANE  # its own stream, as TorchRec's data-dist stream
        rows = pv.recv_ids
        ops.append(_compute(n("cold_gather"), [], hbm=rows * (pv.slice_bytes + ID_BYTES) + out_b,
                            flops=rows * pv.slice_bytes / 4, ranks=np.nonzero(rows > 0)[0], stage=4))
        ops[-1].demand["table_bytes"] = rows * pv.slice_bytes
        if not pv.geometry.splits_rows:  # whole bags (or their column slices) from their owners
            nbytes = np.maximum(out_b, pv.samples * pv.pooled_width * 4)
            ops.append(_collective(n("a2a_emb"), [n("cold_gather")], "all_to_all", nbytes, stage=5))
        else:  # partial sums of every sample: reduce-scatter (row-wise: flat ring; TWRW: node first)
            ops.append(_collective(n("a2a_emb"), [n("cold_gather")], "reduce_scatter", out_b, algorithm=_tr_algorithm(pv),
                                   stage=5))
    last = ops[-1].name
    ops.append(_compute(n("pool"), [last], hbm=pv.samples * pv.pooled_width * 4 * 2, stage=POOL_STAGE))
    return ops


def _tr_pack_bwd(plan: Plan, pv: PackVolumes, mb: int | None, after: str) -> list[Op]:
    def n(op: str) -> str:
        return on.op_name("bwd", pv.name, op, mb)

    own = pv.samples * pv.pooled_width * 4
    ops = [_compute(n("pool"), [after], hbm=own * 2, stage=0)]
    if not pv.geometry.is_partitioned:
        return ops
    if not pv.geometry.splits_rows:
        nbytes = np.maximum(pv.samples * pv.world * pv.owned_width * 4, own)
        ops.append(_collective(n("a2a_grad"), [n("pool")], "all_to_all", nbytes, stage=1))
    else:  # the pooled gradients of every sample to every owner (TWRW: each node's share)
        share = own / (pv.world // pv.gpus_per_node) if pv.geometry.within_node else own
        ops.append(_collective(n("a2a_grad"), [n("pool")], "all_gather", share, algorithm=_tr_algorithm(pv),
                               stage=1))
    return ops


def _tr_algorithm(pv: PackVolumes) -> str:
    """TorchRec's collective over a row-split pack's owners: node first for table-row-wise."""
    return "hierarchical" if pv.geometry.within_node else "ring"


def _traffic(dense: DenseCost, op: str, backward: bool = False) -> float:
    """Memory traffic per sample of a dense op (fp32 bytes) besides its parameters."""
    c = dense.ops[op]
    if c.traffic is not None:
        return c.traffic * (2.0 if backward else 1.0)
    return c.act_bytes + dense.feature_width * 4 * (op == "interaction")


def _bottom_fwd(dense: DenseCost, samples: float, mb: int | None, dtype: str) -> Op | None:
    """The bottom MLP's forward: it needs the dense features only (build_program issues it
    ahead of the pools)."""
    bottom = dense.ops["bottom_mlp"]
    if not bottom.flops:
        return None
    op = _compute(on.op_name("fwd", "dense", "bottom_mlp", mb), [on.op_name("fwd", "input", "h2d")],
                  flops=samples * bottom.flops, eff_key="gemm",
                  hbm=bottom.params * 4 + samples * bottom.act_bytes * ACT_BYTES_SCALE[dtype])
    op.dtype = dtype
    return op


def _dense_fwd(dense: DenseCost, samples: float, mb: int | None, pools: list[str], dtype: str) -> list[Op]:
    """The dense forward after the bottom MLP: interaction, top MLP, loss."""
    ops = []
    act = ACT_BYTES_SCALE[dtype]
    inter_deps = list(pools) + [on.op_name("fwd", "input", "h2d")]
    if dense.ops["bottom_mlp"].flops:
        inter_deps.append(on.op_name("fwd", "dense", "bottom_mlp", mb))
    prev = None
    for op in ("interaction", "top_mlp", "loss"):
        c = dense.ops[op]
        name = on.op_name("fwd", "dense", op, mb)
        ops.append(_compute(name, inter_deps if prev is None else [prev], flops=samples * c.flops,
                            hbm=c.params * 4 + samples * act * _traffic(dense, op),
                            eff_key="gemm" if op != "interaction" else None))
        ops[-1].dtype = dtype
        prev = name
    return ops


def _dense_bwd_head(dense: DenseCost, samples: float, mb: int | None, after: str, dtype: str) -> list[Op]:
    ops, prev = [], after
    act = ACT_BYTES_SCALE[dtype]
    for op in ("top_mlp", "interaction"):
        c = dense.ops[op]
        name = on.op_name("bwd", "dense", op, mb)
        ops.append(_compute(name, [prev], flops=2 * samples * c.flops,
                            hbm=2 * c.params * 4 + samples * act * _traffic(dense, op, backward=True),
                            eff_key="gemm" if op != "interaction" else None))
        ops[-1].dtype = dtype
        prev = name
    return ops


def _grad_buckets(dense: DenseCost, layout: list[tuple[str, tuple[str, ...]]], stage: str, present: list[str],
                  after: str, ops: list[Op], lane: str) -> list[str]:
    """Append the dense gradients' buckets of `layout` (planner.grad_buckets) complete once `stage`'s backward
    (op `after`) is done: those whose last stage among `present` (the stages with a backward
    op, in backward order) is `stage`; their names.
    Asynchronous, as DDP runs them (off a serial chain), on `lane`: "comm" where DDP shares the
    default process group with TorchRec's exchanges, so that they queue behind each other."""
    names = []
    for name, stages in layout:
        mine = [s for s in present if s in stages]
        params = sum(dense.ops[s].params for s in stages)
        if not mine or mine[-1] != stage or not params:
            continue
        ops.append(_collective(on.op_name("bwd", "dense", name), [after], "all_reduce", float(params * 4),
                               pipelined=True))
        ops[-1].lane = lane
        names.append(ops[-1].name)
    return names


def _bottom_bwd(dense: DenseCost, samples: float, mb: int | None, after: str, dtype: str) -> Op | None:
    bottom = dense.ops["bottom_mlp"]
    if not bottom.flops:
        return None
    op = _compute(on.op_name("bwd", "dense", "bottom_mlp", mb), [after], flops=2 * samples * bottom.flops,
                  eff_key="gemm", hbm=2 * bottom.params * 4 + samples * bottom.act_bytes * ACT_BYTES_SCALE[dtype])
    op.dtype = dtype
    return op


def _layered_backward(plan: Plan, packs: list[PackVolumes], dense: DenseCost, samples: float, ddt: str,
                      mbs: list[int | None], pools: dict, dense_ops: dict, layout: list, bucket_lane: str,
                      ops: list[Op], bwd_by_pack: dict, grads_by_pack: dict, early: list[str],
                      dense_grads: list[str]) -> None:
    """Every micro-batch's forward, then the backward layer by layer over them, as the trainer
    runs Plan.backward_by_layer: each one's top MLP (the top MLP's buckets go once the last is
    done), then per micro-batch its interaction, its packs' backward (their gradient exchange)
    and its bottom MLP; a bucket goes once the last micro-batch has done its last stage."""
    for mb in mbs:
        ops.extend(pools[mb])
        ops.extend(dense_ops[mb])
    heads = {mb: _dense_bwd_head(dense, samples, mb, dense_ops[mb][-1].name, ddt) for mb in mbs}
    present = ["top_mlp", "interaction"] + (["bottom_mlp"] if dense.ops["bottom_mlp"].flops else [])

    def done(stage: str, op: Op, mi: int) -> None:
        if layout and mi == len(mbs) - 1:  # the stage's gradients are final
            early.extend(_grad_buckets(dense, layout, stage, present, op.name, ops, bucket_lane))

    for mi, mb in enumerate(mbs):
        ops.append(heads[mb][0])
        dense_grads.append(heads[mb][0].name)
        done("top_mlp", heads[mb][0], mi)
    for mi, mb in enumerate(mbs):
        inter = heads[mb][1]
        ops.append(inter)
        done("interaction", inter, mi)
        ops.extend(_packs_bwd(plan, packs, mb, mi, inter.name, False, bwd_by_pack, grads_by_pack))
        bottom = _bottom_bwd(dense, samples, mb, inter.name, ddt)
        if bottom is not None:
            ops.append(bottom)
            dense_grads.append(bottom.name)
            done("bottom_mlp", bottom, mi)


def _packs_bwd(plan: Plan, packs: list[PackVolumes], mb: int | None, mi: int, after: str, tr: bool,
               bwd_by_pack: dict, grads_by_pack: dict) -> list[Op]:
    """One micro-batch's backward of every pack (after op `after`, the interaction's backward)
    in issue order; each pack's first and last op are noted in bwd_by_pack and grads_by_pack."""
    pack_bwd: list[tuple[tuple, Op]] = []
    prev_last: str | None = None
    for pi, pv in enumerate(packs):
        stages = (_tr_pack_bwd if tr else _pack_bwd)(plan, pv, mb, after)
        if prev_last is not None and not plan.overlapped:
            stages[0].deps.append(prev_last)
        prev_last = stages[-1].name
        bwd_by_pack[pv.name].append(stages[0].name)
        grads_by_pack[pv.name].append(stages[-1].name)
        pack_bwd += [(_order_key(plan, op.args["stage"], mi, pi), op) for op in stages]
    return [op for _, op in sorted(pack_bwd, key=lambda x: x[0])]


def _order_key(plan: Plan, stage: int, mb: int, pack: int) -> tuple:
    if stage <= 1:  # as Trainer._route: every lookup deduplicated and routed first, lookup by lookup
        return (0, mb, pack, stage)
    if plan.overlapped:
        return (1, stage, mb, pack)
    return (1, pack, stage)


def build_program(plan: Plan, packs: list[PackVolumes], dense: DenseCost, hw: HardwareSpec) -> list[Op]:
    """The ops of one iteration in issue order, with their dependencies (per rank)."""
    tr = torchrec_exchange(plan)
    # the counts exchange before each ID exchange: one more link latency (none alone), a demand
    # the cost model prices under whichever spec simulates the graph
    count_steps = 0.0 if plan.world_size == 1 else 1.0
    ddt, _ = dense_dtype(plan.model, hw)
    k = plan.micro_batches
    mbs: list[int | None] = list(range(k)) if k > 1 else [None]
    samples = plan.batch_size_per_rank / k
    serial = k == 1 and not plan.kernel_interleaving
    model = plan.model
    in_bytes = samples * (4 * model.num_dense + 4 + ID_BYTES * sum(pv.lookups for pv in packs) / samples)
    # as in the executor, the step's input is split in micro-batches and the gradient buffers
    # (dense parameters, hot rows) are zeroed for the step (fwd/input/h2d); the input itself
    # crossed PCIe during the previous step, on a stream of its own (executor.data.batches.
    # DeviceFeeder; TorchRec's pipelines copy a batch ahead too): fwd/input/h2d_next, on its
    # own lane, waited for by nothing
    h2d = on.op_name("fwd", "input", "h2d")
    zeroed = dense.params * 4 + sum(float(pv.hot_rows) * pv.grad_row_bytes for pv in packs if not pv.sparse_hot)
    ops: list[Op] = [Op(h2d, "copy", "copy", {"pcie_bytes": 0.0, "hbm_bytes": in_bytes * k + zeroed}, []),
                     Op(on.op_name("fwd", "input", "h2d_next"), INPUT_COPY_LANE, "copy", {"pcie_bytes": in_bytes * k},
                        [], args={"pipelined": True})]

    # forward of the packs up to the returned rows, issued in the interleaving order; as
    # in the executor, pooling waits for the micro-batch's turn, just before its dense
    # step, so one micro-batch's dense work overlaps the next one's exchange
    fwd: list[tuple[tuple, Op]] = []
    pools: dict[int | None, list[Op]] = {mb: [] for mb in mbs}
    for mi, mb in enumerate(mbs):
        for pi, pv in enumerate(packs):
            if tr:  # TorchRec exchanges the counts of every group before its input distribution
                stages = _tr_pack_fwd(plan, pv, mb, count_steps)
            else:  # one sizes exchange per step, charged to the first ID exchange
                first_exchange = exchanges(plan, pv) and not any(exchanges(plan, q) for q in packs[:pi]) and mi == 0
                stages = _pack_fwd(plan, pv, mb, count_steps if first_exchange else 0.0)
            stages[0].deps.append(h2d)  # packs of a step that is not overlapped: the serial chain orders them
            local = not tr and not exchanges(plan, pv)
            for op in stages:
                # a pack that exchanges nothing reads its rows (cold_gather, cold_h2d) as it pools
                # (Trainer._pool), with the micro-batch's dense step
                if op.args["stage"] == POOL_STAGE or (local and op.args["stage"] >= 4):
                    pools[mb].append(op)  # issued with the micro-batch's dense step
                else:
                    fwd.append((_order_key(plan, op.args["stage"], mi, pi), op))
    fwd.sort(key=lambda x: x[0])
    # as in the executor, a micro-batch's dense step starts once its embeddings are pooled;
    # its bottom MLP reads the dense features only, so it is issued apart: by the executor
    # once the step's exchanges are launched (it fills the wait for the rows), by TorchRec
    # before the lookups (DLRM.forward runs its dense arch before its sparse arch)
    dense_ops = {mb: _dense_fwd(dense, samples, mb, [on.op_name("fwd", pv.name, "pool", mb) for pv in packs], ddt)
                 for mb in mbs}
    bottoms = [op for op in (_bottom_fwd(dense, samples, mb, ddt) for mb in mbs) if op is not None]
    fwd_ops = [op for _, op in fwd]
    ops.extend(bottoms + fwd_ops if tr else fwd_ops + bottoms)

    bwd_by_pack: dict[str, list[str]] = {pv.name: [] for pv in packs}
    grads_by_pack: dict[str, list[str]] = {pv.name: [] for pv in packs}
    buckets: list[str] = []  # TorchRec: DDP's buckets of the dense gradients
    # TorchRec: DDP's buckets, queued with the exchanges on the default process group but beside
    # a table-row-wise plan's, which run on groups of their own (inside the node, across nodes);
    # a picasso plan with grad_bucket_mb: every bucket but the last, on a process group of its own
    if tr:
        layout = grad_buckets(dense)
        bucket_lane = BUCKET_LANE if any(pv.geometry.within_node for pv in packs) else "comm"
    else:
        layout = early_buckets(dense, plan.grad_bucket_mb) if plan.buckets_grads else []
        bucket_lane = BUCKET_LANE
    early: list[str] = []  # picasso: the buckets launched during the backward
    dense_grads: list[str] = []  # picasso: the dense backward ops its one all-reduce waits for
    layered = plan.layered_backward and not tr
    if layered:
        _layered_backward(plan, packs, dense, samples, ddt, mbs, pools, dense_ops, layout, bucket_lane, ops,
                          bwd_by_pack, grads_by_pack, early, dense_grads)
    for mi, mb in enumerate([] if layered else mbs):
        ops.extend(pools[mb])
        head = dense_ops[mb]
        ops.extend(head)
        bwd_head = _dense_bwd_head(dense, samples, mb, head[-1].name, ddt)
        inter_bwd = bwd_head[-1].name
        stage_ops = dict(zip(("top_mlp", "interaction"), bwd_head))
        bottom = _bottom_bwd(dense, samples, mb, inter_bwd, ddt)
        if bottom is not None:
            stage_ops["bottom_mlp"] = bottom
        bucket_ops: list[Op] = []
        for stage, op in stage_ops.items():
            ops.append(op)
            if layout and mi == len(mbs) - 1:  # the dense gradients become final in this backward
                # TorchRec: a bucket the bottom MLP completes is issued after the packs' backward (below)
                launched = _grad_buckets(dense, layout, stage, list(stage_ops), op.name,
                                         bucket_ops if stage == "bottom_mlp" else ops, bucket_lane)
                (buckets if tr else early).extend(launched)
        dense_grads += [stage_ops[s].name for s in ("top_mlp", "bottom_mlp") if s in stage_ops]
        ops.extend(_packs_bwd(plan, packs, mb, mi, inter_bwd, tr, bwd_by_pack, grads_by_pack))
        # issued after the embeddings' gradient exchange: autograd runs the sparse arch's
        # backward (made after the dense arch in the forward) before the bottom MLP's, whose
        # gradients complete the bucket (DDP's 1 MiB first bucket, launched earlier, is left out)
        ops.extend(bucket_ops)

    # once per iteration: gradient all-reduce and optimizer updates. As in P2RES, replicated
    # hot rows are data-parallel parameters: their gradients travel in the dense gradients'
    # all-reduce (one fused buffer, one collective latency instead of one per pack), after the
    # packs' backward. TorchRec's DDP all-reduced the dense gradients already (buckets above);
    # a data-parallel table's whole gradient follows once its backward is done
    sparse_state = UPDATE_PASSES
    grad_sync = on.op_name("bwd", "dense", "allreduce")
    hot_deps = [d for pv in packs if pv.allreduce_bytes for d in bwd_by_pack[pv.name]]
    data_parallel = [pv for pv in packs if not pv.geometry.is_partitioned]
    dp_bytes = sum(float(pv.rows * pv.row_bytes) for pv in data_parallel if tr)
    if dp_bytes:
        hot_deps += [d for pv in data_parallel for d in bwd_by_pack[pv.name]]
    if dp_bytes and bucket_ops:
        # DDP holds the data-parallel tables' weights with the dense ones: their gradients, done
        # in the sparse arch's backward, travel in the bucket the bottom MLP completes
        last = bucket_ops[-1]
        last.collective = (last.collective[0], last.collective[1] + dp_bytes)
        last.deps += hot_deps
        grad_sync, hot_deps, dp_bytes = last.name, [], 0.0
    early_bytes = sum(dense.ops[s].params * 4.0 for _, st in layout for s in st if not tr)
    sync_bytes = (0.0 if tr else float(dense.params * 4) - early_bytes) + sum(float(pv.allreduce_bytes) for pv in packs) + dp_bytes
    # in the executor's order: the replicated packs' gradient gathers and the sparse hot syncs
    # are launched before the all-reduce (one queue), then every cold update runs, then the
    # hot updates, which wait for their sync
    launched: list[Op] = []  # collectives launched before the all-reduce
    updates: list[Op] = []  # cold updates
    hot_updates: list[Op] = []
    hot_syncs: list[Op] = []  # launched after every replica's gather (Trainer.step)
    sync_op = None
    if sync_bytes:
        sync_op = _collective(grad_sync, (buckets if tr else dense_grads) + hot_deps, "all_reduce", sync_bytes)
        if plan.buckets_grads and not tr:  # on a process group of its own (executor: Comm "sync")
            sync_op.lane = SYNC_LANE
        buckets.append(grad_sync)
    for pv in packs:
        passes = sparse_state.get(table_optimizer(plan, plan.model.table(pv.tables[0])), 3)
        if tr:
            # TorchRec's fused backward: the owner merges its rows' gradients (sorted by row)
            # and updates each distinct row once; a data-parallel table is updated whole
            whole = not pv.geometry.is_partitioned  # a data-parallel table is updated whole
            rows = np.full(plan.world_size, float(pv.rows)) if whole else pv.update_rows * k
            deps = [grad_sync] if whole else grads_by_pack[pv.name]
            updates.append(_compute(on.op_name("opt", pv.name, "cold_update"), deps,
                                    hbm=rows * (pv.slice_bytes * passes + pv.state_bytes * 2 + ID_BYTES)
                                    + pv.recv_ids * k * pv.slice_bytes, flops=rows * pv.dim * 3,
                                    ranks=np.nonzero(rows > 0)[0]))
            updates[-1].demand["table_bytes"] = rows * (pv.slice_bytes * 2 + pv.state_bytes * 2)
            continue
        if not pv.geometry.is_partitioned:
            # every replica all-gathers the sparse gradients of all ranks and applies them all
            rows = pv.cold_unique * k * plan.world_size
            # applied at the memory rate (as any other op's hbm bytes), after the gathers
            applied = rows * (pv.row_bytes * passes + pv.state_bytes * 2 + ID_BYTES)
            # as the executor runs it: one all_gather of the rows with their gradients (padded to
            # the largest count, known from the step's sizes exchange; executor.comm)
            launched.append(_collective(on.op_name("opt", pv.name, "cold_update"), grads_by_pack[pv.name], "all_gather",
                                        pv.allgather_bytes(k), fixed_hbm_bytes=applied))
        else:
            rows = pv.recv_ids * k
            touched = rows * (pv.slice_bytes * passes + pv.state_bytes * 2 + ID_BYTES)
            # a pooled pack's owner first expands each bag's gradient to its lookups
            expand = rows * pv.grad_row_bytes * 2 if pv.pooled else 0.0
            # as the executor runs it: staged host-resident rows are updated where they live, in
            # host memory, only their gradients and IDs crossing PCIe (ShardedPack.to_host);
            # mapped ones by the device's kernel, every byte it touches crossing PCIe
            host = pv.placement == "host"
            mapped = host and pv.host_access == HostAccess.MAPPED
            staged = host and not mapped
            grads = rows * (pv.grad_row_bytes * pv.slice_bytes / pv.row_bytes + ID_BYTES) if staged else 0.0
            updates.append(_compute(on.op_name("opt", pv.name, "cold_update"), grads_by_pack[pv.name],
                                    hbm=(0.0 if host else touched) + expand, host=touched if staged else 0.0,
                                    pcie=grads + (touched if mapped else 0.0),
                                    flops=rows * pv.dim * 3, ranks=np.nonzero(rows > 0)[0]))
            if not host:  # the rows it reads and writes back where they live
                updates[-1].demand["table_bytes"] = rows * (pv.slice_bytes * 2 + pv.state_bytes * 2)
        if pv.sparse_hot:
            # the touched hot rows' gradients, all-gathered with their rows in one gather (sizes
            # from the step's one sizes exchange; executor.comm), then applied by every replica
            sync = on.op_name("opt", pv.name, "hot_sync")
            hot_syncs.append(_collective(sync, grads_by_pack[pv.name], "all_gather", pv.hot_sync_bytes(k)))
            rows = pv.hot_unique * k * plan.world_size
            hot_updates.append(_compute(on.op_name("opt", pv.name, "hot_update"), [sync],
                                        hbm=rows * (pv.row_bytes * passes + pv.state_bytes * 2 + ID_BYTES + pv.grad_row_bytes),
                                        flops=rows * pv.dim * 3))
            hot_updates[-1].demand["table_bytes"] = rows * (pv.row_bytes * 2 + pv.state_bytes * 2)
        elif pv.allreduce_bytes:
            rows = pv.hot_rows
            hot_updates.append(_compute(on.op_name("opt", pv.name, "hot_update"), [grad_sync],
                                        hbm=rows * (pv.row_bytes * passes + pv.state_bytes * 2), flops=rows * pv.dim * 3))
    ops.extend(launched + hot_syncs + ([sync_op] if sync_op is not None else []) + updates + hot_updates)
    n_params = dense.params
    states = {"sgd": 3, "adagrad": 5, "adam": 7}.get(plan.optimizer.dense, 3)
    ops.append(_compute(on.op_name("opt", "dense", "update"), buckets + early,
                        hbm=n_params * 4 * states, flops=n_params * 4))
    if plan.pipelines_inputs and not tr:  # TorchRec's exchanges pipeline their input by construction
        pipeline_input_dist(ops, plan.ids_launch_mb)
    # the kernels behind each op: counts, GEMM class, random rows, elementwise passes, sorts, runs
    kernel_passes.apply(ops, model, packs, dense, samples, ACT_BYTES_SCALE[ddt])
    engine_lowering.apply(ops, plan, packs, k, ACT_BYTES_SCALE[ddt])  # the plan's engine (planner.engines)
    if serial and engine_lowering.serial(plan):
        chain = [op for op in ops if not op.args.get("pipelined")]  # pipelined ops stay off the chain
        for a, b in zip(chain, chain[1:]):
            if a.name not in b.deps:
                b.deps.append(a.name)
    return ops


def pipeline_input_dist(ops: list[Op], launch_mb: int) -> None:
    """Lower the input pipeline as the executor runs it (Trainer.step, TorchRec's
    TrainPipelineSparseDist in spirit): the next batch's lookups are deduplicated and routed
    during this step, once its gathers are issued and before its first pooling; their IDs go
    on a lane of their own after micro-batch `launch_mb`'s pooling (Plan.ids_launch_mb) and
    travel beside the step's other work. In the one-step graph the step's own dedup, route
    and ID exchanges (a2a_ids) stand for the next step's:
    they move to those points of the issue order and nothing of the step waits for them;
    what read a moved op waits for what it waited for."""
    piped = {op.name for op in ops
             if op.kind == "collective" and on.split_name(on.base_name(op.name))[2] == "a2a_ids"}
    # every pack's routing goes ahead (Trainer._route covers replicas too): stages 0-1
    ahead = {op.name for op in ops if op.kind == "compute" and op.args.get("stage") in (0, 1)
             and on.split_name(op.name)[0] == "fwd"}
    moved = piped | ahead
    before = {op.name: list(op.deps) for op in ops}

    def outside(name: str) -> list[str]:  # a moved op's nearest ancestors that stay in the step
        return [d for dep in before[name] for d in (outside(dep) if dep in moved else [dep])]

    def inside(name: str) -> list[str]:  # an op's nearest ancestors among the moved ops
        return [d for dep in before[name] for d in ([dep] if dep in moved else inside(dep))]

    pools = [i for i, op in enumerate(ops) if op.args.get("stage") == POOL_STAGE and on.split_name(op.name)[0] == "fwd"]
    launch_pools = [ops[i].name for i in pools if (on.split_name(ops[i].name)[3] or 0) == launch_mb]
    for op in ops:
        if op.name in piped:
            op.deps = list(dict.fromkeys(inside(op.name) + launch_pools))
            op.lane = INPUT_LANE
            op.args["pipelined"] = True
        elif op.name in ahead:  # after the step's gathers by their place on the compute lane
            op.deps = [d for d in before[op.name] if d in ahead]
        elif any(d in moved for d in op.deps):
            deps = [x for d in op.deps for x in (outside(d) if d in moved else [d])]
            op.deps = list(dict.fromkeys(deps))
    first_pool = pools[0] if pools else len(ops)
    after_pools = max((i for i in pools if ops[i].name in launch_pools), default=first_pool - 1) + 1
    head, mid, tail = ops[:first_pool], ops[first_pool:after_pools], ops[after_pools:]
    # the routing goes ahead once the step's gathers are issued, before its bottom MLPs (Trainer.step)
    stay = [op for op in head if op.name not in moved]
    at = next((i for i, op in enumerate(stay) if on.split_name(op.name)[:3] == ("fwd", "dense", "bottom_mlp")), len(stay))
    ops[:] = (stay[:at] + [op for op in head if op.name in ahead] + stay[at:] + mid
              + [op for op in head if op.name in piped] + tail)


# ---- OpGraph emission ----------------------------------------------------------------------


def hot_sync_costs(plan: Plan, pv: PackVolumes, hw: HardwareSpec) -> dict[str, float]:
    """Predicted microseconds per iteration of each way to synchronise a pack's hot-row
    gradients, as build_program lowers them: "dense" adds the hot set's gradient to the dense
    all-reduce (its bandwidth term; the latency is paid by the dense gradients anyway), zeroes
    it each step and updates every hot row; "sparse" all-gathers the touched rows (one
    gather of rows with their values) and applies every rank's rows (`sparse_sync_row_us` each)."""
    from simulator.cost import collective_cost
    from simulator.opgraph import Collective

    w, k = plan.world_size, plan.micro_batches
    if w <= 1 or not pv.hot_rows:
        return {"dense": 0.0, "sparse": 0.0}
    group = tuple(range(w))
    hbm_us = 1e6 / hw.hbm_rate()  # us per byte at the streaming memory rate (the whole hot set)
    passes = _sparse_passes(plan, pv)
    _, ar_bw, _ = collective_cost(Collective("all_reduce", group, pv.hot_rows * pv.grad_row_bytes), hw)
    dense = ar_bw + pv.hot_rows * (pv.row_bytes * passes + pv.state_bytes * 2 + pv.grad_row_bytes) * hbm_us
    lat, _, _ = collective_cost(Collective("all_gather", group, pv.hot_sync_bytes(k)), hw)
    sparse = lat + pv.hot_unique * k * sparse_sync_row_us(plan, pv, hw)
    return {"dense": float(dense), "sparse": float(sparse)}


def _sparse_passes(plan: Plan, pv: PackVolumes) -> int:
    return UPDATE_PASSES.get(plan.model.table(pv.tables[0]).optimizer, 3)


def sparse_sync_row_us(plan: Plan, pv: PackVolumes, hw: HardwareSpec) -> float:
    """Predicted microseconds one hot row touched by one rank in a step adds to a sparse hot
    sync: its gradient and ID in the all-gather (bandwidth term, linear in the bytes) and its
    apply on every rank. The planner sizes a sparsely synchronised hot set with it."""
    from simulator.cost import collective_cost
    from simulator.opgraph import Collective

    w = plan.world_size
    if w <= 1:
        return 0.0
    per_row = pv.grad_row_bytes + ID_BYTES
    n = 1 << 20  # rows in the probe: the latency term is left out, the bandwidth term is linear
    _, ag_bw, _ = collective_cost(Collective("all_gather", tuple(range(w)), n * per_row), hw)
    hbm_us = 1e6 / hw.hbm_rate(RANDOM_KEY)  # the touched rows are scattered
    apply = w * (pv.row_bytes * _sparse_passes(plan, pv) + pv.state_bytes * 2 + ID_BYTES + pv.grad_row_bytes)
    return float(ag_bw / n + apply * hbm_us)


def choose_hot_sync(plan: Plan, hw: HardwareSpec, access: dict[str, TableAccess], samples: float) -> None:
    """Set each pack's hot_sync to the cheaper of the two by `hot_sync_costs`."""
    for pack in plan.packs:
        pack.hot_sync = "dense"
        if plan.world_size > 1 and any(plan.hot_rows.get(t, 0) for t in pack.tables):
            pv = pack_volumes(plan, pack, access, samples, hw.gpus_per_node)
            c = hot_sync_costs(plan, pv, hw)
            pack.hot_sync = "sparse" if c["sparse"] < c["dense"] else "dense"


def _at(v: Any, rank: int | None) -> float:
    """Value of a demand for one rank (None: the maximum over ranks)."""
    if isinstance(v, np.ndarray):
        return float(v.max() if rank is None else v[rank])
    return float(v)


def _group(scope: str | None, rank: int, world: int, g: int) -> tuple[int, ...] | None:
    """Ranks of a sub-group collective: the rank's node, or its peers of equal local index."""
    if scope == "node":
        return tuple(range(rank // g * g, min(rank // g * g + g, world)))
    if scope == "peers":
        return tuple(range(rank % g, world, g))
    return None


def emit_graph(ops: list[Op], world: int, symmetric: bool, gpus_per_node: int | None = None) -> Any:
    """Turn the per-rank program into simulator OpGraph nodes."""
    gpus_per_node = gpus_per_node or world
    from simulator.opgraph import Collective, OpGraph

    graph = OpGraph(world, symmetric=symmetric)
    group = tuple(range(world))
    ranks = [0] if symmetric else list(range(world))
    classes = [on.op_class(op.name) for op in ops]  # whose calibrated coefficients the cost model applies
    for rank in ranks:
        ids: dict[str, list[int]] = {}
        for op, cls in zip(ops, classes):
            late = [name for name in op.deps if name not in ids]
            if late:  # a program is in issue order: a dependency issued later is a lowering bug
                raise ValueError(f"lowering: {op.name} depends on {late[0]}, which is issued after it")
            deps = [d for name in op.deps for d in ids[name]]
            if op.ranks is not None and not symmetric and rank not in op.ranks:
                ids[op.name] = deps  # skipped here: pass its dependencies through
                continue
            if op.ranks is not None and symmetric and len(op.ranks) == 0:
                ids[op.name] = deps
                continue
            where = None if symmetric else rank
            kw: dict[str, Any] = {k: _at(v, where) for k, v in op.demand.items()}
            if op.collective is not None:
                # the parts of a collective must agree on bytes, and it ends with its slowest
                # rank: every rank carries the largest buffer
                ctype, nbytes = op.collective
                kw["collective"] = Collective(ctype, _group(op.group, rank, world, gpus_per_node) or group,
                                              _at(nbytes, None), op.algorithm)
            args = {k: v for k, v in op.args.items() if k not in ("stage", "pipelined") and v is not None}
            args["cls"] = cls
            node = graph.add_op(op.name, rank, op.lane, kind=op.kind, dtype=op.dtype,
                                deps=tuple(dict.fromkeys(deps)), **kw, **args)
            ids[op.name] = [node]
    return graph
