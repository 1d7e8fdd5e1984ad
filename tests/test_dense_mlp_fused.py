"""The MLPs' fused Linear + bias + ReLU (executor.dense.mlp) against nn.Sequential's unfused
layers: the same outputs and gradients at fp32 and under bf16 autocast, the same state dict."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from executor.dense import mlp as M
from executor.dense.model import mlp

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def run(net: nn.Module, x: torch.Tensor, mode: M.Fusion, autocast: bool):
    net.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    calls = []
    real = M.LinearReLU.apply
    M.LinearReLU.apply = lambda *a: calls.append(1) or real(*a)
    try:
        with M.fusion(mode), torch.autocast(DEV, dtype=torch.bfloat16, enabled=autocast):
            y = net(x)
    finally:
        M.LinearReLU.apply = real
    y.float().square().sum().backward()
    return y, x.grad, [p.grad.clone() for p in net.parameters()], len(calls)


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("last_act", [False, True])
def test_fused_pairs_match_the_unfused_layers(autocast, last_act):
    torch.manual_seed(0)
    net = mlp([13, 32, 24, 1 if not last_act else 8], last_act=last_act).to(DEV)
    x = torch.randn(37, 13, device=DEV)
    y0, gx0, gp0, n0 = run(net, x, M.Fusion.OFF, autocast)
    y1, gx1, gp1, n1 = run(net, x, M.Fusion.ON, autocast)
    assert n0 == 0 and n1 == (3 if last_act else 2)
    tol = dict(rtol=2e-2, atol=2e-2) if autocast else dict(rtol=1e-5, atol=1e-5)
    assert y1.dtype == y0.dtype
    torch.testing.assert_close(y1.float(), y0.float(), **tol)
    torch.testing.assert_close(gx1, gx0, **tol)
    for a, b in zip(gp1, gp0):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, **tol)


def test_state_dict_keeps_sequential_keys():
    """Checkpoints are nn.Sequential's: the same keys and shapes as before the fusion."""
    net = mlp([4, 8, 1], last_act=False)
    ref = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    assert {k: v.shape for k, v in net.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
    net.load_state_dict(ref.state_dict())


def test_fusion_is_on_for_cuda_only_by_default(monkeypatch):
    assert not M.fused_for(torch.zeros(1))
    monkeypatch.setenv(M.FUSED_ENV, "0")
    assert not M.fused_for(torch.zeros(1))
    with M.fusion(M.Fusion.ON):
        assert M.fused_for(torch.zeros(1))
