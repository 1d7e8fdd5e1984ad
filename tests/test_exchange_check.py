"""A run counts the cold rows each pack really exchanged and sets them beside the plan's
prediction (executor.sparse.exchange_check); a hot set that misses the data is named, not silent."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from executor.sparse.exchange_check import exchange_report
from picasso.cli import main
from planner.access import table_access
from planner.lowering import analyze
from planner.plan import PackPlan, Plan, Prediction, Provenance
from planner.presets import get_model
from simulator.hardware import load_hardware


def test_plan_records_the_cold_rows_lowering_predicts(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "dgx-h100", "--set", "nodes=1",
                 "--set", "gpus_per_node=2", "--batch-size", "512", "--time-budget", "2", "-o", str(out), "--json"]) == 0
    capsys.readouterr()
    plan = Plan.load(out)
    cold = plan.prediction.cold_per_mb
    hw = load_hardware("dgx-h100", ["nodes=1", "gpus_per_node=2"])
    packs, _, _ = analyze(plan, hw, table_access(plan.model))
    assert cold == pytest.approx({pv.name: pv.cold_unique for pv in packs})
    assert all(v > 0 for v in cold.values())
    assert Plan.load(out).prediction.cold_per_mb == cold  # saved and read back


def test_report_names_a_pack_over_its_prediction_and_says_why():
    ranks = [{"a": (900.0, 10.0), "b": (100.0, 0.0)}, {"a": (1100.0, 30.0), "b": (120.0, 0.0)}]
    rows, note = exchange_report(ranks, {"a": 200.0, "b": 100.0}, assumed_access=True)
    assert rows["a"] == {"cold_per_mb": 1000.0, "hot_per_mb": 20.0, "predicted_cold_per_mb": 200.0,
                         "measured_over_predicted": 5.0}
    assert rows["b"]["measured_over_predicted"] == pytest.approx(1.1)
    assert note is not None and "a 1,000 against 200" in note and " b " not in note and "--profile" in note
    _, note = exchange_report(ranks, {"a": 200.0}, assumed_access=False)
    assert "re-profile" in note
    # within 1.5x, or only a few rows over a tiny prediction: nothing to say
    assert exchange_report(ranks, {"a": 900.0, "b": 100.0}, True)[1] is None
    assert exchange_report([{"c": (40.0, 0.0)}], {"c": 1.0}, True)[1] is None
    # no prediction (an older plan): the counts alone
    rows, note = exchange_report(ranks, {}, True)
    assert note is None and "predicted_cold_per_mb" not in rows["a"]


def test_a_fused_prediction_is_set_beside_the_sum_of_its_packs():
    # TorchRec's table-wise packs are scored as one fused exchange, "first..last"
    ranks = [{"t0": (500.0, 0.0), "t1": (300.0, 0.0), "t2": (200.0, 0.0), "x": (7.0, 1.0)}]
    rows, note = exchange_report(ranks, {"t0..t2": 1000.0}, False, ["x", "t0", "t1", "t2"])
    assert rows["t0..t2"] == {"cold_per_mb": 1000.0, "hot_per_mb": 0.0, "predicted_cold_per_mb": 1000.0,
                              "measured_over_predicted": 1.0}
    assert rows["t1"] == {"cold_per_mb": 300.0, "hot_per_mb": 0.0} and note is None
    rows, note = exchange_report(ranks, {"t0..t1": 100.0}, False, ["x", "t0", "t1", "t2"])
    assert rows["t0..t1"]["cold_per_mb"] == 800.0 and "t0..t1 800 against 100" in note


def _tsv(path, rows: int, first: int = 1) -> None:
    """Criteo TSV rows whose categories cycle through eight IDs, first..first+7, row by row: any
    micro-batch of eight or more consecutive rows looks up exactly eight rows of every table."""
    lines = []
    for i in range(rows):
        v = f"{first + i % 8:08x}"
        lines.append("\t".join([str(i % 2)] + ["1"] * 13 + [v] * 26))
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.dist
def test_run_counts_the_cold_rows_and_names_a_missed_hot_set(tmp_path, capsys):
    _tsv(tmp_path / "d.tsv", 256)
    m = replace(get_model("dlrm-criteo-kaggle").with_row_cap(500), bottom_mlp=(16, 16), top_mlp=(16, 1))
    # C1's eight IDs are hot; a 2-rank row-wise pack then sends the other tables' rows
    plan = Plan(m, 2, 32, [PackPlan("pack0", m.table_names, "row_wise")], hot_rows={"C1": 8}, micro_batches=2,
                kernel_interleaving=True, provenance=Provenance(access_source=["zipf(1.05)"]),
                prediction=Prediction(cold_per_mb={"pack0": 10.0}))
    plan.save(tmp_path / "miss.json", hot_ids={"C1": np.arange(1, 9)})
    _tsv(tmp_path / "eval.tsv", 100, first=9)  # held-out rows of other IDs: not counted as training's
    rc = main(["run", str(tmp_path / "miss.json"), "--data", str(tmp_path / "d.tsv"), "--steps", "3", "--json",
               "--eval-data", str(tmp_path / "eval.tsv"), "--eval-every", "1", "--eval-batch", "50"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    res = json.loads(cap.out)
    # distinct rows of IDs 1..8 in each table but C1 (tables under 8 rows fold them: ID % rows)
    cold = sum(len({i % t.num_rows for i in range(1, 9)}) for t in m.tables if t.name != "C1")
    assert res["exchange"]["pack0"]["cold_per_mb"] == cold > 150
    assert res["exchange"]["pack0"]["hot_per_mb"] == 8.0
    assert res["exchange"]["pack0"]["measured_over_predicted"] == cold / 10
    assert f"pack0 {cold} against 10" in res["exchange_note"] and "--profile" in res["exchange_note"]
    assert res["exchange_note"] in cap.err
    # predicted as it is: no note
    plan.prediction = Prediction(cold_per_mb={"pack0": float(cold)})
    plan.save(tmp_path / "hit.json", hot_ids={"C1": np.arange(1, 9)})
    rc = main(["run", str(tmp_path / "hit.json"), "--data", str(tmp_path / "d.tsv"), "--steps", "3", "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    res = json.loads(cap.out)
    assert res["exchange"]["pack0"]["measured_over_predicted"] == 1.0 and "exchange_note" not in res
    # each rank's CPU time per timed step comes back beside the wall time
    cpu = res["cpu_ms_per_step_per_rank"]
    assert len(cpu) == 2 and all(0 < c < 60_000 for c in cpu)
