"""The pages about planning: an access profile, a plan and its explanation, a what-if sweep.

Written with simulator.report (the one HTML writer) and simulator.export (the one Gantt).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from foundation.numbers import count, duration_us, percent
from planner.explain import Explanation
from simulator.export import timeline_figure
from simulator.report import Section, bar_figure, coverage_figure, json_block, table_html, write_page


def _memory_rows(mem: dict) -> list[dict]:
    gib = 2.0**30
    rows = [{"memory": "device", "component": k, "GiB": v / gib} for k, v in mem["hbm_by_component"].items()]
    rows.append({"memory": "device", "component": "peak / capacity",
                 "GiB": f"{mem['hbm_peak'] / gib:.2f} / {mem['hbm_capacity'] / gib:.2f}"})
    rows += [{"memory": "host", "component": k, "GiB": v / gib} for k, v in mem["host_by_component"].items()]
    rows.append({"memory": "host", "component": "peak / capacity",
                 "GiB": f"{mem['host_peak'] / gib:.2f} / {mem['host_capacity'] / gib:.2f}"})
    return rows


def write_plan_html(path: str | os.PathLike, ex: Explanation) -> None:
    """The explanation as one HTML page: tables, the simulated timeline, speedups."""
    d = ex.to_dict()
    packs = [{**p, "tables": ", ".join(p["tables"][:8]) + (" ..." if len(p["tables"]) > 8 else ""),
              "ranks": p["ranks"] if p["ranks"] == "all" else ", ".join(map(str, p["ranks"])),
              "hot_coverage": percent(p["hot_coverage"]),
              # the pack's cold exchange as rows and as pooled vectors; none where only rows can run
              "exchange_us": "" if not p["exchange_us"] else ", ".join(
                  f"{k} {duration_us(v)}" for k, v in p["exchange_us"].items())}
             for p in d["packs"]]
    names = [n for n, v in d["baselines_us"].items() if v]
    sections = [
        Section("Packs", table_html(packs)),
        Section("Predicted timeline", figures=[timeline_figure(ex.evaluation.result.timeline)]),
        Section("Speedup over baselines", table_html(
            [{"baseline": n, "iteration": duration_us(d["baselines_us"][n]),
              "speedup": f"{d['speedups'][n]:.2f}x" if d["speedups"][n] else d["baseline_problems"].get(n, "n/a")}
             for n in d["speedups"]]
        ), figures=[bar_figure(["plan"] + names, {"iteration (us)": [d["predicted_iteration_us"]]
                                                   + [d["baselines_us"][n] for n in names]},
                               "predicted iteration time", "us")]),
        Section("Hot rows, per pack", table_html([{"pack": g["pack"], "tables": ", ".join(g["tables"]),
                                                   "hot rows": g["hot_rows"], "why": g["why"]}
                                                  for g in d["hot_reasons"]])),
        Section("Memory per rank (peak over ranks, GiB)", table_html(_memory_rows(d["memory"]))),
        Section("Time by phase and resource", json_block({"phase": d["time_by_phase_us"],
                                                           "resource": d["time_by_resource_us"]})),
    ]
    sub = (f"{d['model']} on {d['hardware']}: {d['world_size']} ranks, predicted "
           f"{duration_us(d['predicted_iteration_us'])} per step ({d['engine']}), {count(d['samples_per_s'])} samples/s")
    write_page(path, "picasso plan", sections, subtitle=sub)


def write_sweep_html(path: str | os.PathLike, plan_file: str, key: str, rows: list[dict[str, Any]]) -> None:
    """`picasso simulate --sweep KEY=...`: the iteration and throughput per value, table and plots."""
    values = [str(r[key]) for r in rows]
    sections = [
        Section(f"Predicted iteration per {key}", table_html(rows),
                [bar_figure(values, {"iteration (us)": [r["iteration_us"] for r in rows]},
                            f"predicted iteration vs {key}", "us"),
                 bar_figure(values, {"samples/s": [r["samples_per_s"] for r in rows]},
                            f"predicted throughput vs {key}", "samples/s")]),
    ]
    write_page(path, "picasso simulate --sweep", sections, subtitle=f"plan {plan_file}, {key} over {len(rows)} values",
               side_by_side=[0])


def _cover(f, x: float) -> str:
    from traces.coverage import top_ids

    return f"{f.coverage(x):.1%} ({top_ids(x, f.distinct):,})"


def write_profile_html(path: str | os.PathLike, prof: Any, measured: Any = None) -> None:
    """Self-contained report: coverage curves (one small chart per feature beyond a few, the
    sample's own curve dotted beside an extrapolation), batch presence, top-k coverage table."""
    import plotly.graph_objects as go

    feats = list(prof.features.values())
    curves = {f.name: f.coverage_curve() for f in feats}
    sample = ({f.name: measured.features[f.name].coverage_curve() for f in feats if f.name in measured.features}
              if measured is not None else None)
    coverage = coverage_figure(curves, "Coverage: share of lookups served by the hottest IDs", second=sample,
                               second_name="sample before extrapolation")
    src = measured if measured is not None else prof
    presence = go.Figure()
    for f in src.features.values():
        h = np.asarray(f.presence_hist)
        if f.presence_batches and h.sum():
            j = np.arange(len(h))
            presence.add_trace(go.Bar(x=j[1:] / f.presence_batches, y=h[1:], name=f.name))
    presence.update_layout(title="Batch presence: IDs by the share of sampled batches they appear in"
                           + f" (batch {measured.batch_size if measured else prof.batch_size})",
                           barmode="overlay", height=420)
    presence.update_xaxes(title_text="share of sampled batches an ID appears in", tickformat=".0%")
    presence.update_yaxes(type="log", title_text="IDs")
    ks = (10, 100, 1000, 10000, 100000)
    rows = [{"feature": f.name, "distinct": f.distinct, "pooling": f"{f.pooling:.3f}",
             **{f"top {x:.1%} (IDs)".replace(".0%", "%"): _cover(f, x) for x in (0.001, 0.01, 0.1)},
             **{f"top {k:,}": percent(f.coverage_at(k)) for k in ks},
             "kind": "exact" if f.exact else ("extrapolated" if f.extrapolated_to else "sketch")} for f in feats]
    title = f"picasso analyze: {os.path.basename(prof.source)}, {prof.rows:,} rows"
    if measured is not None:
        title += f" (extrapolated from {measured.rows:,})"
    write_page(path, title, [Section("Coverage", figures=[coverage]), Section("Batch presence", figures=[presence]),
                             Section("Top-k coverage", table_html(rows))])
