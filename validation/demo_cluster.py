"""The demo's what-if part: a skewed click log planned for GPU clusters this machine does not have.

The real run on this machine can only show small plans (a few capped tables fit every CPU rank,
so the planner replicates them). Here the planner meets the case it is for: a log whose IDs are
Zipf-heavy, tables of very different sizes and widths (so several packs), on simulated clusters
from the hardware presets. The same model and log are planned for two clusters so that the plan's
dependence on the hardware shows: on P2RES's cluster (4 nodes of 8 V100, 100 Gbit/s between
nodes) hot rows are worth replicating; on 2 nodes of 8 H100 (400 Gbit/s per GPU) the exchange is
cheap and the dense layers are the step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from foundation.files import atomic_write_text
from foundation.numbers import duration_us, percent
from planner.access import table_access
from planner.explain import Explanation, explain
from planner.model_spec import ModelSpec
from planner.presets import get_model
from planner.search import search
from planner.sharding import Sharding
from simulator.hardware import HardwareSpec, load_hardware
from simulator.report import Section, bar_figure, markup, paragraph, table_html, tag
from traces.profile import AccessProfile, profile_file
from traces.synth import CRITEO_1TB_CARDINALITIES, generate_criteo

ZIPF_S = 1.2  # every feature: heavier than Criteo's own skew (its features fit 1.0-1.2)
BATCH = 4096  # per GPU
SEARCH_S = 60.0  # the search's time budget per cluster: a cap on a loaded machine, not a target (it stops when done)
# (label, hardware preset, overrides): the clusters the what-if plans for
CLUSTERS = (
    ("4 nodes x 8 V100, 100 Gbit/s between nodes (P2RES's cluster)", "p2res-v100", ()),
    ("2 nodes x 8 H100, 400 Gbit/s per GPU", "dgx-h100", ("nodes=2",)),
)


def table_dim(rows: int) -> int:
    """Wider vectors for larger tables, as production models size them: three widths, so three
    attribute groups that cannot share a pack."""
    return 128 if rows > 1_000_000 else (64 if rows > 10_000 else 32)


def mixed_width_model() -> ModelSpec:
    """MLPerf's DLRM-DCNv2 (26 multi-hot tables of Criteo 1TB's sizes, a cross network) with the
    table widths of `table_dim`."""
    base = get_model("dlrm-dcnv2")
    tables = tuple(replace(t, dim=table_dim(t.num_rows)) for t in base.tables)
    model = replace(base, name="dcnv2-mixed-widths", tables=tables)
    model.validate()
    return model


@dataclass
class ClusterPlan:
    """One cluster's plan, its explanation, and where its files went."""

    label: str
    hw: HardwareSpec
    explanation: Explanation
    plan_file: Path

    def summary(self) -> dict[str, Any]:
        """The numbers the terminal and the report both show."""
        plan, ex = self.explanation.plan, self.explanation
        return {
            "cluster": self.label, "hardware": self.hw.name, "ranks": plan.world_size,
            "packs": len(plan.packs), "hot_rows": int(sum(plan.hot_rows.values())),
            "micro_batches": plan.micro_batches, "predicted_iteration_us": ex.evaluation.iteration_us,
            "speedup": ex.speedups(), "plan_file": str(self.plan_file),
        }


def skewed_log(out: Path, rows: int, seed: int) -> tuple[Path, AccessProfile]:
    """The synthetic log (Criteo 1TB's cardinalities, Zipf(ZIPF_S) IDs) and its access profile."""
    data = out / "skewed.tsv"
    generate_criteo(data, rows, seed=seed, cardinalities=CRITEO_1TB_CARDINALITIES, zipf_s=ZIPF_S)
    profile = profile_file(data, "criteo", batch_size=BATCH)
    profile.save(out / "skewed.profile.json")
    return data, profile


def plan_clusters(out: Path, profile: AccessProfile, log: Callable[[str], None] | None = None) -> list[ClusterPlan]:
    """Search a plan for each of CLUSTERS, explain it against the baselines, save plan and text."""
    model = mixed_width_model()
    access = table_access(model, profile)
    plans = []
    for i, (label, preset, overrides) in enumerate(CLUSTERS):
        if log:
            log(f"demo:   [{i + 1}/{len(CLUSTERS)}] planning for {label} ...")
        hw = load_hardware(preset, overrides)
        res = search(model, hw, access=access, batch_size_per_rank=BATCH, time_budget_s=SEARCH_S)
        path = out / f"cluster-{preset}.plan.json"
        res.plan.save(path, hot_ids=res.hot_ids or None)
        ex = explain(res.plan, hw, access=access)
        atomic_write_text(out / f"cluster-{preset}.explain.txt", ex.text() + "\n")
        plans.append(ClusterPlan(label, hw, ex, path))
    return plans


def cluster_lines(summaries: list[dict[str, Any]]) -> list[str]:
    """The what-if in a few lines: per cluster its plan's shape and its predicted speedups."""
    out = []
    for s in summaries:
        speed = ", ".join(f"{n} {v:.2f}x" for n, v in s["speedup"].items() if v) or "n/a"
        out.append(f"{s['cluster']}: {s['packs']} packs, {s['hot_rows']:,} hot rows replicated, "
                   f"{s['micro_batches']} micro-batch(es); predicted speedup over {speed}")
    return out


def cluster_section(plans: list[ClusterPlan], summaries: list[dict[str, Any]]) -> Section:
    """The what-if in the report: per cluster the packs and why their hot sets have their size,
    and the predicted speedup over each baseline (the numbers of `cluster_lines`)."""
    parts: list[str] = [paragraph(
        f"A synthetic log with Zipf({ZIPF_S:g}) IDs in every feature and Criteo 1TB's table sizes, for a "
        f"DCN-v2 model whose tables are {', '.join(str(d) for d in sorted({table_dim(c) for c in CRITEO_1TB_CARDINALITIES}))}"
        f" wide by size, planned for clusters this machine does not have (hardware presets), {BATCH:,} samples per "
        "GPU. Nothing here runs: the plan is searched and simulated. The same model and log, two clusters, two plans.")]
    for cp, s in zip(plans, summaries):
        ex = cp.explanation
        packs = [{"pack": p["pack"], "tables": len(p["tables"]), "sharding": p["sharding"], "width": p["dim"],
                  "rows": p["rows"], "hot rows": "all" if p["sharding"] == Sharding.REPLICATED else p["hot_rows"],
                  "lookups served by hot rows": percent(p["hot_coverage"])}
                 for p in ex.packs()]
        why = [{"pack": g["pack"], "tables": ", ".join(g["tables"]), "hot rows": g["hot_rows"], "why": g["why"]}
               for g in ex.hot_reasons()]
        speed = [{"baseline": n, "predicted speedup": f"{v:.2f}x" if v else "n/a",
                  "baseline iteration": duration_us(ex.baselines[n].iteration_us) if v else
                  (ex.baselines[n].problem or "")} for n, v in s["speedup"].items()]
        parts += [tag("h3", s["cluster"]), paragraph(cluster_lines([s])[0].split(": ", 1)[1] + "."),
                  paragraph(f"Predicted iteration {duration_us(s['predicted_iteration_us'])}; plan file "
                            f"{Path(s['plan_file']).name}."),
                  table_html(packs), table_html(why), table_html(speed)]
    figs = [bar_figure([n for n in summaries[0]["speedup"]],
                       {s["cluster"].split(",")[0]: [v or 0 for v in s["speedup"].values()] for s in summaries},
                       "Predicted speedup of the plan over each baseline, per cluster", "speedup (x)")]
    return Section("What-if: a skewed log on simulated GPU clusters", markup(*parts), figs)
