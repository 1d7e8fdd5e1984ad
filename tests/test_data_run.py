"""Data input through `picasso run`: a converted dataset per rank, evaluation equal under any plan,
malformed training rows counted (or stopping the run with --strict)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from picasso.cli import main
from planner.plan import PackPlan, Plan
from planner.presets import get_model


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from traces.convert import convert
    from traces.synth import generate_criteo

    d = tmp_path_factory.mktemp("datarun")
    generate_criteo(d / "train.tsv", 1024, seed=0)
    generate_criteo(d / "test.tsv", 301, seed=1)
    convert([str(d / "train.tsv")], "criteo", d / "train", shard_rows=300)
    m = replace(get_model("dlrm-criteo-kaggle").with_row_cap(500), bottom_mlp=(16, 16), top_mlp=(16, 1))
    Plan(m, 2, 32, [PackPlan("pack0", m.table_names[:20], "row_wise"),
                    PackPlan("pack1", m.table_names[20:], "column_wise")],
         hot_rows={"C1": 50}, micro_batches=2, kernel_interleaving=True).save(d / "plan2.json",
                                                                             hot_ids={"C1": np.arange(50)})
    Plan(m, 1, 64, [PackPlan("pack0", m.table_names, "row_wise")]).save(d / "plan1.json", hot_ids={})
    return d


def run_json(capsys, *argv) -> dict:
    rc = main(["run", *map(str, argv), "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return json.loads(cap.out)


@pytest.mark.dist
def test_dataset_run_evaluates_the_same_under_any_plan(setup, capsys):
    d = setup
    common = ["--data", d / "train", "--epochs", "2", "--eval-data", d / "test.tsv", "--eval-every", "8",
              "--eval-batch", "100"]
    two = run_json(capsys, d / "plan2.json", *common)
    one = run_json(capsys, d / "plan1.json", *common)
    assert two["steps"] == 2 * (1024 // 64) == one["steps"]
    assert [e["step"] for e in two["eval"]] == [8, 16, 24, 32]
    for a, b in zip(two["eval"], one["eval"]):
        assert a["rows"] == b["rows"] == 301
        assert abs(a["auc"] - b["auc"]) < 1e-4 and abs(a["logloss"] - b["logloss"]) < 1e-4
    assert two["eval"][-1]["logloss"] < two["eval"][0]["logloss"] or two["eval"][-1]["auc"] > 0.5


@pytest.mark.dist
def test_malformed_training_rows_are_counted_or_stop_the_run(setup, capsys):
    d = setup
    lines = (d / "train.tsv").read_text().splitlines(keepends=True)
    bad = d / "bad.tsv"
    bad.write_text("".join(lines[:100]) + "1\tnot-a-row\n" + "".join(lines[100:300]))
    res = run_json(capsys, d / "plan1.json", "--data", bad, "--steps", "4")
    assert res["data"]["malformed_rows_skipped"] == 1 and "bad.tsv:101" in res["data"]["first_malformed"]
    rc = main(["run", str(d / "plan1.json"), "--data", str(bad), "--steps", "4", "--strict"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "bad.tsv:101" in err[0]
