"""Figures that read right: a colour per lane, simulated and measured timelines on one time axis,
coverage axes in percent, small multiples for many features, an AUC axis that does not magnify
noise, titles clear of plotly's toolbar, fits flagged in words, plan pages without raw keys."""

from __future__ import annotations

from simulator.calibration import fit_problem
from simulator.export import LANE_COLOURS, shared_timelines, timeline_figure
from simulator.measured import (
    BUCKET_LANE,
    COMM_LANE,
    INPUT_COPY_LANE,
    INPUT_LANE,
    NODE_LANE,
    PEERS_LANE,
    SYNC_LANE,
)
from simulator.report import Section, coverage_figure, padded_range, readable, render
from simulator.timeline import Timeline

LANES = ("compute", COMM_LANE, "copy", "nic", "memory", "host", INPUT_LANE, INPUT_COPY_LANE, BUCKET_LANE, SYNC_LANE,
         NODE_LANE, PEERS_LANE)


def lane_timeline(lanes, length_us: float) -> Timeline:
    tl = Timeline()
    for i, lane in enumerate(lanes):
        tl.add(0, lane, f"op{i}", i * 10.0, length_us - i * 10.0)
    return tl


def test_every_lane_has_its_own_colour():
    fig = timeline_figure(lane_timeline((*LANES, "other_lane", "another_lane"), 1000.0))
    colours = {t.name: t.marker.color for t in fig.data}
    assert len(colours) == len(LANES) + 2
    assert len(set(colours.values())) == len(colours), colours
    assert colours[COMM_LANE] != colours[SYNC_LANE] != colours[BUCKET_LANE] != colours[COMM_LANE]
    assert set(LANES) <= set(LANE_COLOURS)


def test_simulated_and_measured_share_one_time_axis():
    sim, meas = lane_timeline(("compute", COMM_LANE), 45_000.0), lane_timeline(("compute", SYNC_LANE), 85_000.0)
    a, b = shared_timelines({"simulated": sim, "measured": meas})
    assert list(a.layout.xaxis.range) == list(b.layout.xaxis.range) and a.layout.xaxis.range[1] >= 85.0


def test_coverage_axes_are_percentages_and_many_features_get_small_multiples():
    x = [1e-6, 1e-4, 1e-2, 1.0]
    few = coverage_figure({f"C{i}": (x, [0.2, 0.5, 0.8, 1.0]) for i in range(3)}, "c")
    labels = list(few.layout.xaxis.ticktext)
    assert labels[0] == "0.0001%" and labels[-1] == "100%" and "1μ" not in labels
    assert few.layout.yaxis.tickformat == ".0%"
    many = coverage_figure({f"C{i}": (x, [0.2, 0.5, 0.8, 1.0]) for i in range(26)}, "c")
    axes = [k for k in many.layout.to_plotly_json() if k.startswith("xaxis")]
    assert len(axes) >= 26 and all(not t.showlegend for t in many.data)


def test_an_auc_axis_does_not_magnify_noise():
    lo, hi = padded_range([0.4935, 0.4950], 0.1, include=(0.5,))
    assert hi - lo >= 0.1 and lo <= 0.4935 and hi >= 0.5
    lo, hi = padded_range([0.60, 0.79], 0.1)
    assert lo < 0.60 and hi > 0.79 and hi - lo < 0.25  # a real change keeps its scale


def test_titles_sit_below_the_toolbar():
    fig = coverage_figure({"C1": ([0.01, 1.0], [0.5, 1.0])}, "a long title " * 8)
    readable(fig)
    assert fig.layout.title.yref == "container" and fig.layout.title.y < 1 and fig.layout.margin.t >= 80
    page = render("t", [Section("s", figures=[fig])])
    assert '"yref":"container"' in page


def test_degenerate_and_poor_fits_are_flagged_in_words():
    assert "degenerate" in fit_problem(2.2e20, 0.05, 0.1)
    assert "poor fit" in fit_problem(5e9, 0.885, 1.2) and "88%" in fit_problem(5e9, 0.885, 1.2)
    assert fit_problem(5e9, 0.03, 0.08) is None


def test_an_op_the_device_never_runs_does_not_flag_every_plan():
    """On CPU ranks no run measures the next batch's host-to-device copy: it is in every plan's graph but
    is no extrapolation, so it must not put every plan under the 'not fitted' caveat."""
    import networkx as nx

    from validation.compare import unfitted_classes

    class Graph:
        def __init__(self):
            self.g = nx.DiGraph()
            self.g.add_node("0:fwd/input/h2d_next", name="fwd/input/h2d_next")
            self.g.add_node("0:fwd/dense/top_mlp", name="fwd/dense/top_mlp")

        def ops(self):
            return self.g.nodes(data=True)

    fitted = {"fwd/dense/top_mlp": {"worlds": {"2": {}}}}
    assert "fwd/input/h2d_next" in " ".join(unfitted_classes(Graph(), 2, fitted))
    assert unfitted_classes(Graph(), 2, fitted, {"fwd/dense/top_mlp": 120.0}) == []


def test_the_plan_page_has_no_raw_keys_or_none(tmp_path):
    from planner.explain import explain
    from planner.plan import PackPlan, Plan
    from planner.presets import get_model
    from planner.report import write_plan_html
    from simulator.hardware import load_hardware

    m = get_model("dlrm-criteo-kaggle").with_row_cap(200)
    hw = load_hardware("local-cpu", ["nodes=1", "gpus_per_node=2"])
    plan = Plan(m, 2, 64, [PackPlan("pack0", m.table_names, "replicated")])
    write_plan_html(tmp_path / "plan.html", explain(plan, hw))
    page = (tmp_path / "plan.html").read_text()
    body = page[page.index("<h2>"):]
    tables = "".join(body.split("<table>")[1:])
    for raw in ("exchange_us", "None", "a2a_bytes_per_step", "hot_coverage", "e+0"):
        assert raw not in tables.split("<script")[0], raw
    assert "exchange (us)" in tables and "replicated pack: every row is local" in page
