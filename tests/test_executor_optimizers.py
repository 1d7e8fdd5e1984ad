"""Tables trained with Adagrad and Adam (executor.sparse.row_optimizers): their updates against
torch's optimizers, a run verified against the single-process reference, and the plans the
executor refuses in one line (executor.sparse.optimizers)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from executor.sparse import row_optimizers
from picasso.cli import main
from planner.builders import naive_plan, random_plan
from planner.plan import PackPlan, Plan
from planner.presets import get_model
from planner.sharding import Sharding


def test_adagrad_and_adam_update_the_touched_rows_as_torch_does():
    torch.manual_seed(0)
    w0 = torch.randn(6, 4)
    rows = torch.tensor([4, 1, 4])  # row 4 twice: its gradients are summed
    grads = torch.randn(3, 4)
    summed = torch.zeros(6, 4).index_add_(0, rows, grads)
    touched = torch.tensor([1, 4])
    for opt, make in (("adagrad", lambda p: torch.optim.Adagrad([p], lr=0.1, eps=1e-8)),
                      ("adam", lambda p: torch.optim.Adam([p], lr=0.1, eps=1e-8))):
        w, state = w0.clone(), row_optimizers.new_state(opt, 6, 4)
        for step in range(2):
            row_optimizers.sparse_update(w, state, rows, grads, opt, 0.1, 1e-8, step)
        sub = torch.nn.Parameter(w0[touched].clone())  # lazy: torch's optimizer on the touched rows alone
        o = make(sub)
        for _ in range(2):
            sub.grad = summed[touched].clone()
            o.step()
        assert torch.allclose(w[touched], sub.detach(), atol=1e-6), opt
        untouched = torch.tensor([0, 2, 3, 5])
        assert torch.equal(w[untouched], w0[untouched])
    w, state = w0.clone(), row_optimizers.new_state("adam", 6, 4)
    row_optimizers.dense_update(w, state, summed, "adam", 0.1, 1e-8, 0)  # zero rows stay as they are
    assert torch.equal(w[untouched], w0[untouched]) and not torch.equal(w[touched], w0[touched])


def adam_model():
    m = get_model("dlrm-criteo-kaggle").with_row_cap(200)
    opts = ("adam", "adagrad", "rowwise_adagrad", "sgd")
    return replace(m, tables=tuple(replace(t, optimizer=opts[i % 4]) for i, t in enumerate(m.tables)))


@pytest.mark.dist
def test_adam_and_adagrad_tables_train_as_the_reference_does(tmp_path, capsys):
    m = adam_model()
    plan, hot = random_plan(m, 2, 32, np.random.default_rng(3), packing=True, sharding=Sharding.ROW_WISE, hot="some",
                            micro_batches=2)
    path = tmp_path / "adam.json"
    plan.save(path, hot_ids=hot)
    assert main(["run", str(path), "--data", "synthetic", "--steps", "3", "--nproc", "2", "--verify"]) == 0
    capsys.readouterr()


def test_run_refuses_what_the_executor_does_not_update_in_one_line(tmp_path, capsys):
    m = adam_model()
    low = replace(m, tables=(replace(m.tables[0], dtype="bf16"),) + m.tables[1:])
    column = naive_plan(m, 2, 16)
    column.packs[0] = PackPlan(column.packs[0].name, column.packs[0].tables, Sharding.COLUMN_WISE)
    for plan, needle in ((naive_plan(low, 1, 16), "table C1: optimizer adam on a bf16 table"),
                         (column, "table C1: optimizer adam in column_wise pack")):
        path = tmp_path / "p.json"
        plan.validate()
        plan.save(path)
        assert main(["run", str(path), "--data", "synthetic", "--steps", "1"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
    assert Plan.load(path).packs[0].sharding == Sharding.COLUMN_WISE
