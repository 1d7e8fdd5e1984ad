"""GEMM operands widened to tensor-core alignment (planner.dense.gemm_width, executor.dense.padding):
the widened DLRM computes what the logical one does, its padding stays zero through training, and
state dicts, optimizer state and checkpoints keep the logical shapes (the widened layout forced on CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from executor.comm import Comm
from executor.dense import padding
from executor.dense.model import build_dense
from executor.dense.optim import DenseOptimizer
from executor.run import checkpoint, model_file
from executor.run.verify import synthetic_global_batches
from executor.sparse import syncfree
from executor.step.trainer import Trainer
from planner.dense import dot_interaction_width, gemm_width
from planner.errors import PlanError
from planner.model_spec import ModelSpec, TableSpec
from planner.modes import DenseDtype
from planner.plan import OptimizerPlan, PackPlan, Plan


def model(bottom: tuple[int, ...] = (16, 8)) -> ModelSpec:
    tables = tuple(TableSpec(f"C{i}", 50 + i, 8) for i in range(4))  # 8 + 5*4/2 = 18 top-MLP inputs
    return ModelSpec("pad-dlrm", "dlrm", 13, tables, bottom_mlp=bottom, top_mlp=(16, 1))


def test_gemm_width_rule():
    assert [gemm_width(w, DenseDtype.TF32) for w in (13, 16, 367, 479, 1)] == [16, 16, 368, 480, 8]
    assert [gemm_width(w, "bf16") for w in (13, 367, 512)] == [16, 368, 512]
    assert [gemm_width(w, "fp32") for w in (13, 367)] == [13, 367]  # no tensor cores to reach
    with pytest.raises(PlanError):
        gemm_width(13, "fp16")


def inputs(m: ModelSpec, n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(n, m.num_dense, generator=g)
    embs = {t.name: torch.randn(n, t.dim, generator=g).requires_grad_() for t in m.tables}
    return dense, embs


def forward_backward(net, dense, embs):
    for p in net.parameters():
        p.grad = None
    for e in embs.values():
        e.grad = None
    y = net(dense, embs, {})
    (y * torch.linspace(-1, 1, len(y))).sum().backward()
    return y.detach(), {k: e.grad.clone() for k, e in embs.items()}


@pytest.mark.parametrize("bottom", [(16, 8), ()])  # a bottom MLP, or the projection to the table dim
@pytest.mark.parametrize("triton", [False, True])
def test_widened_dlrm_matches_the_logical_one(bottom, triton):
    m = model(bottom)
    plain, wide = build_dense(m, 5), build_dense(m, 5)
    widened = wide.pad_gemm_inputs(DenseDtype.TF32)
    first = "bot.0" if bottom else "proj"
    assert widened == {first: 16, "topm.0": 24}
    assert wide.topm[0].weight.shape == (16, 24) and dot_interaction_width(m) == 18
    if triton:
        pytest.importorskip("executor.dense.interaction_triton", reason="triton is not installed", exc_type=ImportError)
    dense, embs = inputs(m, 21, seed=1)
    with syncfree.triton_on(triton):
        y0, ge0 = forward_backward(plain, dense, embs)
        y1, ge1 = forward_backward(wide, dense, embs)
    torch.testing.assert_close(y1, y0, rtol=1e-6, atol=1e-6)
    for k in ge0:
        torch.testing.assert_close(ge1[k], ge0[k], rtol=1e-6, atol=1e-6)
    logical = dict(plain.named_parameters())
    for name, p in wide.named_parameters():
        want = logical[name].grad
        torch.testing.assert_close(padding.narrow_to(p.grad, tuple(want.shape)), want, rtol=1e-6, atol=1e-6)
    for name, width in widened.items():
        k = plain.get_submodule(name).in_features
        assert not wide.get_submodule(name).weight.grad[:, k:width].any()  # zero inputs: zero gradients


def test_fp32_and_cpu_runs_stay_unpadded(monkeypatch):
    m = model()
    net = build_dense(m, 5)
    assert net.pad_gemm_inputs(DenseDtype.FP32) == {} and padding.logical_shapes(net) is None
    assert padding.run_dtype(torch.device("cpu"), DenseDtype.TF32) is None
    assert padding.run_dtype(torch.device("cuda"), DenseDtype.BF16) == DenseDtype.BF16
    with padding.forced(DenseDtype.TF32):
        assert padding.run_dtype(torch.device("cpu"), DenseDtype.FP32) == DenseDtype.TF32
    monkeypatch.setenv(padding.ENV, "0")
    assert padding.run_dtype(torch.device("cuda"), DenseDtype.BF16) is None


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam"])
def test_padding_stays_zero_and_state_dicts_are_logical(kind):
    m = model()
    plain, wide = build_dense(m, 5), build_dense(m, 5)
    wide.pad_gemm_inputs(DenseDtype.BF16)
    logical = {k: tuple(v.shape) for k, v in plain.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in wide.state_dict().items()} == logical
    opt = DenseOptimizer(wide.parameters(), kind, 0.1, logical_shapes=padding.logical_shapes(wide))
    ref = DenseOptimizer(plain.parameters(), kind, 0.1)
    for step in range(3):
        dense, embs = inputs(m, 9, seed=step)
        forward_backward(plain, dense, embs)
        forward_backward(wide, dense, embs)
        opt.step()
        ref.step()
    for first in ("bot.0", "topm.0"):
        w = wide.get_submodule(first).weight
        k = plain.get_submodule(first).in_features
        assert not w[:, k:].any()  # zero inputs, zero gradients, no update
    for k, v in wide.state_dict().items():
        torch.testing.assert_close(v, plain.state_dict()[k], rtol=1e-6, atol=1e-6)
    saved = opt.state_dict()
    assert [{k: tuple(v.shape) for k, v in s.items()} for s in saved["state"]] == \
        [{k: tuple(v.shape) for k, v in s.items()} for s in ref.state_dict()["state"]]
    # logical state loads into a widened model and optimizer (an old checkpoint), and back
    again = build_dense(m, 6)
    again.pad_gemm_inputs(DenseDtype.BF16)
    again.load_state_dict(plain.state_dict())
    opt2 = DenseOptimizer(again.parameters(), kind, 0.1, logical_shapes=padding.logical_shapes(again))
    opt2.load_state_dict(ref.state_dict())
    for (name, a), b, c in zip(again.named_parameters(), wide.parameters(), plain.parameters()):
        assert a.shape == b.shape and torch.equal(a, padding.pad_to(c.detach(), tuple(b.shape))), name
    for a, b in zip(opt2.state, opt.state):
        for key in b:
            assert a[key].shape == b[key].shape
            torch.testing.assert_close(a[key], b[key], rtol=1e-6, atol=1e-6)


def plan(dtype: str) -> Plan:
    from dataclasses import replace

    return Plan(replace(model(), dense_dtype=dtype), 1, 16, [PackPlan("p0", ["C0", "C1", "C2", "C3"], "table_wise")],
                optimizer=OptimizerPlan("rowwise_adagrad", 0.1, "adam", 0.01, eps=1e-4), seed=3)


def test_checkpoint_of_a_widened_run_is_logical_and_round_trips(tmp_path):
    p = plan("tf32")
    batches = synthetic_global_batches(p, 4, seed=2)
    with padding.forced(DenseDtype.TF32):
        wide = Trainer(p, {}, Comm())
    assert wide.dense.topm[0].in_features == 24
    plain = Trainer(p, {}, Comm())
    for b in batches[:2]:
        wide.step(b)
        plain.step(b)
    checkpoint.save(wide, tmp_path / "c")
    [version] = checkpoint.versions(tmp_path / "c")
    saved = torch.load(version / "dense.pt", weights_only=True)
    assert {k: tuple(v.shape) for k, v in saved["dense"].items()} == \
        {k: tuple(v.shape) for k, v in plain.dense.state_dict().items()}
    assert saved["dense"]["topm.0.weight"].shape == (16, 18) and saved["dense"]["bot.0.weight"].shape == (16, 13)
    assert [tuple(s["exp_avg"].shape) for s in saved["optimizer"]["state"]] == \
        [tuple(q.shape) for q in plain.dense.parameters()]
    model_file.export(tmp_path / "c", tmp_path / "m.safetensors", p)  # the export holds the logical weights
    exported = model_file.load(tmp_path / "m.safetensors").dense.state_dict()
    for k, v in wide.dense.state_dict().items():
        assert torch.equal(exported[k], v), k
    # resumed widened and unwidened: both continue as the run that never widened
    with padding.forced(DenseDtype.TF32):
        resumed_wide = Trainer(p, {}, Comm())
    resumed_plain = Trainer(p, {}, Comm())
    for tr in (resumed_wide, resumed_plain):
        checkpoint.load(tr, tmp_path / "c")
        for b in batches[2:]:
            tr.step(b)
    for b in batches[2:]:
        plain.step(b)
    want = plain.dense.state_dict()
    for tr in (resumed_wide, resumed_plain):
        got = tr.dense.state_dict()
        for k in want:
            np.testing.assert_allclose(got[k].numpy(), want[k].numpy(), rtol=1e-5, atol=1e-6, err_msg=k)
    assert resumed_wide.dense.topm[0].weight.shape == (16, 24)
    assert not resumed_wide.dense.topm[0].weight[:, 18:].any()
