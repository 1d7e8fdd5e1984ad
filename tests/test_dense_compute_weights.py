"""bf16 dense weights kept as copies of their fp32 masters (executor.dense.compute_weights): the
same training as bf16 autocast's per-step casts, bit for bit, the masters and checkpoints fp32,
a loaded checkpoint reaching the copies."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from executor.comm import Comm
from executor.dense import precision
from executor.dense.compute_weights import ComputeWeights, wanted
from executor.dense.model import build_dense
from executor.run.verify import synthetic_global_batches
from executor.step.trainer import Trainer
from planner.builders import random_plan
from planner.model_spec import ModelSpec, TableSpec
from planner.modes import DenseDtype
from planner.plan import OptimizerPlan

MODEL = ModelSpec("tiny", "dlrm", 4, (TableSpec("C1", 40, 8), TableSpec("C2", 300, 8)), bottom_mlp=(16, 8),
                  top_mlp=(16, 8, 1), dense_dtype=DenseDtype.BF16)


def trained(copies: bool, plan, hot, batches) -> Trainer:
    torch.manual_seed(0)
    tr = Trainer(plan, hot, Comm(torch.device("cpu")))
    assert tr.precision.used == "bf16"
    assert tr.weights is None  # a CPU run keeps autocast's casts unless asked
    if copies:
        tr.weights = ComputeWeights(tr.dense)
    for b in batches:
        tr.step(b)
    return tr


@pytest.mark.parametrize("dense_opt", ["sgd", "adagrad"])
def test_copies_train_as_autocast_does(monkeypatch, dense_opt):
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    plan, hot = random_plan(MODEL, 1, 16, np.random.default_rng(0), micro_batches=1,
                            optimizer=OptimizerPlan("sgd", 0.5, dense_opt, 0.1))
    batches = synthetic_global_batches(plan, 3, seed=2)
    ref, got = trained(False, plan, hot, batches), trained(True, plan, hot, batches)
    start = build_dense(plan.model, plan.seed)
    for (name, a), b in zip(ref.dense.named_parameters(), got.dense.parameters()):
        assert b.dtype == torch.float32, name  # the masters stay fp32 (what checkpoints save)
        torch.testing.assert_close(b, a, rtol=0, atol=0)
    assert any(not torch.equal(a, b) for a, b in zip(got.dense.parameters(), start.parameters()))  # it trained
    for c, m in zip(got.weights.copies, got.weights.masters):
        assert c.dtype == torch.bfloat16 and torch.equal(c, m.to(torch.bfloat16))


def test_a_loaded_checkpoint_reaches_the_copies():
    net = torch.nn.Sequential(torch.nn.Linear(3, 4))
    cw = ComputeWeights(net)
    state = {k: torch.full_like(v, 0.5) for k, v in net.state_dict().items()}
    net.load_state_dict(state)
    assert all((c == 0.5).all() for c in cw.copies)


def test_used_only_where_it_helps(monkeypatch):
    cuda, bf16 = torch.device("cuda"), DenseDtype.BF16
    assert wanted(cuda, bf16, 1, False)
    assert not wanted(torch.device("cpu"), bf16, 1, False)
    assert not wanted(cuda, DenseDtype.TF32, 1, False) and not wanted(cuda, bf16, 2, False)
    assert not wanted(cuda, bf16, 1, True)
    monkeypatch.setenv("PICASSO_BF16_WEIGHTS", "0")
    assert not wanted(cuda, bf16, 1, False)
