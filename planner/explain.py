"""Explanations of a plan: per pack, time by phase and resource, memory, speedups over baselines.

Entry point: `explain(plan, hw, profile=None, access=None, baselines=BASELINES, engine="simpy")
-> Explanation`, with `.to_dict()` (what `picasso plan --json` prints) and `.text()` (what
`--explain` prints).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from planner import op_names as on
from planner.access import TableAccess, table_access
from planner.baselines import BASELINES, baseline_plan
from planner.bounds import embedding_free_us
from planner.errors import PlanError
from planner.memory import gib
from planner.plan import Plan
from planner.search import Evaluation, evaluate, full_symmetry
from planner.volumes import ID_BYTES


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

    # ---- pieces ------------------------------------------------------------------
    def packs(self) -> list[dict[str, Any]]:
        lo = self.evaluation.lowered
        k = self.plan.micro_batches
        rows = []
        for pv in lo.packs:
            lookups = max(pv.lookups, 1e-12)
            a2a = 0.0 if pv.sharding == "replicated" else pv.cold_unique * (ID_BYTES + 2 * pv.row_bytes) * k
            rows.append({
                "pack": pv.name, "tables": pv.tables, "sharding": pv.sharding,
                "ranks": "all" if len(pv.ranks) == self.plan.world_size else pv.ranks,
                "placement": pv.placement, "rows": pv.rows, "dim": pv.dim, "hot_rows": pv.hot_rows,
                "hot_coverage": pv.hot_lookups / lookups,
                "a2a_bytes_per_step": a2a,
                "bytes_saved_per_step": pv.bytes_saved_per_step(k),
                "owner_imbalance": float(pv.recv_ids.max() / max(pv.recv_ids[pv.recv_ids > 0].mean(), 1e-12))
                if (pv.recv_ids > 0).any() else 1.0,
            })
        return rows

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

    def speedups(self) -> dict[str, float | None]:
        mine = self.evaluation.iteration_us
        return {name: (ev.iteration_us / mine if ev.iteration_us and mine else None)
                for name, ev in self.baselines.items()}

    # ---- outputs -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        ev = self.evaluation
        return {
            "model": self.plan.model.name, "hardware": self.plan.hardware, "world_size": self.plan.world_size,
            "batch_size_per_rank": self.plan.batch_size_per_rank, "micro_batches": self.plan.micro_batches,
            "kernel_interleaving": self.plan.kernel_interleaving,
            "dense_dtype": ev.lowered.dense_dtype, "lowering_notes": list(ev.lowered.notes),
            "predicted_iteration_us": ev.iteration_us, "engine": ev.engine,
            "samples_per_s": (self.plan.global_batch / ev.iteration_us * 1e6) if ev.iteration_us else None,
            "packs": self.packs(),
            "time_by_phase_us": self.time_by_phase(),
            "time_by_resource_us": self.time_by_resource(),
            "memory": ev.lowered.memory.to_dict(),
            "baselines_us": {n: e.iteration_us for n, e in self.baselines.items()},
            "baseline_problems": {n: e.problem for n, e in self.baselines.items() if e.problem},
            "speedups": self.speedups(),
            "baselines_as_executed_us": {n: e.iteration_us for n, e in self.as_executed.items()},
            "embedding_free_us": self.embedding_free_us,
            "max_speedups": self.max_speedups(),
        }

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
            f"{'on' if d['kernel_interleaving'] else 'off'}, dense layers in {d['dense_dtype']})",
            *(f"note: {n}" for n in d["lowering_notes"]),
            f"predicted iteration: {d['predicted_iteration_us']:.1f} us ({d['engine']}), "
            f"{d['samples_per_s']:.0f} samples/s",
            "",
            _table(
                ["pack", "tables", "sharding", "ranks", "place", "rows", "hot rows", "hot cover",
                 "a2a MB/step", "saved MB/step", "imbalance"],
                [[p["pack"], _tables(p["tables"]), p["sharding"], str(p["ranks"]), p["placement"], f"{p['rows']:,}",
                  f"{p['hot_rows']:,}", f"{p['hot_coverage']:.1%}", f"{p['a2a_bytes_per_step'] / 1e6:.2f}",
                  f"{p['bytes_saved_per_step'] / 1e6:.2f}", f"{p['owner_imbalance']:.2f}"] for p in d["packs"]],
            ),
            "",
            "time by phase (us, busy per lane, one rank):",
            _table(["phase"] + list(_lanes(d)), [[ph] + [f"{lanes.get(la, 0.0):.1f}" for la in _lanes(d)]
                                                 for ph, lanes in d["time_by_phase_us"].items()]),
            "",
            "time by resource (us busy per iteration): " + ", ".join(
                f"{k} {v:.1f}" for k, v in d["time_by_resource_us"].items() if v > 0.05),
            "",
        ]
        mem = d["memory"]
        lines.append(f"memory per rank (peak over ranks): device {gib(mem['hbm_peak'])} of {gib(mem['hbm_capacity'])}"
                     f", host {gib(mem['host_peak'])} of {gib(mem['host_capacity'])}")
        lines.append("  " + ", ".join(f"{k} {gib(v)}" for k, v in mem["hbm_by_component"].items()))
        per_rank = mem["hbm_per_rank"]
        if len(per_rank) <= 16 and max(per_rank) - min(per_rank) > 0.01 * max(per_rank):
            lines.append("  device memory by rank: " + ", ".join(f"{r}: {gib(v)}" for r, v in enumerate(per_rank)))
        lines.append("")
        lines.append("speedup over baselines (same simulator):")
        for name, s in d["speedups"].items():
            us = d["baselines_us"][name]
            why = d["baseline_problems"].get(name)
            lines.append(f"  {name:14s} " + (f"{us:10.1f} us  -> {s:.2f}x" if s else f"n/a ({why})"))
        for name, us in d["baselines_as_executed_us"].items():
            if us:
                lines.append(f"  ({name} as the executor runs it, one exchange per pack: {us:.1f} us -> "
                             f"{us / d['predicted_iteration_us']:.2f}x)")
        if d["embedding_free_us"]:
            best = ", ".join(f"{n} {v:.2f}x" for n, v in d["max_speedups"].items() if v)
            lines.append(f"bound: with embeddings free (input copy, dense layers, dense all-reduce only) an "
                         f"iteration takes {d['embedding_free_us']:.1f} us; no plan beats that: at most {best}")
        return "\n".join(lines)


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
    hw: Any,
    profile: Any | None = None,
    access: dict[str, TableAccess] | None = None,
    baselines: tuple[str, ...] = BASELINES,
    engine: str = "simpy",
    evaluation: Evaluation | None = None,
) -> Explanation:
    """Simulate `plan` (unless `evaluation` is given) and each baseline the same way."""
    access = access if access is not None else table_access(plan.model, profile)
    ev = evaluation or evaluate(plan, hw, access, engine, full_symmetry(plan), "plan")
    if ev.iteration_us is None:
        raise PlanError(ev.problem or "the plan cannot be simulated")
    out, executed = {}, {}
    for name in baselines:
        try:
            bp = baseline_plan(name, plan.model, plan.world_size, plan.batch_size_per_rank, hw, access)
        except PlanError as exc:
            out[name] = Evaluation(name, plan, None, engine, problem=str(exc))
            continue
        # torchrec-like is scored as TorchRec runs it: one exchange per group of table-wise tables
        fused = bool(bp.notes.get("fused_exchange"))
        out[name] = evaluate(bp, hw, access, ev.engine, full_symmetry(bp), name, fuse_table_wise=fused)
        if fused:
            executed[name] = evaluate(bp, hw, access, ev.engine, full_symmetry(bp), name)
    try:
        free = embedding_free_us(plan, hw, access, ev.engine)
    except PlanError:
        free = None
    return Explanation(plan, ev, out, executed, free)
