"""The dense half's torch.compile option (executor.dense.compiled): which stages it compiles,
and a bad setting is one clear error."""

from __future__ import annotations

import pytest
import torch

from executor.dense import compiled as C
from executor.dense.model import build_dense
from planner.model_spec import ModelSpec, TableSpec


def model(arch: str) -> ModelSpec:
    tables = (TableSpec("C1", 6, 8), TableSpec("C2", 9, 8))
    return ModelSpec("tiny", arch, 3, tables, bottom_mlp=(8,), top_mlp=(4, 1))


@pytest.mark.parametrize("arch,stages", [("dlrm", ["bottom", "top"]), ("dcn", ["bottom", "top", "interaction"])])
def test_inductor_compiles_the_stages_the_arch_runs_in_torch(monkeypatch, arch, stages):
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append(fn.__name__) or fn)
    dense = build_dense(model(arch), seed=0)
    assert C.compile_dense(dense, C.DenseCompile.OFF) == [] and not compiled
    assert C.compile_dense(dense, C.DenseCompile.INDUCTOR) == stages
    assert compiled == stages and all(name in vars(dense) for name in stages)


def test_setting_is_read_from_the_environment(monkeypatch):
    assert C.DenseCompile.from_env() == C.DenseCompile.OFF
    monkeypatch.setenv(C.COMPILE_ENV, "Inductor")
    assert C.DenseCompile.from_env() == C.DenseCompile.INDUCTOR
    monkeypatch.setenv(C.COMPILE_ENV, "max")
    with pytest.raises(ValueError, match="PICASSO_DENSE_COMPILE='max': expected one of"):
        C.DenseCompile.from_env()
