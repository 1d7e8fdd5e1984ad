import json

import numpy as np
import pytest

from planner.access import table_access
from planner.builders import BASELINES, baseline_plan
from planner.errors import PlanError
from planner.explain import explain
from planner.plan import Plan
from planner.presets import get_model
from planner.search import byte_costs, evaluate, hot_threshold_rows, search
from simulator.hardware import load_hardware


@pytest.fixture(scope="module")
def kaggle_p2res():
    m = get_model("dlrm-criteo-kaggle")
    hw = load_hardware("p2res-v100")
    return m, hw, search(m, hw, batch_size_per_rank=4096)


def test_search_is_deterministic_and_beats_baselines(kaggle_p2res):
    m, hw, res = kaggle_p2res
    again = search(m, hw, batch_size_per_rank=4096)
    a, b = res.plan.to_dict(), again.plan.to_dict()
    a["prediction"].pop("fast_iteration_us"), b["prediction"].pop("fast_iteration_us")
    assert a == b
    assert all(np.array_equal(res.hot_ids[t], again.hot_ids[t]) for t in res.hot_ids)
    ex = explain(res.plan, hw, evaluation=res.best)
    s = ex.speedups()
    assert set(s) == set(BASELINES)
    assert s["naive"] >= 3 and s["torchrec-like"] >= 1.5
    assert all(v is None or v >= 1.0 for v in s.values())


def test_plan_and_hot_ids_round_trip(kaggle_p2res, tmp_path):
    m, hw, res = kaggle_p2res
    assert res.plan.hot_rows, "p2res favours hot replication"
    res.plan.save(tmp_path / "plan.json", hot_ids=res.hot_ids)
    back = Plan.load(tmp_path / "plan.json")
    ids = back.load_hot_ids()
    assert set(ids) == {t for t, n in back.hot_rows.items() if n}
    for t, rows in ids.items():
        assert len(np.unique(rows)) == len(rows) == back.hot_rows[t] <= m.table(t).num_rows


def test_closed_form_threshold_grows_with_micro_batches_and_skew():
    m = get_model("dlrm-criteo-kaggle")
    hw = load_hardware("p2res-v100")
    acc = table_access(m)
    c_a2a, c_ar = byte_costs(hw, hw.world_size)
    t = m.table("C3")
    n1 = hot_threshold_rows(t, acc["C3"], 4096, 1, c_a2a, c_ar)
    n4 = hot_threshold_rows(t, acc["C3"], 1024, 4, c_a2a, c_ar)
    assert 0 < n1 < n4 < t.num_rows
    # a row is hot when its presence probability per micro-batch exceeds the threshold
    theta = t.bytes_per_row * c_ar / ((4 + 2 * t.bytes_per_row) * c_a2a)  # int32 IDs
    _, p = acc["C3"].head(n1 - 1, 2)
    q = 1 - (1 - p) ** (4096 * acc["C3"].pooling)
    assert q[0] >= theta * (1 - 1e-6) and q[1] < theta * (1 + 1e-6)


def test_time_budget_is_respected_and_still_returns_a_plan():
    m = get_model("dlrm-criteo-kaggle")
    hw = load_hardware("dgx-h100")
    res = search(m, hw, batch_size_per_rank=1024, time_budget_s=0.0)
    assert res.plan.validate() is None and res.best.iteration_us > 0
    assert len(res.candidates) < 10


@pytest.mark.parametrize("name", BASELINES)
def test_baselines_are_valid_runnable_plans(name, tmp_path):
    m = get_model("dlrm-criteo-kaggle").with_row_cap(1000)
    hw = load_hardware("local-cpu", ["nodes=1", "gpus_per_node=2"])
    plan = baseline_plan(name, m, 2, 64, hw)
    plan.save(tmp_path / "b.json")
    back = Plan.load(tmp_path / "b.json")
    assert back.provenance.baseline == name and not back.hot_rows
    assert evaluate(back, hw, table_access(m), "fast").iteration_us > 0
    if name == "naive":
        assert [p.ranks for p in back.packs[:3]] == [[0], [1], [0]] and all(len(p.tables) == 1 for p in back.packs)


def test_torchrec_like_balances_table_wise_load():
    m = get_model("dlrm-criteo-kaggle")
    plan = baseline_plan("torchrec-like", m, 8, 4096, load_hardware("dgx-h100"))
    kinds = {p.sharding for p in plan.packs}
    assert kinds <= {"row_wise", "table_wise"} and "table_wise" in kinds
    assert sum(len(p.tables) for p in plan.packs) == 26
    with pytest.raises(PlanError, match="unknown baseline"):
        baseline_plan("magic", m, 8, 4096)


def test_cpu_plan_with_row_cap_is_executable_shape(tmp_path):
    m = get_model("dlrm-criteo-kaggle").with_row_cap(500)
    hw = load_hardware("local-cpu", ["nodes=1", "gpus_per_node=2"])
    res = search(m, hw, batch_size_per_rank=64, time_budget_s=5)
    res.plan.save(tmp_path / "p.json", hot_ids=res.hot_ids or None)
    d = json.loads((tmp_path / "p.json").read_text())
    assert d["world_size"] == 2 and d["batch_size_per_rank"] % d["micro_batches"] == 0
    assert all(t["num_rows"] <= 500 for t in d["model"]["tables"])


def test_torchrec_like_is_scored_with_a_fused_exchange():
    m = get_model("dlrm-criteo-kaggle")
    hw = load_hardware("p2res-v100")
    acc = table_access(m)
    plan = baseline_plan("torchrec-like", m, hw.world_size, 4096, hw, acc)
    assert plan.exchange == "per_pack" and plan.provenance.scoring == "fused_table_wise"
    fused = evaluate(plan, hw, acc, "fast", fuse_table_wise=True)
    apart = evaluate(plan, hw, acc, "fast")
    tw = [p for p in plan.packs if p.sharding == "table_wise"]
    assert len(tw) > 1
    assert len(fused.lowered.packs) == len(plan.packs) - len(tw) + 1
    assert fused.iteration_us < apart.iteration_us
    # the fused exchange still carries every table's traffic
    assert sum(pv.cold_unique for pv in fused.lowered.packs) == pytest.approx(
        sum(pv.cold_unique for pv in apart.lowered.packs))


def test_cold_rows_move_to_host_memory_when_device_memory_is_short():
    m = get_model("dlrm-mlperf")  # ~90 GB of tables
    hw = load_hardware("dgx-h100", ["gpu.hbm_bytes=8GB"])
    res = search(m, hw, batch_size_per_rank=1024, micro_batch_options=(1, 2), time_budget_s=10)
    assert any(p.placement == "host" for p in res.plan.packs)
    mem = res.best.lowered.memory
    assert mem.fits() and mem.host_total.max() > 0
    tiny = load_hardware("dgx-h100", ["gpu.hbm_bytes=8GB", "host.dram_bytes=16GB"])
    with pytest.raises(PlanError, match="does not fit"):
        search(m, tiny, batch_size_per_rank=1024, micro_batch_options=(1,), time_budget_s=10)
