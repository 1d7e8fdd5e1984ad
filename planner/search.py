"""Plan search: packing groups, sharding per pack, hot-set sizes, micro-batches, interleaving.

Entry point: `search(model, hw, profile=None, batch_size_per_rank=4096, ...) -> SearchResult`.

1. Packing: tables are grouped by packing attributes; in each group the tables whose
   full replication costs less than exchanging their rows go to one replicated pack, the
   rest are split into 1, 2 or 4 row-wise packs balanced by exchange cost (several packs
   give kernel interleaving something to overlap).
2. Hot sets (P2RES): a row is worth replicating when the all-to-all bytes it would cost as
   a cold row exceed the all-reduce bytes of its gradient as a hot row. For a row with
   per-lookup probability p, present in a rank's micro-batch with probability
   q = 1-(1-p)^L, cold it moves k*q*(8 + 2*row_bytes) bytes per iteration (ID, row, grad;
   k micro-batches) at the all-to-all's cost per byte; hot it moves row_bytes in the
   gradient all-reduce at its cost per byte. The threshold q* = row_bytes*c_ar /
   (k*(8+2*row_bytes)*c_a2a) gives p* and the hot size per table is the number of rows
   above p*; the sizes are then scaled (x0 .. x4) and the best scale kept by simulation.
3. Micro-batches (1, 2, 4, 8, 16 dividing the batch) and kernel interleaving on/off.
   The plans the systems users compare with run (planner.peers: NVIDIA's DLRM, HugeCTR's
   hybrid embedding) join as candidates on picasso's engine and are always re-simulated at
   the end, so the search never returns a plan predicted slower than a peer's.
4. Per pack, column-wise, table-wise and replicated are tried in place of row-wise, and
   host placement when device memory runs out.
5. Per pack, the exchange: rows (deduplicated, pooled by the requester) or pooled at the
   owner, whichever planner.exchange.exchange_costs predicts cheaper for every candidate,
   then the other one tried by simulation for the best plan's packs. Tables that alone would
   exchange cheaper pooled (long bags) are also packed apart from the others (layouts "+pool").
6. The dense gradients' buckets: DDP's 25 MiB, then smaller caps (BUCKET_CAPS_MB) that send
   part of a small dense model's gradients during the backward (planner.grad_buckets).
7. With several micro-batches and buckets sent during the backward: the backward layer by
   layer over the micro-batches (Plan.backward_by_layer), so the top MLP's buckets go while
   the interaction's backward runs, with each bucket cap again.
8. With the input pipeline and several micro-batches: the next step's IDs sent after the
   first or middle micro-batch's pooling instead of the last (Plan.ids_after_mb).
Every candidate is lowered and scored with the fast evaluator on a one-rank symmetric graph;
the best few are re-simulated with the simpy engine and the best of those is returned.

In code the search is named stages over one state (`Candidates`): enumerate_layouts (1, 3),
then STAGES: structure_stage (1-3 with closed-form hot sizes), peer_stage (3's peers), hot_scale_stage (2's scale),
fused_pooled_stage (several nodes: planner.pooled_twrw's fused pooled exchange), sharding_stage (4), table_row_wise_stage (4, several nodes), exchange_stage (5), bucket_stage (6),
layer_stage (7), ids_stage (8), and final_stage (the discrete-event re-simulation).
Candidates are visited in a fixed order and ties broken by label: same inputs, same plan.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from planner.access import TableAccess, table_access
from planner.dense import DenseCost, dense_cost
from planner.errors import PlanError
from planner.exchange import a2a_line, choose_exchange, exchange_costs, poolable
from planner.geometry import geometry_kind
from planner.grad_buckets import DDP_BUCKET_CAP_MB, early_buckets
from planner.lowering import SYMMETRIC_ABOVE, Lowered, choose_hot_sync, lower
from planner.model_spec import ModelSpec, TableSpec, attribute_groups
from planner.modes import Exchange, HotSync, Placement, PlanExchange
from planner.plan import PackPlan, Plan, Prediction, Provenance, model_optimizer, wire_id_bytes
from planner.sharding import Sharding
from planner.volumes import table_cost
from traces.coverage import presence_threshold

if TYPE_CHECKING:  # types only: the seams' own classes, not loaded at import
    from simulator.hardware import HardwareSpec
    from traces.profile import AccessProfile


MICRO_BATCHES = (1, 2, 4, 8, 16)
BUCKET_CAPS_MB = (4.0, 1.0)  # tried after DDP's 25 MiB (bucket_stage)
SPLITS = (1, 2, 4)
HOT_SCALES = (0.0, 0.25, 0.5, 2.0, 4.0)
REFINE_TOP = 3  # stage-1 structures whose hot-set size is refined
FINAL_TOP = 10  # candidates re-simulated by the discrete-event engine (and given smaller buckets first)
HOT_MEMORY_SHARE = 0.5  # at most this share of the free device memory goes to hot caches
MAX_EXTRA_REPLICATED = 4  # fused pooled layouts with 1..4 more tables out of the group (fused_pooled_stage)


@dataclass
class Evaluation:
    """A plan with its predicted iteration time (None when it does not fit) and lowering."""

    label: str
    plan: Plan
    iteration_us: float | None
    engine: str
    lowered: Lowered | None = None
    result: Any = None  # simulator SimResult
    problem: str | None = None
    graph: Any = None  # the simulated OpGraph (as lowered)


@dataclass
class SearchResult:
    plan: Plan
    hot_ids: dict[str, np.ndarray]
    best: Evaluation  # simulated with the simpy engine
    candidates: list[Evaluation] = field(default_factory=list)  # every candidate scored (fast)
    elapsed_s: float = 0.0

    def log(self) -> list[dict[str, Any]]:
        return [{"label": e.label, "engine": e.engine, "iteration_us": e.iteration_us, "problem": e.problem}
                for e in self.candidates]


# ---- scoring -----------------------------------------------------------------------------


def evaluate(plan: Plan, hw: HardwareSpec, access: dict[str, TableAccess], engine: str = "fast",
             symmetric: bool | None = True, label: str = "", check_memory: bool = True,
             fuse_table_wise: bool = False) -> Evaluation:
    """Lower and simulate `plan`; a plan that does not fit gets iteration_us None and the reason.

    The one prediction path (plan, simulate, validate, demo): a spec calibrated on this
    machine (`picasso calibrate`, refined by `picasso validate`) first becomes the spec of the
    plan's world size, whose cost model applies its per-op-class coefficients to the lowered ops."""
    from simulator.calibration import calibrated_worlds, spec_for_world
    from simulator.engine import simulate

    spec = spec_for_world(hw, plan.world_size) if calibrated_worlds(hw) else hw
    try:
        lowered = lower(plan, spec, access=access, symmetric=symmetric, check_memory=check_memory,
                        fuse_table_wise=fuse_table_wise)
    except PlanError as exc:
        return Evaluation(label, plan, None, engine, problem=str(exc))
    graph = lowered.graph
    result = simulate(graph, spec, engine=engine)
    if not math.isfinite(result.iteration_us):  # a figure past every range check still must not print inf
        raise PlanError(f"hardware {hw.name}: predicts a step of {result.iteration_us} us for {label or 'the plan'}; "
                        "check its bandwidths and rates")
    return Evaluation(label, plan, float(result.iteration_us), engine, lowered, result, graph=graph)


def full_symmetry(plan: Plan) -> bool | None:
    """Graph shape for a final simulation: every rank when small, one representative when large."""
    return None if plan.world_size <= SYMMETRIC_ABOVE else True


# ---- cost per byte of the two exchange paths ----------------------------------------------


def byte_costs(hw: HardwareSpec, world: int) -> tuple[float, float]:
    """(us per byte of all-to-all buffer, us per byte of all-reduce buffer) over all ranks."""
    from simulator.cost import collective_cost
    from simulator.opgraph import Collective

    if world <= 1:
        return 1.0, 1.0
    group = tuple(range(world))
    n = 64e6  # large enough that latency terms vanish
    _, a2a, _ = collective_cost(Collective("all_to_all", group, n), hw)
    _, ar, _ = collective_cost(Collective("all_reduce", group, n), hw)
    return a2a / n, ar / n


def hot_threshold_rows(t: TableSpec, acc: TableAccess, samples_per_mb: float, micro_batches: int,
                       c_a2a: float, c_ar: float, c_gather: float = 0.0, sparse_row_us: float | None = None) -> int:
    """Closed-form P2RES hot-set size of one table (rows worth replicating).

    c_gather: us per byte of the owner's read of a cold row (PCIe when cold rows live in
    host memory), added to the exchange a hot row saves. `sparse_row_us`: the pack syncs its
    hot rows sparsely (planner.lowering.sparse_sync_row_us): a hot row then costs that in the
    steps that touch it, instead of its gradient in the all-reduce every step
    (`sparse_presence_threshold`).
    """
    rb = t.bytes_per_row
    cold = (wire_id_bytes(t.num_rows) + 2 * rb) * c_a2a + rb * c_gather  # a cold row, per micro-batch it is in
    if sparse_row_us is None:
        theta = rb * c_ar / (micro_batches * cold)
    else:
        theta = sparse_presence_threshold(sparse_row_us / cold, micro_batches)
    if theta >= 1.0:
        return 0
    lookups = max(samples_per_mb * acc.pooling, 1.0)
    p_min = presence_threshold(theta, lookups) if theta > 0 else 0.0
    return int(min(acc.rows_above(p_min), t.num_rows))


def sparse_presence_threshold(ratio: float, micro_batches: int) -> float:
    """The presence per micro-batch q* above which a sparsely synchronised hot row pays off,
    `ratio` = its sync cost per step touched / a cold row's cost per micro-batch present.
    Cold, a row costs k q of those; hot, 1-(1-q)^k steps touched of these. k q / (1-(1-q)^k)
    grows from 1 (rare rows) to k (rows in every micro-batch), so: ratio <= 1, every row
    (0.0); ratio >= k, none (1.0); else the q where the two meet."""
    k = max(int(micro_batches), 1)
    if ratio <= 1.0:
        return 0.0
    if ratio >= k:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        q = (lo + hi) / 2
        if k * q / -math.expm1(k * math.log1p(-q)) < ratio:
            lo = q
        else:
            hi = q
    return hi


def hot_sizes(model: ModelSpec, tables: list[str], access: dict[str, TableAccess], batch: int, k: int,
              c_a2a: float, c_ar: float, scale: float, budget_bytes: float,
              c_gather: dict[str, float] | None = None, sparse_row_us: dict[str, float] | None = None
              ) -> dict[str, int]:
    """Hot rows per table at `scale` times the closed-form size, within `budget_bytes`
    (`sparse_row_us`: per table whose pack syncs sparsely, hot_threshold_rows')."""
    sizes = {}
    c_gather = c_gather or {}
    sparse_row_us = sparse_row_us or {}
    for name in tables:
        t = model.table(name)
        n = hot_threshold_rows(t, access[name], batch / k, k, c_a2a, c_ar, c_gather.get(name, 0.0),
                               sparse_row_us.get(name))
        n = min(int(round(n * scale)), t.num_rows)
        if n > 0:
            sizes[name] = n
    return within_budget(model, sizes, budget_bytes)


def within_budget(model: ModelSpec, sizes: dict[str, int], budget_bytes: float) -> dict[str, int]:
    """Hot sizes shrunk alike until their caches fit in `budget_bytes`."""
    used = sum(sizes[n] * _hot_row_bytes(model.table(n)) for n in sizes)
    if used > budget_bytes > 0:
        shrink = budget_bytes / used
        sizes = {n: int(v * shrink) for n, v in sizes.items() if int(v * shrink) > 0}
    return sizes


def _hot_row_bytes(t: TableSpec) -> int:
    return 2 * t.bytes_per_row + t.state_bytes


def _small_enough_to_replicate(t: TableSpec, hbm: float) -> bool:
    """A whole replica (weights, gradient, state) takes under 1% of a device's memory."""
    return t.num_rows * _hot_row_bytes(t) < 0.01 * hbm


def size_for_sparse_sync(plan: Plan, hw: HardwareSpec, access: dict[str, TableAccess], scale: float, budget: float,
                         c_a2a: float, c_ar: float, c_gather: dict[str, float]) -> None:
    """Re-size the hot sets of the packs that sync them sparsely (`plan.hot_rows` holds the
    sizes a dense all-reduce justifies, hot_sync the cheaper sync for them): under a sparse
    sync a hot row costs its share of the all-gather and the apply in the steps that touch it
    (planner.lowering.sparse_sync_row_us), not its gradient in every step's all-reduce, so
    hot_threshold_rows sizes it with that cost. A pack left with no hot row syncs nothing."""
    from planner.lowering import sparse_sync_row_us
    from planner.volumes import pack_volumes

    sparse = [p for p in plan.packs if p.hot_sync == HotSync.SPARSE]
    if not sparse:
        return
    k, batch = plan.micro_batches, plan.batch_size_per_rank
    sizes = {t: n for t, n in plan.hot_rows.items() if not any(t in p.tables for p in sparse)}
    for pack in sparse:
        pv = pack_volumes(replace(plan, hot_rows={}), pack, access, batch / k, hw.gpus_per_node)
        row_us = sparse_sync_row_us(plan, pv, hw)
        sized = hot_sizes(plan.model, list(pack.tables), access, batch, k, c_a2a, c_ar, scale, 0.0, c_gather,
                          dict.fromkeys(pack.tables, row_us))
        sizes.update(sized)
        if not sized:
            pack.hot_sync = HotSync.DENSE
    plan.hot_rows = within_budget(plan.model, sizes, budget)


# ---- packing ------------------------------------------------------------------------------


def replication_worthwhile(t: TableSpec, acc: TableAccess, batch: int, world: int, c_a2a: float, c_ar: float,
                           hbm: float) -> bool:
    """Replicating the whole table costs less than exchanging its rows, and it is small."""
    if world <= 1:
        return False
    ar_us = t.num_rows * t.bytes_per_row * c_ar
    a2a_us = acc.distinct(batch * acc.pooling) * (wire_id_bytes(t.num_rows) + 2 * t.bytes_per_row) * c_a2a
    return ar_us < a2a_us and _small_enough_to_replicate(t, hbm)


def balanced_split(tables: list[TableSpec], costs: dict[str, float], parts: int) -> list[list[str]]:
    """Split tables into `parts` groups of similar cost (greedy, deterministic), model order kept inside."""
    parts = max(1, min(parts, len(tables)))
    load = [0.0] * parts
    bins: list[list[str]] = [[] for _ in range(parts)]
    for t in sorted(tables, key=lambda t: (-costs[t.name], t.name)):
        i = min(range(parts), key=lambda i: (load[i], i))
        load[i] += costs[t.name]
        bins[i].append(t.name)
    order = {t.name: i for i, t in enumerate(tables)}
    return [sorted(b, key=order.__getitem__) for b in bins if b]


def pooled_tables(model: ModelSpec, access: dict[str, TableAccess], hw: HardwareSpec, batch: int) -> set[str]:
    """Tables that, alone in a row-wise pack, would exchange cheaper as pooled vectors than as
    rows (planner.exchange.exchange_costs): long bags of wide rows."""
    out: set[str] = set()
    if hw.world_size <= 1:
        return out
    line = a2a_line(hw, hw.world_size)
    for t in model.tables:
        probe = Plan(model, hw.world_size, batch, [PackPlan("probe", [t.name], Sharding.ROW_WISE)])
        if poolable(probe, probe.packs[0]):
            c = exchange_costs(probe, probe.packs[0], hw, access, batch, line)
            if c["pooled"] < c["rows"]:
                out.add(t.name)
    return out


def pack_layout(model: ModelSpec, access: dict[str, TableAccess], world: int, batch: int, split: int,
                replicate_small: bool, c_a2a: float, c_ar: float, hbm: float,
                pooled: set[str] | None = None) -> list[PackPlan]:
    """Packs per attribute group: small tables replicated (when worthwhile), the rest split
    into `split` row-wise packs; with `pooled`, those tables are packed apart from the others
    (so that one pack can exchange pooled vectors and the other rows)."""
    packs: list[PackPlan] = []
    for group in attribute_groups(model):
        costs = {t.name: table_cost(t, access[t.name], world, batch) for t in group}
        rep = [t for t in group if replicate_small and
               replication_worthwhile(t, access[t.name], batch, world, c_a2a, c_ar, hbm)]
        rest = [t for t in group if t not in rep]
        if rep:
            packs.append(PackPlan("", [t.name for t in rep], Sharding.REPLICATED))
        parts = [rest]
        if pooled:
            parts = [[t for t in rest if t.name in pooled], [t for t in rest if t.name not in pooled]]
        for part in parts:
            for names in balanced_split(part, costs, split) if part else []:
                packs.append(PackPlan("", names, Sharding.ROW_WISE))
    for i, p in enumerate(packs):
        p.name = f"pack{i}"
    return packs


# ---- the search: its state, then its named stages ------------------------------------------


@dataclass
class Layout:
    """A packing of the tables (stage "enumerate"): a signature, a label and the packs."""

    signature: tuple
    label: str
    packs: list[PackPlan]


class Candidates:
    """The search's state as it goes through the stages: every candidate scored (memoised by
    the plan's key, in visiting order), the best so far, the time budget and the progress.

    `make` is the one way a candidate is built from packs: placement when device memory
    runs out, hot sizes, exchange and hot-row sync by cost (the closed-form rules above)."""

    def __init__(self, model: ModelSpec, hw: HardwareSpec, access: dict[str, TableAccess], batch: int,
                 time_budget_s: float, progress: Callable[[float, float], None] | None) -> None:
        self.t0 = time.perf_counter()
        self.model, self.hw, self.access, self.batch = model, hw, access, batch
        self.world = hw.world_size
        self.time_budget_s, self.progress = time_budget_s, progress
        self.c_a2a, self.c_ar = byte_costs(hw, self.world)
        self.hbm = float(hw.gpu.hbm_bytes)
        self.seen: dict[str, Evaluation] = {}
        self.log: list[Evaluation] = []
        self.ex_memo: dict = {}  # exchange costs of packs already seen (planner.exchange.choose_exchange)
        self.best: Evaluation | None = None
        self.layouts: list[Layout] = []
        self.seeds: list[Evaluation] = []  # the plans peers run (peer_stage): always re-simulated at the end
        self.ks: list[int] = []
        self.done, self.steps = 0, 1

    def over_budget(self) -> bool:
        return time.perf_counter() - self.t0 > self.time_budget_s

    def score(self, label: str, plan: Plan) -> Evaluation:
        key = _plan_key(plan)
        if key not in self.seen:
            ev = evaluate(plan, self.hw, self.access, "fast", True, label)
            self.seen[key] = ev
            self.log.append(ev)
        return self.seen[key]

    def consider(self, label: str, plan: Plan) -> Evaluation:
        """Score a candidate and keep it when it beats the best so far."""
        ev = self.score(label, plan)
        if _better(self.best, ev):
            self.best = ev
        return ev

    def tick(self) -> None:
        self.done += 1
        if self.progress:
            self.progress(self.done, self.steps)

    def ranked(self) -> list[Evaluation]:
        return sorted((e for e in self.log if e.iteration_us is not None), key=lambda e: (e.iteration_us, e.label))

    def make(self, packs: list[PackPlan], k: int, ki: bool, scale: float) -> Plan:
        model, hw, access, batch = self.model, self.hw, self.access, self.batch
        plan = Plan(model=model, world_size=self.world, batch_size_per_rank=batch, packs=[replace(p) for p in packs],
                    micro_batches=k, kernel_interleaving=ki, hardware=hw.name, optimizer=model_optimizer(model),
                    input_pipeline=self.world > 1,  # the next batch's IDs travel during this step
                    # the dense gradients leave in buckets during the backward, as DDP's do
                    grad_bucket_mb=DDP_BUCKET_CAP_MB if self.world > 1 else 0.0)
        # memory left for hot caches once everything else is placed; cold rows that do not
        # fit in device memory go to host memory (reached over PCIe), largest packs first
        free = _free_hbm(plan, hw, access)
        if free <= 0:
            for p in sorted((p for p in plan.packs if p.sharding.exchanges),
                            key=lambda p: (-plan.pack_rows(p) * model.table(p.tables[0]).bytes_per_row, p.name)):
                p.placement = Placement.HOST
                free = _free_hbm(plan, hw, access)
                if free > 0:
                    break
        cold = [t for p in plan.packs if p.sharding.exchanges for t in p.tables]
        c_gather = {t: (2e6 / hw.gpu.hbm_bw if p.placement == Placement.HBM else 1e6 / hw.pcie_bw)
                    for p in plan.packs for t in p.tables}
        budget = HOT_MEMORY_SHARE * free
        plan.hot_rows = hot_sizes(model, cold, access, batch, k, self.c_a2a, self.c_ar, scale, budget, c_gather)
        choose_exchange(plan, hw, access, batch / k, self.ex_memo)  # rows or pooled vectors, per pack by cost
        choose_hot_sync(plan, hw, access, batch / k)  # dense all-reduce or sparse all-gather, by cost
        size_for_sparse_sync(plan, hw, access, scale, budget, self.c_a2a, self.c_ar, c_gather)
        return plan


def _better(a: Evaluation | None, b: Evaluation) -> bool:
    return b.iteration_us is not None and (a is None or a.iteration_us is None or b.iteration_us < a.iteration_us)


def enumerate_layouts(c: Candidates, micro_batch_options: tuple[int, ...]) -> None:
    """Enumerate: the packings (data parallel per attribute group, and per split count with
    and without replicated small tables, with and without long-bag tables packed apart) and
    the micro-batch counts that divide the batch."""
    model, world, batch = c.model, c.world, c.batch
    c.ks = [k for k in micro_batch_options if batch % k == 0 and batch // k >= 1] or [1]
    if world > 1:
        c.layouts.append(Layout((), "dp", [PackPlan(f"pack{i}", [t.name for t in g], Sharding.REPLICATED)
                                           for i, g in enumerate(attribute_groups(model))]))
    pooled = pooled_tables(model, c.access, c.hw, batch)
    for split in SPLITS:
        for rep in (True, False):
            for pool in ((None, pooled) if pooled else (None,)):
                packs = pack_layout(model, c.access, world, batch, split, rep, c.c_a2a, c.c_ar, c.hbm, pool)
                sig = tuple((p.sharding, tuple(p.tables)) for p in packs)
                if sig not in [lay.signature for lay in c.layouts]:
                    c.layouts.append(Layout(sig, f"split{split}{'+rep' if rep else ''}{'+pool' if pool else ''}", packs))
    c.steps = len(c.layouts) * len(c.ks) * 2 + REFINE_TOP * len(HOT_SCALES) + 10


def structure_stage(c: Candidates) -> None:
    """Packing layout x interleaving x micro-batches, closed-form hot sizes. The micro-batch
    count is walked upwards and left once a larger count stops paying off (more micro-batches
    trade launch and latency overhead for overlap: one optimum)."""
    for lay in c.layouts:
        for ki in (False, True):
            prev: Evaluation | None = None
            for k in c.ks:
                if c.over_budget() and c.best is not None:
                    break
                ev = c.consider(f"{lay.label} k={k} ki={int(ki)} hot=x1", c.make(lay.packs, k, ki, 1.0))
                c.tick()
                if prev is not None and prev.iteration_us is not None and not _better(prev, ev):
                    break
                prev = ev
    if c.best is None:
        raise PlanError(next((e.problem for e in c.log if e.problem and "host" in e.problem), None)
                        or next((e.problem for e in reversed(c.log) if e.problem), "no plan fits in memory"))


def peer_stage(c: Candidates) -> None:
    """The plans the systems users compare with run (planner.peers), as candidates on picasso's own
    engine: the search never returns a plan predicted slower than a peer's plan, hybrid
    embedding's replicated frequent rows included; later stages refine them like any other."""
    from planner.peers import PEERS, peer_plan

    for name in PEERS:
        try:
            plan = peer_plan(name, c.model, c.world, c.batch, c.hw, c.access)
        except PlanError:
            continue
        plan.provenance = Provenance(baseline=name)  # its plan, not its engine
        plan.hot_rows = within_budget(c.model, plan.hot_rows, HOT_MEMORY_SHARE * max(_free_hbm(plan, c.hw, c.access), 0))
        plan.hot_ids_file = "hot.npz" if plan.hot_rows else None
        ev = c.consider(f"peer:{name}", plan)
        if ev.iteration_us is not None:
            c.seeds.append(ev)
        c.tick()


def hot_scale_stage(c: Candidates) -> None:
    """The hot-set scale, refined by simulation for the best few structures so far (the best
    hot size depends on the micro-batch count and the packing)."""
    for top in c.ranked()[:REFINE_TOP]:
        base_label = top.label.rsplit(" hot=", 1)[0]
        for s in HOT_SCALES:
            if c.over_budget():
                break
            c.consider(f"{base_label} hot=x{s:g}",
                       c.make(top.plan.packs, top.plan.micro_batches, top.plan.kernel_interleaving, s))
            c.tick()


def fused_pooled_stage(c: Candidates) -> None:
    """On several nodes, TorchRec's structure (small tables data parallel, the others
    table-row-wise, one pack per node) with picasso's fused, hierarchical pooled exchange,
    hot rows and micro-batch interleaving (planner.pooled_twrw)."""
    layouts = _fused_pooled_layouts(c.model, c.access, c.hw, c.batch, c.c_a2a, c.c_ar, c.hbm)
    if not layouts:
        return
    best: tuple[float, tuple] | None = None
    for ki in (False, True):
        for k in c.ks:
            for s in (0.0, 0.5, 1.0):
                for dp in (True, False):
                    if c.over_budget() or (k == 1 and not ki):  # the fused exchange needs overlap
                        continue
                    ev = c.consider(f"fused-pooled{'+dp' if dp else ''} k={k} ki={int(ki)} hot=x{s:g}",
                                    _as_fused_pooled(c.make(layouts[0][1], k, ki, s), dp))
                    if ev.iteration_us is not None and (best is None or ev.iteration_us < best[0]):
                        best = (ev.iteration_us, (k, ki, s, dp))
    if best is None:
        return
    k, ki, s, dp = best[1]
    for tag, packs in layouts[1:]:  # tables out of the group, at the best settings
        if not c.over_budget():
            c.consider(f"fused-pooled{'+dp' if dp else ''} k={k} ki={int(ki)} hot=x{s:g} {tag}",
                       _as_fused_pooled(c.make(packs, k, ki, s), dp))


def sharding_stage(c: Candidates) -> None:
    """Per pack of the best plan, column-wise, table-wise, replicated and row-wise in its place."""
    for i in range(len(c.best.plan.packs)):
        for sharding in (Sharding.COLUMN_WISE, Sharding.TABLE_WISE, Sharding.REPLICATED, Sharding.ROW_WISE):
            if c.over_budget():
                break
            cur = c.best.plan
            pack = cur.packs[i]
            # a fully hot pack exchanges nothing: its sharding only places an unread cold shard
            if pack.sharding == sharding or cur.fully_hot(pack) or not _sharding_ok(cur, pack, sharding):
                continue
            plan = _with_pack(cur, i, sharding, c.access, c.batch)
            choose_exchange(plan, c.hw, c.access, c.batch / plan.micro_batches, c.ex_memo)
            c.consider(f"{c.best.label} {pack.name}={sharding}", plan)


def table_row_wise_stage(c: Candidates) -> None:
    """On several nodes, each row-wise pack as table-row-wise packs, one per node (its tables
    split by exchange cost): rows exchanged within a node's ranks, each table's owners on one node."""
    hw = c.hw
    if hw.nodes <= 1 or hw.gpus_per_node <= 1:
        return
    for i, pack in enumerate(list(c.best.plan.packs)):
        if pack.sharding != Sharding.ROW_WISE or c.over_budget():
            continue
        plan = _as_table_row_wise(c.best.plan, i, hw.gpus_per_node, c.access, c.batch)
        choose_exchange(plan, hw, c.access, c.batch / plan.micro_batches, c.ex_memo)
        c.consider(f"{c.best.label} {pack.name}=table_row_wise", plan)


def exchange_stage(c: Candidates) -> None:
    """The closed-form exchange choice checked by simulation, pack by pack."""
    for i, pack in enumerate(list(c.best.plan.packs)):
        if c.over_budget() or not poolable(c.best.plan, pack):
            continue
        flip = Exchange.ROWS if pack.exchange == Exchange.POOLED else Exchange.POOLED
        packs = [replace(p) for p in c.best.plan.packs]
        packs[i].exchange = flip
        c.consider(f"{c.best.label} {pack.name}:{flip}", replace(c.best.plan, packs=packs))


def bucket_stage(c: Candidates) -> None:
    """Smaller gradient buckets than DDP's 25 MiB for the best few candidates, checked by
    simulation: a dense part under the cap is one bucket, all-reduced after the backward; a
    smaller cap sends its top MLP's gradients during the rest of the backward
    (planner.grad_buckets)."""
    if c.world <= 1:
        return
    dense = dense_cost(c.model)
    for ev in c.ranked()[:FINAL_TOP]:
        for cap in _distinct_caps(dense, (ev.plan.grad_bucket_mb, *BUCKET_CAPS_MB))[1:]:
            if c.over_budget():
                return
            c.consider(f"{ev.label} buckets={cap:g}MiB", replace(ev.plan, grad_bucket_mb=cap))


def _distinct_caps(dense: DenseCost, caps: tuple[float, ...]) -> list[float]:
    """The bucket caps, in order, that each give another bucket layout than those before."""
    seen, out = set(), []
    for cap in caps:
        layout = tuple(early_buckets(dense, cap))
        if layout not in seen:
            seen.add(layout)
            out.append(cap)
    return out


def layer_stage(c: Candidates) -> None:
    """For the best few candidates with several micro-batches, the backward layer by layer
    over them (Plan.backward_by_layer), checked by simulation with each bucket cap: without
    buckets sent during the backward it changes nothing worth its held activations."""
    if c.world <= 1:
        return
    dense = dense_cost(c.model)
    for ev in c.ranked()[:FINAL_TOP]:
        if ev.plan.micro_batches == 1 or ev.plan.backward_by_layer:
            continue
        for cap in _distinct_caps(dense, (ev.plan.grad_bucket_mb, DDP_BUCKET_CAP_MB, *BUCKET_CAPS_MB)):
            if c.over_budget():
                return
            label = ev.label + " by-layer" + ("" if cap == ev.plan.grad_bucket_mb else f" buckets={cap:g}MiB")
            c.consider(label, replace(ev.plan, backward_by_layer=True, grad_bucket_mb=cap))


def ids_stage(c: Candidates) -> None:
    """For the best few candidates with the input pipeline and several micro-batches, the next
    step's IDs sent after the first (or middle) micro-batch's pooling instead of the last
    (Plan.ids_after_mb), checked by simulation: early, they share the links with the step's
    forward exchanges; late, with its backward ones and the all-reduce."""
    for ev in c.ranked()[:FINAL_TOP]:
        k = ev.plan.micro_batches
        if not ev.plan.pipelines_inputs or k == 1 or ev.plan.ids_after_mb is not None:
            continue
        for mb in sorted({0, k // 2} - {k - 1}):
            if c.over_budget():
                return
            c.consider(f"{ev.label} ids@mb{mb}", replace(ev.plan, ids_after_mb=mb))


def final_stage(c: Candidates, top_k: int) -> Evaluation:
    """The best few re-simulated with the discrete-event engine; the best of those.

    Plans that differ only in their step's schedule (buckets, the IDs' launch point, the
    backward's order) count as one of the few, so that variants of one plan do not crowd out
    the others; of each, the best of either backward order is re-simulated: with three flows
    or more on a link the fast evaluator approximates their shares and ranks the two either way."""
    groups: dict[str, dict[bool, Evaluation]] = {}
    for ev in c.ranked():
        p = ev.plan
        key = _plan_key(replace(p, backward_by_layer=False, ids_after_mb=None, grad_bucket_mb=0.0))
        groups.setdefault(key, {}).setdefault(p.backward_by_layer, ev)
    few = list(groups.values())[: max(1, top_k if not c.over_budget() else 1)]
    chosen = [ev for group in few for ev in group.values()]
    chosen += [ev for ev in c.seeds if all(ev is not x for x in chosen)]  # a peer's plan is always among them
    finals = [evaluate(ev.plan, c.hw, c.access, "simpy", full_symmetry(ev.plan), ev.label) for ev in chosen]
    finals = [f for f in finals if f.iteration_us is not None] or finals
    return min(finals, key=lambda e: (e.iteration_us if e.iteration_us is not None else math.inf, e.label))


# the stages after enumeration, in order (each improves on `Candidates.best`)
STAGES: tuple[Callable[[Candidates], None], ...] = (structure_stage, peer_stage, hot_scale_stage, fused_pooled_stage,
                                                     sharding_stage, table_row_wise_stage, exchange_stage,
                                                     bucket_stage, layer_stage, ids_stage)


def search(
    model: ModelSpec,
    hw: HardwareSpec,
    profile: AccessProfile | None = None,
    batch_size_per_rank: int = 4096,
    *,
    access: dict[str, TableAccess] | None = None,
    time_budget_s: float = 20.0,
    top_k: int = FINAL_TOP,
    micro_batch_options: tuple[int, ...] = MICRO_BATCHES,
    progress: Callable[[float, float], None] | None = None,
) -> SearchResult:
    """The best plan found for `model` on `hw` within `time_budget_s` (see module docstring):
    enumerate_layouts, then STAGES, then final_stage."""
    access = access if access is not None else table_access(model, profile)
    c = Candidates(model, hw, access, int(batch_size_per_rank), time_budget_s, progress)
    enumerate_layouts(c, micro_batch_options)
    for stage in STAGES:
        stage(c)
    if progress:
        progress(c.steps, c.steps)
    chosen = final_stage(c, top_k)
    plan = chosen.plan
    hot_ids = {t: access[t].hot_rows(n) for t, n in sorted(plan.hot_rows.items()) if n > 0}
    plan.hot_rows = {t: len(v) for t, v in hot_ids.items()}
    # Plan.save(path, hot_ids=result.hot_ids) names the real file; until then a placeholder
    plan.hot_ids_file = "hot.npz" if plan.hot_rows else None
    fast_us = c.seen[_plan_key(plan)].iteration_us
    plan.provenance = Provenance(planner="picasso.search", label=chosen.label, candidates_scored=len(c.log),
                                 access_source=sorted({a.source for a in access.values()}))
    plan.prediction = Prediction(iteration_us=chosen.iteration_us, engine=chosen.engine, fast_iteration_us=fast_us)
    return SearchResult(plan, hot_ids, chosen, c.log, time.perf_counter() - c.t0)


def _fused_pooled_layouts(model: ModelSpec, access: dict[str, TableAccess], hw: HardwareSpec, batch: int,
                          c_a2a: float, c_ar: float, hbm: float) -> list[tuple[str, list[PackPlan]]]:
    """(tag, packs) of the fused pooled candidates (planner.pooled_twrw.layout), per attribute
    group; none on one node, or where a table has no bags to pool.

    The first layout replicates the tables whose replication is worthwhile on its own. The
    next ones take 1, 2, ... up to `nodes` (at most MAX_EXTRA_REPLICATED) more tables out of
    the group (the smallest first, among tables small enough to replicate), either replicated
    too ("replicate+j") or exchanged as rows in a row-wise pack of their own ("rows+j"): the
    fused exchange waits for the node holding the most tables, so one table fewer can cut
    every rank's pooled bytes across nodes by a whole table's share."""
    from planner.pooled_twrw import layout

    if hw.nodes <= 1 or hw.gpus_per_node <= 1 or any(t.pooling == "none" for t in model.tables):
        return []
    groups = attribute_groups(model)
    small = {t.name for t in model.tables
             if replication_worthwhile(t, access[t.name], batch, hw.world_size, c_a2a, c_ar, hbm)}
    extra = sorted((t for t in model.tables if t.name not in small and _small_enough_to_replicate(t, hbm)),
                   key=lambda t: (t.num_rows * t.bytes_per_row, t.name))
    def packs_for(rep: set[str], rows: set[str]) -> list[PackPlan]:
        out: list[PackPlan] = []
        for gi, group in enumerate(groups):
            out += layout(list(group), {t.name: access[t.name].pooling for t in group}, hw.nodes, hw.gpus_per_node,
                          [t.name for t in group if t.name in rep], f"g{gi}" if gi else "",
                          [t.name for t in group if t.name in rows])
        return out

    out = [("", packs_for(small, set()))]
    for j in range(1, min(hw.nodes, len(extra), MAX_EXTRA_REPLICATED) + 1):
        moved = {t.name for t in extra[:j]}
        out += [(f"replicate+{j}", packs_for(small | moved, set())), (f"rows+{j}", packs_for(small, moved))]
    return out


def _as_fused_pooled(plan: Plan, data_parallel: bool) -> Plan:
    """`plan` (from _fused_pooled_layouts) with its table-row-wise packs pooled in one fused
    exchange; with `data_parallel` its small tables' rows all hot (synchronised in the dense
    all-reduce, as TorchRec's data-parallel tables), else their hot sets as sized."""
    from planner.pooled_twrw import SMALL_PACK

    plan.exchange = PlanExchange.FUSED_POOLED
    for p in plan.packs:
        if geometry_kind(p.sharding).within_node:  # the fused pooled exchange's members
            p.exchange = Exchange.POOLED
        elif data_parallel and p.name.endswith(SMALL_PACK):  # the layout's replicated tables
            p.exchange, p.hot_sync = Exchange.ROWS, HotSync.DENSE
            plan.hot_rows.update({t: plan.model.table(t).num_rows for t in p.tables})
    return plan


def _as_table_row_wise(plan: Plan, i: int, g: int, access: dict[str, TableAccess], batch: int) -> Plan:
    """Pack i replaced by one table-row-wise pack per node, tables balanced by exchange cost."""
    pack = plan.packs[i]
    nodes = plan.world_size // g
    specs = [plan.model.table(t) for t in pack.tables]
    costs = {t.name: table_cost(t, access[t.name], plan.world_size, batch) for t in specs}
    parts = balanced_split(specs, costs, nodes)
    new = [PackPlan(f"{pack.name}n{j}", names, Sharding.TABLE_ROW_WISE, list(range(j * g, j * g + g)), pack.placement,
                    pack.hot_sync)
           for j, names in enumerate(parts)]
    packs = [replace(p) for p in plan.packs[:i]] + new + [replace(p) for p in plan.packs[i + 1:]]
    return replace(plan, packs=packs)


def _plan_key(plan: Plan) -> str:
    packs = tuple((p.sharding, tuple(p.tables), tuple(p.ranks or ()), p.placement, p.exchange) for p in plan.packs)
    return repr((packs, sorted(plan.hot_rows.items()), plan.micro_batches, plan.kernel_interleaving, plan.exchange,
                 plan.grad_bucket_mb, plan.input_pipeline, plan.ids_after_mb, plan.backward_by_layer))


def _free_hbm(plan: Plan, hw: HardwareSpec, access: dict[str, TableAccess]) -> float:
    from planner.lowering import analyze

    saved = plan.hot_rows
    plan.hot_rows = {}
    try:
        _, mem, _ = analyze(plan, hw, access)
    finally:
        plan.hot_rows = saved
    return float(max(mem.hbm_capacity - mem.hbm_total.max(), 0.0))


def _sharding_ok(plan: Plan, pack: PackPlan, sharding: str) -> bool:
    dim = plan.model.table(pack.tables[0]).dim
    if geometry_kind(sharding).splits_columns:
        return dim >= plan.world_size and plan.world_size > 1
    return True


def _with_pack(plan: Plan, i: int, sharding: str, access: dict[str, TableAccess], batch: int) -> Plan:
    packs = [replace(p) for p in plan.packs]
    p = packs[i]
    p.sharding = sharding
    p.ranks = None
    if sharding == Sharding.TABLE_WISE:
        # on the rank that owns the least exchange work among table-wise packs
        load = [0.0] * plan.world_size
        for q in packs:
            if q.sharding == Sharding.TABLE_WISE and q is not p and q.ranks:
                load[q.ranks[0]] += sum(table_cost(plan.model.table(t), access[t], plan.world_size, batch)
                                        for t in q.tables)
        p.ranks = [min(range(plan.world_size), key=lambda r: (load[r], r))]
    hot = dict(plan.hot_rows)
    if not geometry_kind(sharding).is_partitioned:
        for t in p.tables:
            hot.pop(t, None)  # a replicated pack is all hot already
    new = replace(plan, packs=packs, hot_rows=hot)
    return new
