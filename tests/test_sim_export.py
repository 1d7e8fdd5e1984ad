import json

import pytest

from simulator import Timeline, simulate
from simulator.export import timeline_html
from simulator.synthetic import layered_graph
from tests.test_sim_helpers import toy_hw


@pytest.fixture(scope="module")
def result():
    return simulate(layered_graph(4, layers=2, micro_batches=2), toy_hw(gpus_per_node=4), "simpy")


def test_timeline_events_and_chrome_trace(result, tmp_path):
    tl = result.timeline
    assert len(tl.events) == len(result.st.ids)
    assert tl.makespan_us() == pytest.approx(result.iteration_us)
    gather = next(e for e in tl.events if e.name == "mb0/l0/gather")
    assert gather.args["hbm_bytes"] == 5e7 and gather.args["kind"] == "memory"
    a2a = next(e for e in tl.events if e.name == "mb0/l0/a2a")
    assert a2a.args["collective"] == "all_to_all" and a2a.args["group_size"] == 4
    p = tmp_path / "trace.json"
    tl.save_chrome_trace(p)
    trace = json.loads(p.read_text())
    assert sum(1 for e in trace["traceEvents"] if e["ph"] == "X") == len(tl.events)
    tl.save(tmp_path / "tl.json")
    assert len(Timeline.load(tmp_path / "tl.json").events) == len(tl.events)


def test_html_gantt(result, tmp_path):
    p = tmp_path / "gantt.html"
    timeline_html(result.timeline, p)
    text = p.read_text().replace("\\u002f", "/")  # plotly's JSON escapes slashes
    assert "plotly" in text.lower() and "rank 3 / comm" in text and "mb1/l1/a2a" in text


def test_summary_fields(result):
    s = result.summary()
    assert s["iteration_us"] == result.iteration_us and s["ops"] == len(result.st.ids)
    assert 0 < s["utilisation"]["hbm"] <= 1 and 0 < s["utilisation"]["lane:compute"] <= 1
    assert s["critical_path"][-1].endswith("allreduce")
    assert s["peak_mem_bytes"] > 0
    json.dumps(s)  # serialisable


