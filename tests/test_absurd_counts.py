"""Counts no run could reach are refused in one line: `--steps 2**63`, a checkpoint claiming step 10**15."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from picasso.cli import main
from planner.plan import PackPlan, Plan
from planner.presets import get_model


@pytest.fixture()
def plan_path(tmp_path) -> Path:
    m = replace(get_model("dlrm-criteo-kaggle").with_row_cap(100), bottom_mlp=(8, 16), top_mlp=(8, 1))
    Plan(m, 1, 8, [PackPlan("pack0", m.table_names, "row_wise")]).save(tmp_path / "plan.json")
    return tmp_path / "plan.json"


@pytest.mark.parametrize("flag,value", [("--steps", 2**63), ("--epochs", 10**15)])
def test_a_step_count_no_run_could_reach_is_refused(plan_path, capsys, flag, value):
    rc = main(["run", str(plan_path), "--data", "synthetic", flag, str(value)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and flag in err[0] and "beyond" in err[0], err


def test_a_checkpoint_claiming_an_absurd_step_is_refused(tmp_path, plan_path):
    from executor.run.checkpoint import CheckpointError, read_manifest

    ck = tmp_path / "ck"
    assert main(["run", str(plan_path), "--data", "synthetic", "--steps", "1", "--checkpoint", str(ck)]) == 0
    for key in ("steps", "data_position"):
        m = json.loads((ck / "manifest.json").read_text())
        (ck / "manifest.json").write_text(json.dumps({**m, key: 10**15}))
        with pytest.raises(CheckpointError, match=f"field {key}"):
            read_manifest(ck)
        (ck / "manifest.json").write_text(json.dumps(m))
