"""The validation pages: summary, predicted against measured, per plan, per op, one timeline pair."""

from __future__ import annotations

from typing import Any

from foundation.numbers import percent
from simulator.export import shared_timelines
from simulator.measured import one_step
from simulator.report import Section, bar_figure, bold, markup, paragraph, scatter_figure, table_html, tag
from validation.compare import spearman_text


def validation_sections(result: dict[str, Any], runs: list[Any]) -> list[Section]:
    """Report sections: summary, scatter, per-plan table, per-op errors, one timeline pair."""
    s = result["summary"]
    met = result["goal"]["met"]
    lines = [paragraph(
        f"{s['plans']} validated plans ({result.get('plans_fit', 0)} more used to fit). MAPE ",
        bold(f"{s['mape']:.1%}"), ", Spearman ", bold(spearman_text(s)),
        f", {s['within_10pct']} of {s['plans']} within 10%. Goal (MAPE \u2264 10%, Spearman \u2265 0.9): ",
        tag("span", "met" if met else "not met", cls="ok" if met else "fail"), ".")]
    if "microbench_only" in result:
        mb = result["microbench_only"]
        choice = result["refit"].get("choice")
        if choice:
            lines.append(paragraph(f"Rates kept: {choice['kept']} ({choice['why']})."))
        lines.append(paragraph(f"With microbenchmark calibration only: MAPE {mb['mape']:.1%}, Spearman "
                     f"{spearman_text(mb)}. Refit on the fit plans' op timings: "
                     f"coefficients per world size for {len(result['refit']['op_classes'])} op classes "
                     "(compute ops and collectives); untimed host time per step "
                     + ", ".join(f"{v['step_us'] / 1e3:.2f} ms at {w} rank(s)"
                                 for w, v in result['refit'].get('host_gaps', {}).get('worlds', {}).items())
                     + "."))
    u = result.get("unfitted")
    if u and u["plans"]:
        others = "" if u["mape_others"] is None else f", {percent(u['mape_others'])} on the others"
        lines.append(paragraph(f"{u['plans']} of {s['plans']} validated plans ran op classes that no fit plan ran at "
                     f"their world size (their coefficients there are extrapolated; listed per plan below): "
                     f"MAPE {percent(u['mape_those'])} on those{others}."))
    rows = [{"plan": r["name"], "role": r["role"], "ranks": r["knobs"].get("world"),
             "batch/rank": r["knobs"].get("batch"), "measured (ms)": r["measured_us"] / 1e3,
             "predicted (ms)": r["predicted_us"] / 1e3, "error": f"{r['error']:+.1%}",
             "samples/s": r["samples_per_s"],
             "op classes not fitted at its world": ", ".join(r.get("unfitted_classes", [])) or "-"}
            for r in result["per_plan"]]
    ops = [{"op": k, **{name: percent(x) if "error" in name else x for name, x in v.items()}}
           for k, v in result["op_errors"].items()]
    secs = [
        Section("Predicted against measured", markup(*lines),
                [scatter_figure([{"name": r["name"], "measured_us": r["measured_us"],
                                  "predicted_us": r["predicted_us"]} for r in result["per_plan"]
                                 if r["role"] == "validate"], "Iteration time, validated plans")]),
        Section("Per plan", table_html(rows)),
        Section("Per-op errors of the dominant ops (signed: predicted - measured, over measured)",
                table_html(ops),
                [bar_figure(list(result["op_errors"]),
                            {"mean abs error": [v["mean_abs_error"] for v in result["op_errors"].values()],
                             "mean error": [v["mean_error"] for v in result["op_errors"].values()]},
                            "Per-op error", "error (predicted - measured) / measured", percent=True)] if ops else []),
    ]
    if runs:
        # The plan with the median error: a typical case, not the best one.
        order = sorted(range(len(runs)), key=lambda i: abs(result["per_plan"][i]["error"]))
        c, m, p = runs[order[len(order) // 2]]
        secs.append(Section(f"Timelines of a typical plan: {c.name}, one time axis", "",
                            shared_timelines({"simulated": p.timeline,
                                              "measured (median timed step)": one_step(m.timeline)})))
    return secs


def replay_sections(out: dict[str, Any], sweep: str) -> list[Section]:
    """The page of `validate --replay`: the refit's predictions of a finished sweep's saved runs."""
    s = out["summary"]
    spearman = "-" if s["spearman"] is None else f"{s['spearman']:.3f}"
    mape = "-" if s["mape"] is None else f"{s['mape']:.1%}"
    head = paragraph(f"Replayed from {sweep}, nothing run: {s['plans']} validated plans predicted after a refit "
                     "on the sweep's fit plans. MAPE ", bold(mape), ", Spearman ", bold(spearman), ".")
    rows = [{"plan": r["name"], "role": r["role"], "ranks": r["world"], "measured ms": r["measured_us"] / 1e3,
             "predicted ms": r["predicted_us"] / 1e3, "error": f"{r['error']:+.1%}"} for r in out["per_plan"]]
    worlds = [{"ranks": w, "plans": v["plans"], "MAPE": v["mape"]} for w, v in out["summary_by_world"].items()]
    return [Section("Predicted against measured", head,
                    [scatter_figure([r for r in out["per_plan"] if r["role"] == "validate"],
                                    "Iteration time, validated plans")]),
            Section("Per plan", table_html(rows)),
            Section("Per world size", table_html(worlds))]
