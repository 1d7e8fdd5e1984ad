"""On one rank the step's dense and hot-row gradients are not flattened for an all-reduce that
sums nothing (a cat of every gradient and a copy back per weight, each step), and the step
still matches the reference."""

from __future__ import annotations

import numpy as np
import torch

from executor.comm import Comm
from executor.run.verify import synthetic_global_batches, train_and_compare
from executor.step import trainer as T
from planner.builders import random_plan
from planner.model_spec import ModelSpec, TableSpec
from planner.plan import OptimizerPlan


def test_one_rank_step_has_no_flat_gradient_copies(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a one-rank step flattened its gradients")

    monkeypatch.setattr(T, "_flat_grads", refuse)
    monkeypatch.setattr(T, "_unflat_grads", refuse)
    model = ModelSpec("tiny", "dlrm", 4, (TableSpec("C1", 40, 8), TableSpec("C2", 300, 8)), bottom_mlp=(16, 8),
                      top_mlp=(8, 1))
    rng = np.random.default_rng(0)
    for hot, opt in (("none", OptimizerPlan("sgd", 0.5, "sgd", 0.1)),
                     ("some", OptimizerPlan("rowwise_adagrad", 0.1, "adam", 0.05, eps=1e-4))):
        plan, hot_ids = random_plan(model, 1, 16, rng, hot=hot, optimizer=opt)
        res = train_and_compare(plan, hot_ids, synthetic_global_batches(plan, 3, seed=1), Comm(torch.device("cpu")))
        assert res["max_rel_diff"] < 1e-5 and res["reference_moved"] > 1e-3, res
