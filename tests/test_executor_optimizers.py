"""Tables whose optimizer the executor does not train are refused before any rank starts."""

from __future__ import annotations

from dataclasses import replace

from picasso.cli import main
from planner.builders import naive_plan
from planner.presets import get_model


def test_run_refuses_an_adam_table_in_one_line(tmp_path, capsys):
    m = get_model("dlrm-criteo-kaggle").with_row_cap(100)
    m = replace(m, tables=(replace(m.tables[0], optimizer="adam"),) + m.tables[1:])
    path = tmp_path / "adam.json"
    naive_plan(m, 1, 16).save(path)
    assert main(["run", str(path), "--data", "synthetic", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "table C1: optimizer adam is planned and simulated" in err[0]
