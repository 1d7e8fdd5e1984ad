"""DCN's cross layer with its elementwise work folded into the GEMMs (executor.dense.cross)
against the plain expression x0 * layer(x) + x: outputs and gradients, full and low rank, at
fp32 and under bf16 autocast."""

from __future__ import annotations

import pytest
import torch

from executor.dense import cross as X
from executor.dense import mlp as M
from executor.dense.model import build_dense
from planner.model_spec import ModelSpec, TableSpec

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def run(dense, x, embs, mode, autocast):
    dense.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    embs = {k: v.detach().requires_grad_() for k, v in embs.items()}
    calls = []
    real = X.CrossLayer.apply
    X.CrossLayer.apply = lambda *a: calls.append(1) or real(*a)
    try:
        with M.fusion(mode), torch.autocast(DEV, dtype=torch.bfloat16, enabled=autocast):
            y = dense(x, embs, {})
    finally:
        X.CrossLayer.apply = real
    y.float().square().sum().backward()
    return [y, x.grad, *(e.grad for e in embs.values()), *(p.grad for p in dense.parameters())], len(calls)


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("rank", [0, 4])
def test_fused_cross_matches_the_expression(rank, autocast):
    tables = (TableSpec("C1", 6, 8), TableSpec("C2", 9, 8))
    extra = {"cross_layers": 3, **({"cross_rank": rank} if rank else {})}
    model = ModelSpec("tiny", "dcn", 5, tables, bottom_mlp=(16, 8), top_mlp=(12, 1), extra=extra)
    dense = build_dense(model, seed=0).to(DEV)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(23, 5, generator=g).to(DEV)
    embs = {t.name: torch.randn(23, 8, generator=g).to(DEV) for t in tables}
    want, n0 = run(dense, x, embs, M.Fusion.OFF, autocast)
    got, n1 = run(dense, x, embs, M.Fusion.ON, autocast)
    assert n0 == 0 and n1 == 3
    tol = dict(rtol=3e-2, atol=3e-2) if autocast else dict(rtol=1e-5, atol=1e-5)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a.float(), b.float(), **tol)
