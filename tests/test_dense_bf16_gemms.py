"""Under dense_dtype bf16 every GEMM of the dense step (the MLPs, DLRM's interaction bmm, DCN's
cross layers), forward and backward, takes bf16 operands: none runs as an fp32 kernel.

Checked on the CPU with the same autocast the executor uses on CUDA, recording the dtypes of
every matrix product torch dispatches; the interaction runs its torch path (the GPU's: the
native kernel serves CPU fp32 only)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from executor.comm import Comm
from executor.dense.model import build_dense
from executor.dense.precision import DensePrecision
from executor.run.verify import synthetic_global_batches
from executor.sparse import kernels
from executor.step import trainer as trainer_mod
from executor.step.trainer import Trainer
from planner.model_spec import ModelSpec, TableSpec
from planner.plan import OptimizerPlan, PackPlan, Plan
from planner.presets import get_model

GEMMS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "_addmm_activation"}
BF16 = DensePrecision("bf16", "bf16")


class GemmLog(TorchDispatchMode):
    """Records (op, operand dtypes) of every matrix product run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, tuple[torch.dtype, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in GEMMS:
            self.seen.append((name, tuple(a.dtype for a in args if isinstance(a, torch.Tensor))))
        return func(*args, **(kwargs or {}))

    def not_bf16(self) -> list[tuple[str, tuple[torch.dtype, ...]]]:
        return [s for s in self.seen if any(d != torch.bfloat16 for d in s[1])]


@pytest.fixture
def torch_interaction(monkeypatch):
    kernels.load_native(warn=False)  # loading installs the dispatch names: load first, then patch
    monkeypatch.setattr(kernels, "dot_interaction", kernels.dot_interaction_ref)


@pytest.mark.parametrize("preset", ["dlrm-criteo-kaggle", "dlrm-mlperf", "dlrm-dcnv2", "dcn-v2", "deepfm",
                                    "wide-deep"])
def test_every_dense_gemm_runs_in_bf16_forward_and_backward(torch_interaction, preset):
    m = get_model(preset).with_row_cap(100)
    dense = build_dense(m, 0)
    n = 4
    embs = {t.name: torch.randn(n, t.dim, requires_grad=True) for t in m.tables if t.pooling != "none"}
    log = GemmLog()
    with log:
        with BF16.autocast(torch.device("cpu")):
            logit = dense(torch.randn(n, m.num_dense), embs, {})
        F.binary_cross_entropy_with_logits(logit.float(), torch.rand(n)).backward()
    assert log.seen and not log.not_bf16(), log.not_bf16()
    # mixed precision: the master weights, their gradients and the tables' gradients stay fp32
    assert all(q.dtype == q.grad.dtype == torch.float32 for q in dense.parameters() if q.grad is not None)
    assert all(e.grad.dtype == torch.float32 for e in embs.values())


def test_the_bf16_interaction_matches_fp32_to_bf16_rounding(torch_interaction):
    xs = [torch.randn(16, 8, requires_grad=True) for _ in range(5)]
    ref = kernels.dot_interaction_ref(xs)
    (g32,) = torch.autograd.grad(ref.sum(), xs[1])
    with BF16.autocast(torch.device("cpu")):
        low = kernels.dot_interaction_ref(xs)
    (g16,) = torch.autograd.grad(low.float().sum(), xs[1])
    assert g16.dtype == torch.float32
    torch.testing.assert_close(low.float(), ref, rtol=3e-2, atol=3e-2)
    # the backward's bmm ran on bf16 features: its gradient carries their rounding
    assert not torch.equal(g16, g32)
    torch.testing.assert_close(g16, g32, rtol=3e-2, atol=6e-2)


def test_a_training_step_under_bf16_runs_no_fp32_gemm(torch_interaction, monkeypatch):
    """The trainer's own step (its autocast contexts around each dense stage), on one rank."""
    monkeypatch.setattr(trainer_mod, "dense_precision", lambda extra, dev: BF16)
    tables = (TableSpec("C1", 40, 8), TableSpec("C2", 90, 8), TableSpec("C3", 30, 8))
    m = ModelSpec("bf16", "dlrm", 5, tables, bottom_mlp=(16, 8), top_mlp=(16, 1), extra={"dense_dtype": "bf16"})
    plan = Plan(m, 1, 8, [PackPlan("p0", ["C1", "C2", "C3"], "row_wise")], hot_rows={"C2": 5},
                hot_ids_file="hot.npz", optimizer=OptimizerPlan("rowwise_adagrad", 0.1, "adam", 0.01), seed=1)
    tr = Trainer(plan, {"C2": np.arange(5)}, Comm())
    log = GemmLog()
    with log:
        for b in synthetic_global_batches(plan, 2, seed=3):
            tr.step(b)
    assert log.seen and not log.not_bf16(), log.not_bf16()
