"""The pages about planning: an access profile, a plan and its explanation, a what-if sweep.

Written with simulator.report (the one HTML writer) and simulator.export (the one Gantt).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from planner.explain import Explanation
from simulator.export import timeline_figure
from simulator.report import Section, bar_figure, json_block, table_html, write_page


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
    packs = [{**p, "tables": ", ".join(p["tables"][:8]) + (" ..." if len(p["tables"]) > 8 else "")}
             for p in d["packs"]]
    names = [n for n, v in d["baselines_us"].items() if v]
    sections = [
        Section("Packs", table_html(packs)),
        Section("Predicted timeline", figures=[timeline_figure(ex.evaluation.result.timeline)]),
        Section("Speedup over baselines", table_html(
            [{"baseline": n, "iteration_us": d["baselines_us"][n], "speedup": d["speedups"][n]} for n in d["speedups"]]
        ), figures=[bar_figure(["plan"] + names, {"iteration (us)": [d["predicted_iteration_us"]]
                                                   + [d["baselines_us"][n] for n in names]},
                               "predicted iteration time", "us")]),
        Section("Memory per rank (peak over ranks, GiB)", table_html(_memory_rows(d["memory"]))),
        Section("Time by phase and resource", json_block({"phase": d["time_by_phase_us"],
                                                           "resource": d["time_by_resource_us"]})),
    ]
    sub = (f"{d['model']} on {d['hardware']}: {d['world_size']} ranks, predicted "
           f"{d['predicted_iteration_us']:.1f} us per step ({d['engine']})")
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
    """Self-contained plotly report: coverage curves, batch presence, top-k coverage table."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    feats = list(prof.features.values())
    fig = make_subplots(
        rows=3, cols=1, row_heights=[0.38, 0.30, 0.32], vertical_spacing=0.08,
        specs=[[{"type": "xy"}], [{"type": "xy"}], [{"type": "table"}]],
        subplot_titles=(
            "Coverage: share of accesses served by the top x of distinct IDs",
            "Batch presence: IDs by the number of sampled batches they appear in"
            + (f" (batch {measured.batch_size if measured else prof.batch_size})"),
            "Top-k coverage",
        ),
    )  # fmt: skip
    for f in feats:
        x, y = f.coverage_curve()
        fig.add_trace(go.Scatter(x=x, y=y, name=f.name, mode="lines", legendgroup=f.name), row=1, col=1)
        if measured is not None and f.name in measured.features:
            mx, my = measured.features[f.name].coverage_curve()
            fig.add_trace(go.Scatter(x=mx, y=my, name=f"{f.name} (sample)", mode="lines", legendgroup=f.name,
                                     line={"dash": "dot"}, visible="legendonly"), row=1, col=1)  # fmt: skip
    src = measured if measured is not None else prof
    for f in src.features.values():
        h = np.asarray(f.presence_hist)
        if f.presence_batches and h.sum():
            j = np.arange(len(h))
            fig.add_trace(go.Bar(x=j[1:] / f.presence_batches, y=h[1:], name=f"{f.name} presence",
                                 legendgroup=f.name, showlegend=False), row=2, col=1)  # fmt: skip
    ks = (10, 100, 1000, 10000, 100000)
    header = ["feature", "distinct", "pooling", "top 0.1% (IDs)", "top 1% (IDs)", "top 10% (IDs)", *[f"top {k:,}" for k in ks], "kind"]
    cells = [
        [f.name for f in feats],
        [f"{f.distinct:,}" for f in feats],
        [f"{f.pooling:.3f}" for f in feats],
        *[[_cover(f, x) for f in feats] for x in (0.001, 0.01, 0.1)],
        *[[f"{f.coverage_at(k):.1%}" for f in feats] for k in ks],
        ["exact" if f.exact else ("extrapolated" if f.extrapolated_to else "sketch") for f in feats],
    ]
    fig.add_trace(go.Table(header={"values": header}, cells={"values": cells}), row=3, col=1)
    fig.update_xaxes(type="log", title_text="top fraction of distinct IDs", row=1, col=1)
    fig.update_yaxes(title_text="coverage", range=[0, 1.02], row=1, col=1)
    fig.update_xaxes(title_text="fraction of sampled batches an ID appears in", row=2, col=1)
    fig.update_yaxes(type="log", title_text="IDs", row=2, col=1)
    title = f"picasso analyze: {os.path.basename(prof.source)}, {prof.rows:,} rows"
    if measured is not None:
        title += f" (extrapolated from {measured.rows:,})"
    fig.update_layout(title=title, height=1500, barmode="overlay", template="plotly_white")
    write_page(path, title, [Section("Coverage, batch presence, top-k coverage", figures=[fig])])
