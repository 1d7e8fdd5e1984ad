"""The quality check on real data: DLRM trained for a few epochs on the real Criteo sample
(train_split.tsv, converted) under the planner's plan, under `naive` and under a plan with hot rows
and micro-batches reaches the single-process reference's test AUC to 1e-4 at every evaluation:
the parallel plan changes speed, not the model. Skipped where ../shared/data is absent."""

from __future__ import annotations

import json

import numpy as np
import pytest

from picasso.cli import main
from planner.plan import PackPlan, Plan

EPOCHS, BATCH = 3, 128  # per rank, 2 ranks: 28 steps per epoch of the 7,200 training rows


def _run(capsys, plan, ds, test) -> dict:
    rc = main(["run", str(plan), "--data", str(ds), "--epochs", str(EPOCHS), "--eval-data", str(test),
               "--eval-every", str(7200 // (2 * BATCH)), "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return json.loads(cap.out)


@pytest.mark.dist
def test_real_criteo_auc_is_the_same_under_every_plan(criteo_sample_dir, tmp_path, capsys):
    train, test = criteo_sample_dir / "train_split.tsv", criteo_sample_dir / "test_split.tsv"
    assert main(["analyze", str(train), "--format", "criteo", "-o", str(tmp_path / "profile.json"),
                 "--batch-size", str(2 * BATCH)]) == 0
    common = ["--model", "dlrm-criteo-kaggle", "--hardware", "local-cpu", "--set", "gpus_per_node=2", "--profile",
              str(tmp_path / "profile.json"), "--row-cap", "20000", "--batch-size", str(BATCH)]
    assert main(["plan", *common, "--time-budget", "5", "-o", str(tmp_path / "planned.json")]) == 0
    assert main(["plan", *common, "--baseline", "naive", "-o", str(tmp_path / "naive.json")]) == 0
    assert main(["convert", str(train), "--format", "criteo", "-o", str(tmp_path / "ds")]) == 0
    capsys.readouterr()
    planned = Plan.load(tmp_path / "planned.json")
    m, t = planned.model, planned.model.table_names
    big = [x.name for x in sorted(m.tables, key=lambda x: -x.num_rows)[:2]]
    Plan(m, 2, BATCH, [PackPlan("pack0", t[:13], "row_wise"), PackPlan("pack1", t[13:], "column_wise")],
         hot_rows={n: 256 for n in big}, micro_batches=2, kernel_interleaving=True, seed=planned.seed,
         optimizer=planned.optimizer).save(tmp_path / "hot.json", hot_ids={n: np.arange(256) for n in big})
    Plan(m, 1, 2 * BATCH, [PackPlan("pack0", t, "row_wise")], seed=planned.seed,
         optimizer=planned.optimizer).save(tmp_path / "reference.json", hot_ids={})
    ref = _run(capsys, tmp_path / "reference.json", tmp_path / "ds", test)
    assert ref["steps"] == EPOCHS * 28 and [e["step"] for e in ref["eval"]] == [28, 56, 84]
    assert ref["eval"][-1]["auc"] > 0.6  # it learned something (chance is 0.5)
    for name in ("planned", "naive", "hot"):
        res = _run(capsys, tmp_path / f"{name}.json", tmp_path / "ds", test)
        assert res["world_size"] == 2
        for a, b in zip(res["eval"], ref["eval"], strict=True):
            assert a["rows"] == b["rows"] == 391
            assert abs(a["auc"] - b["auc"]) <= 1e-4, (name, a, b)
            assert abs(a["logloss"] - b["logloss"]) <= 1e-5, (name, a, b)
