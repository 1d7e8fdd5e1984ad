"""Random rows beyond the TLB's reach (simulator.device_perf): both engines slow them alike, and
lowering says which memory a table's random rows are spread over."""

from __future__ import annotations

import pytest

from planner.builders import naive_plan
from planner.lowering import lower
from planner.model_spec import ModelSpec, TableSpec
from simulator import OpGraph, simulate
from simulator.device_perf import DevicePerf, DevicePerfError
from simulator.hardware import load_hardware
from tests.test_sim_helpers import toy_hw

GIB = float(1 << 30)


def test_rows_beyond_the_reach_miss_for_their_share():
    perf = DevicePerf(tlb_reach_bytes=8 * GIB, tlb_miss_cost=3.0)
    assert perf.random_slowdown(4 * GIB) == 1.0
    assert perf.random_slowdown(32 * GIB) == pytest.approx(1.0 + 3.0 * 0.75)
    assert DevicePerf().random_slowdown(1e15) == 1.0  # no reach given: no TLB term
    assert DevicePerf.from_dict(perf.to_dict()).random_slowdown(32 * GIB) == pytest.approx(3.25)
    with pytest.raises(DevicePerfError, match="tlb_reach_bytes"):
        DevicePerf.from_dict({"tlb_reach_bytes": -1})


@pytest.mark.parametrize("engine", ("fast", "simpy"))
def test_both_engines_slow_a_gather_over_a_large_table(engine):
    hw = toy_hw(perf={"tlb_reach_bytes": 8 * GIB, "tlb_miss_cost": 2.0})
    g = OpGraph(2)
    g.add_op("near", 0, "compute", hbm_bytes=4e8, eff_key="random", span_bytes=4 * GIB, table_bytes=3e8)
    # of its 400 MB, 300 MB are the table's rows: they wait for page walks, its output does not
    g.add_op("far", 1, "compute", hbm_bytes=4e8, eff_key="random", span_bytes=16 * GIB, table_bytes=3e8)
    g.add_op("stream", 1, "compute", hbm_bytes=4e8, span_bytes=16 * GIB, table_bytes=4e8,  # no random rows
             deps=("1:far",))
    ends = {e.name: e.end_us for e in simulate(g, hw, engine).timeline.events}
    assert ends["near"] == pytest.approx(400.0)
    assert ends["far"] == pytest.approx(400.0 + 300.0 * 2.0 * 0.5)
    assert ends["stream"] - ends["far"] == pytest.approx(400.0)


def test_lowering_spreads_a_gather_over_its_shard():
    tables = (TableSpec("big", 40_000_000, 128), TableSpec("small", 1000, 128))
    m = ModelSpec("tlb", "dlrm", 13, tables, bottom_mlp=(64, 128), top_mlp=(64, 1))
    hw = load_hardware("dgx-a100", ["nodes=1", "gpus_per_node=2"])
    lo = lower(naive_plan(m, 2, 4096), hw)
    big = lo.op("fwd/t_big/cold_gather")
    assert big.args["span_bytes"] == pytest.approx(40_000_000 * 512)
    assert 0 < big.demand["table_bytes"].max() < big.demand["hbm_bytes"].max()  # rows read, not the gathered copy
    assert lo.op("fwd/t_small/cold_gather").args["span_bytes"] == pytest.approx(1000 * 512)
    assert "span_bytes" not in lo.op("fwd/t_big/pool").args  # the batch's gathered rows, not the table
