"""Explanations of a plan: per pack, time by phase and resource, memory, speedups over baselines.

Entry point: `explain(plan, hw, profile=None, access=None, baselines=BASELINES, engine="simpy")
-> Explanation`, with `.to_dict()` (what `picasso plan --json` prints) and `.text()` (what
`--explain` prints).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Any

from foundation.numbers import count
from planner import op_names as on
from planner import peer_compare
from planner.access import TableAccess, table_access
from planner.bounds import embedding_free_us
from planner.builders import BASELINES, TORCHREC, baseline_plan
from planner.dense import default_dense_dtype
from planner.errors import PlanError
from planner.exchange import exchange_costs, poolable
from planner.host_access import HostAccess
from planner.memory import gib
from planner.modes import HotSync, Placement, PlanExchange, Scoring
from planner.peer_compare import PeerScore
from planner.plan import Plan, wire_id_bytes
from planner.pooled_twrw import exchange_bytes as group_bytes
from planner.pooled_twrw import explain_lines as fused_lines
from planner.pooled_twrw import is_group
from planner.search import (
    Evaluation,
    byte_costs,
    evaluate,
    full_symmetry,
    hot_threshold_rows,
    sparse_presence_threshold,
)
from planner.sharding import Sharding
from planner.throughput import samples_per_s
from traces.coverage import presence, presence_threshold

if TYPE_CHECKING:  # types only: the seams' own classes, not loaded at import
    from simulator.hardware import HardwareSpec
    from traces.profile import AccessProfile


# How each baseline synchronises embedding gradients (a replicated pack all-gathers sparse
# gradients from every rank; hot rows of a sharded pack ride in the dense all-reduce).
BASELINE_SYNC = {
    "naive": "one pack per table, placed table-wise: an all-to-all per table, no hot rows",
    "torchrec-like": "row-wise/table-wise packs, one fused all-to-all per attribute group, no hot rows",
    "dp-hot-only": "every table replicated: each step all-gathers the sparse gradients of all ranks "
                   "(world x touched rows) and applies them on every rank; no all-to-all",
}
HOT_SCALE_RE = re.compile(r"hot=x([0-9.]+)")
# the per-table part of a statistics source (planner.access.access_sources)
SOURCE_FEATURE_RE = re.compile(r"feature '[^']*' (of )?|[0-9,]+ distinct IDs(, )?")


def pack_sync(partitioned: bool, hot_rows: int, sparse_hot: bool = False) -> str:
    """How a pack's embedding gradients are synchronised, in words."""
    hot = (" + all-gather of touched hot rows" if sparse_hot else " + hot rows in dense all-reduce") if hot_rows else ""
    if not partitioned:
        return "all-gather of sparse grads" + (hot if sparse_hot else "")
    return "all-to-all" + hot


def _dtype_origin(dtype: str, hw: Any) -> str:
    """Why the dense layers run at `dtype`, when it is the GPU's default rather than fp32."""
    if hw is not None and dtype == "tf32" and default_dense_dtype(hw) == "tf32":
        return " (tensor-core matmuls, this GPU's default; --dense-dtype fp32 for full fp32)"
    return ""


def _pipeline(d: dict[str, Any]) -> str:
    if not d["input_pipeline"]:
        return "off"
    if d["micro_batches"] == 1 or d["ids_after_mb"] is None:
        return "on"
    return f"on (next IDs after micro-batch {d['ids_after_mb']})"


def _backward(d: dict[str, Any]) -> str:
    """The backward's order over the micro-batches, for the header line (none for one)."""
    if d["micro_batches"] == 1:
        return ""
    return f"backward {'layer by layer' if d['backward_by_layer'] else 'micro-batch by micro-batch'}, "


def _buckets(mb: float) -> str:
    """How a plan all-reduces its dense gradients, for the header line."""
    return f"of {mb:g} MiB" if mb > 0 else "off (one all-reduce after the backward)"


@dataclass
class Explanation:
    plan: Plan
    evaluation: Evaluation
    baselines: dict[str, Evaluation] = field(default_factory=dict)
    # baselines whose score assumes an exchange the executor does not do (torchrec-like's
    # fused table-wise all-to-all), simulated as the executor runs them
    as_executed: dict[str, Evaluation] = field(default_factory=dict)
    # the iteration with every embedding op free: no plan of this model on this hardware
    # can beat it (planner.bounds)
    embedding_free_us: float | None = None
    hw: HardwareSpec | None = None
    access: dict[str, TableAccess] | None = None
    sources: dict[str, str] | None = None  # per table: where its access statistics come from
    # the systems users compare with: their plans on their engines and on picasso's (planner.peer_compare)
    peers: list[PeerScore] = field(default_factory=list)

    # ---- pieces ------------------------------------------------------------------
    def packs(self) -> list[dict[str, Any]]:
        lo = self.evaluation.lowered
        k = self.plan.micro_batches
        rows = []
        for pv in lo.packs:
            lookups = max(pv.lookups, 1e-12)
            a2a = group_bytes(pv, k) if is_group(pv) else pv.exchange_bytes(k)
            replicated = not pv.geometry.is_partitioned
            rows.append({
                "pack": pv.name, "tables": pv.tables, "sharding": pv.sharding,
                "ranks": "all" if len(pv.ranks) == self.plan.world_size else pv.ranks,
                "placement": pv.placement, "rows": pv.rows, "dim": pv.dim, "hot_rows": pv.hot_rows,
                # a replicated pack is read locally in full: all of it is "hot"
                "hot_coverage": 1.0 if replicated else pv.hot_lookups / lookups,
                "sync": pack_sync(not replicated, pv.hot_rows, pv.sparse_hot),
                "exchange": pv.exchange, "exchange_us": self._exchange_costs(pv.name),
                "a2a_bytes_per_step": a2a,
                "bytes_saved_per_step": pv.bytes_saved_per_step(k),
                # host-placed: the PCIe reads of cold rows the device's hot cache spares each step
                "host_cache_saves_bytes": ((pv.cold_unique_nohot - pv.cold_unique) * k * pv.slice_bytes
                                           if pv.placement == Placement.HOST else 0.0),
                "host_access": str(pv.host_access) if pv.placement == Placement.HOST else None,
                "owner_imbalance": float(pv.recv_ids.max() / max(pv.recv_ids[pv.recv_ids > 0].mean(), 1e-12))
                if (pv.recv_ids > 0).any() else 1.0,
            })
        return rows

    def _exchange_costs(self, pack_name: str) -> dict[str, float] | None:
        """Predicted us per iteration of the pack's cold exchange as rows and as pooled vectors
        (planner.exchange, the planner's own choice rule); None where only rows can run."""
        pack = next((p for p in self.plan.packs if p.name == pack_name), None)
        if pack is None or self.hw is None or self.access is None or not poolable(self.plan, pack):
            return None
        samples = self.plan.batch_size_per_rank / self.plan.micro_batches
        return exchange_costs(self.plan, pack, self.hw, self.access, samples)

    def tables(self) -> list[dict[str, Any]]:
        """Per table: where its statistics come from, and why its hot set has the size it has.

        The numbers are the planner's own (planner.search.hot_threshold_rows): a hot row costs
        its gradient in the all-reduce every step; it saves, when cold, its exchange (ID, row
        and gradient) in each micro-batch it appears in, with probability q = 1-(1-p)^L.
        """
        if self.access is None:
            return []
        plan, k, world = self.plan, self.plan.micro_batches, self.plan.world_size
        access = self.access
        c_a2a, c_ar = byte_costs(self.hw, world) if self.hw is not None else (1.0, 1.0)
        m = HOT_SCALE_RE.search(str(plan.provenance.label or ""))
        scale = float(m.group(1)) if m else None
        out = []
        for pack in plan.packs:
            for name in pack.tables:
                t, acc = plan.model.table(name), access.get(name)
                rec: dict[str, Any] = {"table": name, "pack": pack.name, "source": (self.sources or {}).get(
                    name, getattr(acc, "source", "?")), "hot_rows": plan.hot_rows.get(name, 0)}
                if acc is not None:
                    rec.update(self._hot_reason(t, acc, pack, k, world, c_a2a, c_ar, scale))
                out.append(rec)
        return out

    def _hot_reason(self, t, acc, pack, k, world, c_a2a, c_ar, scale) -> dict[str, Any]:
        rb = t.bytes_per_row
        lookups = max(self.plan.batch_size_per_rank / k * acc.pooling, 1.0)
        _, p_top = acc.head(0, 1)
        p1 = float(p_top[0]) if len(p_top) else 0.0
        q1 = presence(p1, lookups)
        on_host = pack.placement == Placement.HOST
        c_gather = 1e6 / self.hw.pcie_bw if on_host and self.hw is not None else (
            2e6 / self.hw.gpu.hbm_bw if self.hw is not None else 0.0)
        per_mb = wire_id_bytes(t.num_rows) + 2 * rb  # ID out, row back, gradient back
        rec = {
            "top_row_share": p1, "top_row_in_micro_batch": q1,
            "hot_row_cost_bytes": rb, "hot_row_cost_us": rb * c_ar,
            "top_row_saves_bytes": k * q1 * per_mb, "top_row_saves_us": k * q1 * (per_mb * c_a2a + rb * c_gather),
            "scale_kept": scale,
        }
        # a pack that syncs its hot rows sparsely sizes them by that sync's cost (search.size_for_sparse_sync)
        sparse_us = self._sparse_row_us(pack) if pack.hot_sync == HotSync.SPARSE and world > 1 else None
        closed = hot_threshold_rows(t, acc, self.plan.batch_size_per_rank / k, k, c_a2a, c_ar, c_gather, sparse_us)
        if sparse_us is None:
            theta = rb * c_ar / (k * (per_mb * c_a2a + rb * c_gather))
        else:
            theta = sparse_presence_threshold(sparse_us / (per_mb * c_a2a + rb * c_gather), k)
            rec["hot_row_cost_us"] = sparse_us  # in each step that touches it
            rec["hot_sync"] = HotSync.SPARSE
        rec["threshold_in_micro_batch"] = theta if theta < 1 else None
        rec["threshold_share"] = presence_threshold(theta, lookups) if theta < 1 else None
        rec["closed_form_rows"] = closed
        chosen = self.plan.hot_rows.get(t.name, 0)
        if not pack.sharding.exchanges:
            reason = HotReason.REPLICATED
        elif world <= 1 and not on_host:
            reason = HotReason.ONE_RANK
        elif theta >= 1:
            reason = HotReason.COSTS_MORE
        elif closed == 0:
            reason = HotReason.NONE_HOT_ENOUGH
        elif chosen == 0 and scale == 0:
            reason = HotReason.SEARCH_CHOSE_NONE
        elif scale is not None and chosen < round(closed * scale) * 0.99:
            reason = HotReason.CUT_TO_FIT
        else:
            reason = HotReason.ABOVE_THRESHOLD
        rec["reason"] = reason.value
        rec["why"] = _why(reason, [{**rec, "hot_rows": chosen}])
        return rec

    def hot_reasons(self) -> list[dict[str, Any]]:
        """The hot-set reasons grouped: one row per pack and reason (the tables of a pack share
        their row size and sync, so they mostly share the reason), numbers summed over its tables."""
        groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for rec in self.tables():
            if "reason" in rec:
                groups[(rec["pack"], rec["reason"])].append(rec)
        return [{"pack": pack, "reason": reason, "tables": [r["table"] for r in recs],
                 "hot_rows": sum(r["hot_rows"] for r in recs),
                 "top_row_share": [min(r["top_row_share"] for r in recs), max(r["top_row_share"] for r in recs)],
                 "why": _why(HotReason(reason), recs)}
                for (pack, reason), recs in groups.items()]

    def _sparse_row_us(self, pack: Any) -> float | None:
        from planner.lowering import sparse_sync_row_us
        from planner.volumes import pack_volumes

        if self.hw is None:
            return None
        plan = replace(self.plan, hot_rows={})
        pv = pack_volumes(plan, pack, self.access, plan.batch_size_per_rank / plan.micro_batches,
                          self.hw.gpus_per_node)
        return sparse_sync_row_us(plan, pv, self.hw)

    def time_by_phase(self) -> dict[str, dict[str, float]]:
        """Busy time (us) of the first simulated rank per phase (fwd/bwd/opt) and lane."""
        tl = self.evaluation.result.timeline
        rank = min((e.rank for e in tl.events), default=0)
        out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for e in tl.events:
            if e.rank != rank:
                continue
            phase, scope, _, _ = on.split_name(e.name)
            area = "dense" if scope in ("dense", "input") else "embedding"
            out[f"{phase}/{area}"][e.lane] += e.dur_us
        return {k: dict(v) for k, v in sorted(out.items())}

    def time_by_resource(self) -> dict[str, float]:
        """Busy time (us per iteration, mean over ranks) of each resource."""
        util = self.evaluation.result.utilisation
        it = self.evaluation.iteration_us or 0.0
        return {k: v * it for k, v in util.items() if not k.startswith("lane:")}

    def bottleneck(self) -> dict[str, Any] | None:
        """The busiest resource of the simulated iteration and the ops whose demands keep it
        busy (shares of the first rank's demand on it, micro-batches summed): why no plan of
        this shape runs faster than that resource allows."""
        from simulator.cost import RESOURCES, op_busy

        res, it = self.time_by_resource(), self.evaluation.iteration_us
        if self.hw is None or not it or not res:
            return None
        name, busy = max(res.items(), key=lambda kv: kv[1])
        if name not in RESOURCES:
            return None
        k = RESOURCES.index(name)
        demand: dict[str, float] = defaultdict(float)
        first = None
        for node, attrs in self.evaluation.lowered.graph.g.nodes(data=True):
            rank, _, op = str(node).partition(":")
            first = rank if first is None else first
            if rank == first:
                demand[on.base_name(op)] += op_busy(attrs, self.hw)[2][k]
        total = sum(demand.values())
        ops = sorted(((op, us / total) for op, us in demand.items() if us > 0), key=lambda x: (-x[1], x[0]))
        return {"resource": name, "busy_us": busy, "share_of_iteration": busy / it,
                "ops": [{"op": op, "share": s} for op, s in ops[:4]]}

    def speedups(self) -> dict[str, float | None]:
        mine = self.evaluation.iteration_us
        return {name: (ev.iteration_us / mine if ev.iteration_us and mine else None)
                for name, ev in self.baselines.items()}

    def cold_per_mb(self) -> dict[str, float]:
        """Per pack: the cold rows (a pooled exchange: cold IDs) each rank sends per
        micro-batch, as planner.volumes has them (Prediction.cold_per_mb; a run counts them)."""
        lo = self.evaluation.lowered
        return {} if lo is None else {pv.name: float(pv.cold_unique) for pv in lo.packs}

    # ---- outputs -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        ev = self.evaluation
        return {
            "model": self.plan.model.name, "hardware": self.plan.hardware, "world_size": self.plan.world_size,
            "batch_size_per_rank": self.plan.batch_size_per_rank, "micro_batches": self.plan.micro_batches,
            "kernel_interleaving": self.plan.kernel_interleaving, "input_pipeline": self.plan.input_pipeline,
            "grad_bucket_mb": self.plan.grad_bucket_mb,
            "ids_after_mb": self.plan.ids_launch_mb if self.plan.pipelines_inputs else None,
            "backward_by_layer": self.plan.layered_backward,
            "dense_dtype": ev.lowered.dense_dtype, "lowering_notes": list(ev.lowered.notes),
            "predicted_iteration_us": ev.iteration_us, "engine": ev.engine,
            "samples_per_s": samples_per_s(self.plan, ev.iteration_us),
            "packs": self.packs(),
            "tables": self.tables(),
            "hot_reasons": self.hot_reasons(),
            "baseline_sync": {n: BASELINE_SYNC.get(n, "") for n in self.baselines},
            "time_by_phase_us": self.time_by_phase(),
            "time_by_resource_us": self.time_by_resource(),
            "bottleneck": self.bottleneck(),
            "memory": ev.lowered.memory.to_dict(),
            "baselines_us": {n: e.iteration_us for n, e in self.baselines.items()},
            "baseline_problems": {n: e.problem for n, e in self.baselines.items() if e.problem},
            "speedups": self.speedups(),
            "baselines_as_executed_us": {n: e.iteration_us for n, e in self.as_executed.items()},
            "embedding_free_us": self.embedding_free_us,
            "max_speedups": self.max_speedups(),
            "peers": peer_compare.to_dicts(self.peers, ev.iteration_us),
        }

    def _place(self, placement: str) -> str:
        return self.hw.placement_name(placement) if self.hw is not None else str(placement)

    def _resource(self, resource: str) -> str:
        return self.hw.resource_name(resource) if self.hw is not None else resource

    def max_speedups(self) -> dict[str, float | None]:
        """Over each baseline, the speedup of a plan whose embeddings cost nothing."""
        free = self.embedding_free_us
        return {name: (ev.iteration_us / free if ev.iteration_us and free else None)
                for name, ev in self.baselines.items()}

    def text(self) -> str:
        d = self.to_dict()
        lines = [
            f"plan for {d['model']} on {d['hardware']} ({d['world_size']} ranks, batch {d['batch_size_per_rank']}"
            f"/rank, {d['micro_batches']} micro-batch(es), kernel interleaving "
            f"{'on' if d['kernel_interleaving'] else 'off'}, input pipeline {_pipeline(d)}, "
            f"gradient buckets {_buckets(d['grad_bucket_mb'])}, "
            f"{_backward(d)}"
            f"dense layers in {d['dense_dtype']}{_dtype_origin(d['dense_dtype'], self.hw)})",
            *(f"note: {n}" for n in d["lowering_notes"]),
            f"predicted iteration: {d['predicted_iteration_us']:.1f} us ({d['engine']}), "
            f"{count(d['samples_per_s'])} samples/s",
            "",
            _table(
                ["pack", "tables", "sharding", "ranks", "place", "rows", "hot rows", "hot cover",
                 "exchange", "a2a MB/step", "saved MB/step", "imbalance", "sync"],
                [[p["pack"], _tables(p["tables"]), p["sharding"], str(p["ranks"]), self._place(p["placement"]),
                  f"{p['rows']:,}",
                  "all" if p["sharding"] == Sharding.REPLICATED else f"{p['hot_rows']:,}",
                  "all (replicated)" if p["sharding"] == Sharding.REPLICATED else f"{p['hot_coverage']:.1%}",
                  p["exchange"], f"{p['a2a_bytes_per_step'] / 1e6:.2f}", f"{p['bytes_saved_per_step'] / 1e6:.2f}",
                  f"{p['owner_imbalance']:.2f}", p["sync"]] for p in d["packs"]],
            ),
            *_exchange_lines(d["packs"]),
            *_host_cache_lines(d["packs"], self.hw),
            *fused_lines(self.plan, self.evaluation.lowered.packs),
            *(["", "hot rows, per pack (a hot row costs its gradient in the all-reduce each step; cold, it is "
               "exchanged in each micro-batch it appears in):",
               _table(["pack", "tables", "hot rows", "top row", "why"],
                      [[g["pack"], _tables(g["tables"]), f"{g['hot_rows']:,}", _share_range(g["top_row_share"]),
                        g["why"]] for g in d["hot_reasons"]]),
               *_source_lines(d["tables"])] if d["hot_reasons"] else []),
            "",
            "time by phase (us, busy per lane, one rank):",
            _table(["phase"] + list(_lanes(d)), [[ph] + [f"{lanes.get(la, 0.0):.1f}" for la in _lanes(d)]
                                                 for ph, lanes in d["time_by_phase_us"].items()]),
            "",
            "time by resource (us busy per iteration): " + ", ".join(
                f"{self._resource(k)} {v:.1f}" for k, v in d["time_by_resource_us"].items() if v > 0.05),
        ]
        if (b := d.get("bottleneck")) is not None:
            rest = "" if b["share_of_iteration"] >= 0.8 else " (the rest of the iteration: latency and waiting)"
            lines.append(f"busiest resource: {self._resource(b['resource'])}, {b['busy_us']:.1f} us of {d['predicted_iteration_us']:.1f}"
                         f" ({b['share_of_iteration']:.0%}){rest}; its demand: " + ", ".join(
                             f"{o['op']} {o['share']:.0%}" for o in b["ops"]))
        lines += [
            "",
        ]
        mem = d["memory"]
        device = self.hw.device_memory if self.hw is not None else "device"
        lines.append(f"memory per rank (peak over ranks): {device} {gib(mem['hbm_peak'])} of {gib(mem['hbm_capacity'])}"
                     f", host {gib(mem['host_peak'])} of {gib(mem['host_capacity'])}")
        lines.append("  " + ", ".join(f"{k} {gib(v)}" for k, v in mem["hbm_by_component"].items()))
        per_rank = mem["hbm_per_rank"]
        if len(per_rank) <= 16 and max(per_rank) - min(per_rank) > 0.01 * max(per_rank):
            lines.append(f"  {device} by rank: " + ", ".join(f"{r}: {gib(v)}" for r, v in enumerate(per_rank)))
        lines.append("")
        lines.append("speedup over baselines (same simulator):")
        for name, s in d["speedups"].items():
            us = d["baselines_us"][name]
            why = d["baseline_problems"].get(name)
            lines.append(f"  {name:14s} " + (f"{us:10.1f} us  -> {s:.2f}x" if s else f"n/a ({why})")
                         + (f"  [{d['baseline_sync'][name]}]" if d["baseline_sync"].get(name) else ""))
        for name, us in d["baselines_as_executed_us"].items():
            if us:
                lines.append(f"  ({name} as the executor runs it, one exchange per pack: {us:.1f} us -> "
                             f"{us / d['predicted_iteration_us']:.2f}x)")
        if d["embedding_free_us"]:
            best = ", ".join(f"{n} {v:.2f}x" for n, v in d["max_speedups"].items() if v)
            lines.append(f"bound: with embeddings free (input copy, dense layers, dense all-reduce only) an "
                         f"iteration takes {d['embedding_free_us']:.1f} us; no plan beats that: at most {best}")
        if self.peers:
            lines += ["", *peer_compare.lines(self.peers, d["predicted_iteration_us"])]
        return "\n".join(lines)


def _host_cache_lines(packs: list[dict[str, Any]], hw: HardwareSpec | None) -> list[str]:
    """What each host-placed pack's device cache saves: the cold rows it spares PCIe each step."""
    out = []
    for p in packs:
        if p["placement"] != Placement.HOST:
            continue
        how = ("its rows read and updated in place over PCIe" if p["host_access"] == HostAccess.MAPPED
               else "its rows gathered on the host and copied over PCIe")
        saved = p["host_cache_saves_bytes"]
        us = f", {saved / hw.pcie_bw * 1e6:,.0f} us at {hw.pcie_bw / 1e9:.0f} GB/s" if hw is not None else ""
        out.append(f"{p['pack']} lives in host memory, {how}: its device cache of {p['hot_rows']:,} hot rows serves "
                   f"{p['hot_coverage']:.1%} of its lookups and spares {saved / 1e6:,.1f} MB of PCIe reads a "
                   f"step{us}")
    return out


class HotReason(str, Enum):
    """Why a table's hot set has its size (the cases of Explanation._hot_reason)."""

    REPLICATED = "replicated_pack"
    ONE_RANK = "one_rank"
    COSTS_MORE = "costs_more"
    NONE_HOT_ENOUGH = "none_hot_enough"
    SEARCH_CHOSE_NONE = "search_chose_none"
    CUT_TO_FIT = "cut_to_fit"
    ABOVE_THRESHOLD = "above_threshold"


def _why(reason: HotReason, recs: list[dict[str, Any]]) -> str:
    """The reason in words for one table or a group of a pack's tables (numbers summed, ranges
    where the tables differ)."""
    first = recs[0]
    rb, cost = first["hot_row_cost_bytes"], first["hot_row_cost_us"]
    closed = sum(r["closed_form_rows"] for r in recs)
    chosen = sum(r["hot_rows"] for r in recs)
    scale = first.get("scale_kept")
    if reason == HotReason.REPLICATED:
        return "replicated pack: every row is local (sparse gradients all-gathered), no hot set needed"
    if reason == HotReason.ONE_RANK:
        return "one rank: nothing is exchanged, so no row is worth replicating"
    if reason == HotReason.COSTS_MORE:
        saves = max(r["top_row_saves_us"] / max(r["top_row_in_micro_batch"], 1e-12) for r in recs)
        return (f"a hot row's all-reduce ({rb} B, {cost:.3g} us) costs more than the exchange it saves even in "
                f"every micro-batch (at most {saves:.3g} us)")
    if reason == HotReason.NONE_HOT_ENOUGH:
        return (f"no row is hot enough: the hottest ({_share_range([r['top_row_share'] for r in recs])} of lookups) "
                f"saves at most {max(r['top_row_saves_us'] for r in recs):.3g} us < the {cost:.3g} us its "
                "all-reduce costs")
    if reason == HotReason.SEARCH_CHOSE_NONE:
        return f"{closed:,} rows pass the threshold, but the search simulated scale x0 (no hot rows) as faster"
    if reason == HotReason.CUT_TO_FIT:
        return f"{closed:,} rows pass the threshold x{scale:g}, cut to {chosen:,} to fit the device-memory budget"
    theta = [r["threshold_in_micro_batch"] for r in recs if r.get("threshold_in_micro_batch") is not None]
    share = [r["threshold_share"] for r in recs if r.get("threshold_share") is not None]
    at = f"above {min(share):.2e} of lookups " if share else ""
    seen = f"(in >= {min(theta):.1%} of micro-batches) " if theta else ""
    return f"rows {at}{seen}save more than they cost: {closed:,}" + (
        f", kept at scale x{scale:g}" if scale is not None else "")


def _share_range(shares: list[float]) -> str:
    lo, hi = min(shares), max(shares)
    return f"{lo:.1%}" if f"{lo:.1%}" == f"{hi:.1%}" else f"{lo:.1%}-{hi:.1%}"


def _source_lines(tables: list[dict[str, Any]]) -> list[str]:
    """Where the access statistics came from, grouped: a table's own name and ID count left out
    (per table they are in --json), so 26 tables measured alike are one line."""
    by_source: dict[str, list[str]] = defaultdict(list)
    for r in tables:
        src = SOURCE_FEATURE_RE.sub("", str(r["source"]))
        by_source[src.replace("()", "").strip()].append(r["table"])
    if not by_source:
        return []
    return ["access statistics: " + "; ".join(f"{src} ({len(names)} tables: {_tables(names)})"
                                              if len(by_source) > 1 else f"{src} (all {len(names)} tables)"
                                              for src, names in by_source.items())]


def _exchange_lines(packs: list[dict[str, Any]]) -> list[str]:
    """Why each pack exchanges rows or pooled vectors: the two predicted costs."""
    rows = [p for p in packs if p.get("exchange_us")]
    if not rows:
        return []
    out = ["exchange (predicted us per iteration of the cold exchange: deduplicated rows pooled by the requester, "
           "or every ID sent and pooled at the owner):"]
    for p in rows:
        c = p["exchange_us"]
        cheaper = "pooled" if c["pooled"] < c["rows"] else "rows"
        why = "" if cheaper == p["exchange"] else " (the simulated step was faster so: overlap, not bytes, decides)"
        out.append(f"  {p['pack']}: rows {c['rows']:.1f}, pooled {c['pooled']:.1f} -> {p['exchange']}{why}")
    return out


def _lanes(d: dict[str, Any]) -> list[str]:
    return sorted({la for lanes in d["time_by_phase_us"].values() for la in lanes})


def _tables(names: list[str], most: int = 4) -> str:
    return ",".join(names) if len(names) <= most else ",".join(names[:most]) + f",..(+{len(names) - most})"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)] if rows else [len(h) for h in header]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), fmt.format(*["-" * w for w in widths])] + [fmt.format(*r) for r in rows])


def explain(
    plan: Plan,
    hw: HardwareSpec,
    profile: AccessProfile | None = None,
    access: dict[str, TableAccess] | None = None,
    baselines: tuple[str, ...] = BASELINES,
    engine: str = "simpy",
    evaluation: Evaluation | None = None,
    sources: dict[str, str] | None = None,
    peers: tuple[str, ...] = (),
) -> Explanation:
    """Simulate `plan` (unless `evaluation` is given) and each baseline the same way.

    `sources`: per table, where its access statistics come from (planner.access.access_sources).
    `peers`: the systems users compare with (planner.peers), each on its engine and on picasso's.
    """
    access = access if access is not None else table_access(plan.model, profile)
    ev = evaluation or evaluate(plan, hw, access, engine, full_symmetry(plan), "plan")
    if ev.iteration_us is None:
        raise PlanError(ev.problem or "the plan cannot be simulated")
    out, executed = {}, {}
    for name in baselines:
        try:
            # the plan may be TorchRec's own already: not planned twice
            own = name == TORCHREC and plan.exchange == PlanExchange.TORCHREC
            bp = plan if own else baseline_plan(name, plan.model, plan.world_size, plan.batch_size_per_rank, hw,
                                                access)
        except PlanError as exc:
            out[name] = Evaluation(name, plan, None, engine, problem=str(exc))
            continue
        # torchrec-like is scored as TorchRec runs it (one exchange per group of table-wise
        # tables) and as the executor runs it (pack by pack)
        fused = bp.provenance.scoring == Scoring.FUSED_TABLE_WISE
        out[name] = evaluate(bp, hw, access, ev.engine, full_symmetry(bp), name, fuse_table_wise=fused)
        if fused:
            executed[name] = evaluate(bp, hw, access, ev.engine, full_symmetry(bp), name)
    try:
        free = embedding_free_us(plan, hw, access, ev.engine)
    except PlanError:
        free = None
    scored = peer_compare.score_peers(plan, hw, access, ev.engine, peers) if peers else []
    return Explanation(plan, ev, out, executed, free, hw=hw, access=access, sources=sources, peers=scored)
