"""The Triton dot interaction (executor.dense.interaction_triton) against the torch path
(executor.dense.interaction.dot_interaction_ref), under Triton's interpreter on CPU tensors
(on a GPU machine the same tests run the compiled kernels on CUDA)."""

from __future__ import annotations

import pytest
import torch

it = pytest.importorskip("executor.dense.interaction_triton", reason="triton is not installed", exc_type=ImportError)

from executor.dense.interaction import dot_interaction_ref  # noqa: E402
from executor.step.trainer import leaves_grad  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def features(f: int, d: int, n: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, d, generator=g).to(DEV).requires_grad_() for _ in range(f + 1)]


def grads(out: torch.Tensor, xs: list[torch.Tensor], g: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(out, xs, g.to(out.dtype)))


# features x dim x batch: one program's block of samples, its remainder, dims and feature
# counts that are not multiples of 16 (the kernels pad them), one feature alone
@pytest.mark.parametrize("f,d,n", [(26, 16, 37), (3, 4, 5), (8, 64, 33), (1, 24, 2), (13, 8, 70)])
def test_fp32_forward_and_backward_match_torch(f, d, n):
    xs = features(f, d, n, seed=f * 1000 + n)
    want = dot_interaction_ref(xs)
    got = it.dot_interaction(xs)
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    g = torch.randn(want.shape, generator=torch.Generator().manual_seed(n)).to(DEV)
    for a, b in zip(grads(got, xs, g), grads(want, xs, g)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(DEV == "cpu" and not hasattr(torch, "get_autocast_dtype"), reason="no autocast dtype query")
@pytest.mark.parametrize("f,d,n", [(26, 16, 19), (5, 32, 9)])
def test_bf16_writes_the_top_mlp_input_in_bf16(f, d, n):
    """Under bf16 autocast the output is the bf16 buffer the top MLP reads (no cast after), and
    forward and backward agree with the torch path at bf16."""
    xs = features(f, d, n, seed=n)
    with torch.autocast(DEV, dtype=torch.bfloat16):
        b = xs[0].to(torch.bfloat16)  # the bottom MLP's output under autocast
        got = it.dot_interaction([b, *xs[1:]])
        want = dot_interaction_ref([b, *xs[1:]])
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=1e-1)  # an ulp at 8-16
    g = torch.randn(want.shape, generator=torch.Generator().manual_seed(1)).to(DEV)
    for a, c in zip(grads(got, xs, g), grads(want, xs, g)):
        torch.testing.assert_close(a.float(), c.float(), rtol=5e-2, atol=2e-1)


def test_self_interaction_adds_the_diagonal():
    f, d, n = 4, 8, 11
    xs = features(f, d, n, seed=5)
    got = it.dot_interaction(xs, self_interaction=True)
    t = torch.stack(xs, dim=1)
    li, lj = torch.tril_indices(f + 1, f + 1, offset=0)
    want = torch.cat([xs[0], torch.bmm(t, t.transpose(1, 2))[:, li, lj]], dim=1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    g = torch.randn(want.shape, generator=torch.Generator().manual_seed(2)).to(DEV)
    for a, b in zip(grads(got, xs, g), grads(want, xs, g)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


def test_every_output_element_is_written_and_padding_is_zero():
    """The output buffer starts as NaN: every column of every sample is written (x0, the pairs,
    and zeros in columns past them when the top MLP's input is padded)."""
    f, d, n = 6, 8, 21
    xs = features(f, d, n, seed=3)
    e = torch.stack(xs[1:]).detach()
    used = d + it.pairs(f + 1)
    out = torch.full((n, used + 5), float("nan"), device=DEV)
    it.forward_into(xs[0].detach(), e, out, it.Compute.FP32)
    torch.testing.assert_close(out[:, :used], dot_interaction_ref(xs).detach(), rtol=1e-5, atol=1e-5)
    assert (out[:, used:] == 0).all()


def test_pooled_pack_is_read_in_place_and_its_gradient_is_one_buffer(monkeypatch):
    """Tables pooled end to end in one pack buffer, a padding bag after each (a static batch):
    the kernel reads them where they lie (no stack), and their gradients come back as views of
    one buffer laid out like the pack, padding rows zero, which the trainer takes without a cat."""
    f, d, n = 5, 8, 9
    g = torch.Generator().manual_seed(7)
    pack = torch.randn(f * (n + 1), d, generator=g).to(DEV)
    leaves = []
    for t in range(f):
        leaves.append(pack[t * (n + 1): t * (n + 1) + n].detach().requires_grad_())
        leaves.append(pack[t * (n + 1) + n: (t + 1) * (n + 1)].detach().requires_grad_())  # the padding bag
    embs = leaves[0::2]
    x0 = torch.randn(n, d, generator=g).to(DEV).requires_grad_()
    stacked = []
    monkeypatch.setattr(torch, "stack", lambda *a, **k: stacked.append(1))
    out = it.dot_interaction([x0, *embs])
    assert not stacked
    monkeypatch.undo()
    gout = torch.randn(out.shape, generator=g).to(DEV)
    out.backward(gout)
    want = torch.autograd.grad(dot_interaction_ref([x0, *embs]), embs, gout)
    joined = leaves_grad(leaves)
    assert joined.untyped_storage().data_ptr() == embs[0].grad.untyped_storage().data_ptr()  # a view: no cat
    expect = torch.cat([torch.cat([w, torch.zeros(1, d, device=DEV)]) for w in want])
    torch.testing.assert_close(joined, expect, rtol=1e-5, atol=1e-4)


def test_bad_shapes_are_one_clear_error():
    x0 = torch.randn(4, 8, device=DEV)
    with pytest.raises(ValueError, match="embeddings"):
        it.forward_into(x0, torch.randn(3, 5, 8, device=DEV), torch.empty(4, 30, device=DEV), it.Compute.FP32)
    with pytest.raises(ValueError, match="output"):
        it.forward_into(x0, torch.randn(3, 4, 8, device=DEV), torch.empty(4, 10, device=DEV), it.Compute.FP32)


def test_both_kernels_compile_for_hopper():
    """Every dtype variant is compiled ahead of time for sm_90 (the interpreter runs what the
    GPU compiler may refuse: 3-D products, layouts)."""
    import json
    import os
    import subprocess
    import sys

    code = "import json; from executor.dense import interaction_triton as T; print(json.dumps(T.compile_for(90)))"
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res and all(v == "ok" for v in res.values()), res


def test_dlrm_routes_to_the_kernels_where_triton_serves(monkeypatch):
    from executor.dense.model import build_dense
    from executor.sparse import syncfree
    from planner.model_spec import ModelSpec, TableSpec

    model = ModelSpec("tiny", "dlrm", 3, (TableSpec("C1", 6, 8), TableSpec("C2", 9, 8)), bottom_mlp=(8,),
                      top_mlp=(4, 1))
    dense = build_dense(model, seed=0).to(DEV)
    calls = []
    real = it.TritonDots.apply
    monkeypatch.setattr(it.TritonDots, "apply", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(5, 3, device=DEV)
    embs = {"C1": torch.randn(5, 8, device=DEV), "C2": torch.randn(5, 8, device=DEV)}
    with syncfree.triton_on():
        got = dense(x, embs, {})
    assert calls
    with syncfree.triton_on(False):
        want = dense(x, embs, {})
    assert len(calls) == 1 or DEV == "cuda"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_broken_interaction_kernel_leaves_the_embedding_kernels_live(monkeypatch):
    from executor.sparse import syncfree

    def broken(device):
        raise RuntimeError("no such layout")

    monkeypatch.setattr(it, "self_check", broken)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(syncfree, "_tbe_tried", True)
    with pytest.warns(UserWarning, match="interaction kernels: RuntimeError: no such layout; using the torch path"):
        assert syncfree._interaction_kernels() is None
