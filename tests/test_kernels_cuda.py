"""CUDA kernels against the reference on the same device (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from test_kernels_native import SETTINGS, assert_close_to, bags, routing_cases

from executor.sparse import kernels as K

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def native():
    from csrc import build

    lib = build.load()
    assert lib.has_cuda(), "torch has CUDA but the native library was built without it"
    return lib


def cuda(*tensors):
    return [None if t is None else t.cuda() for t in tensors]


@SETTINGS
@given(bags())
def test_cuda_bag_forward(native, case):
    weight, indices, offsets, mode, psw = case
    if mode == "mean":
        psw = None
    got = native.bag_forward(*cuda(weight, indices, offsets), mode, *cuda(psw))
    want = K.bag_forward_ref(weight, indices, offsets, mode, psw)
    magnitude = K.bag_forward_ref(weight.abs(), indices, offsets, mode, None if psw is None else psw.abs())
    assert got.is_cuda
    assert_close_to(got.cpu(), want, magnitude)


@SETTINGS
@given(bags())
def test_cuda_bag_backward(native, case):
    weight, indices, offsets, mode, psw = case
    grad = torch.randn(len(offsets) - 1, weight.shape[1], dtype=weight.dtype)
    g, i, o, p = cuda(grad, indices, offsets, psw)
    rows, grads = native.bag_backward(g, i, o, mode, p)
    want_rows, want_grads = K.bag_backward_ref(grad, indices, offsets, mode, psw)
    assert torch.equal(rows.cpu(), want_rows)
    _, magnitude = K.bag_backward_ref(grad.abs(), indices, offsets, mode, None if psw is None else psw.abs())
    assert_close_to(grads.cpu(), want_grads, magnitude)


@SETTINGS
@given(routing_cases())
def test_cuda_route_ids(native, case):
    ids, hot_map, num_owners = case
    got = native.route_ids(*cuda(ids, hot_map), num_owners)
    want = K.route_ids_ref(ids, hot_map, num_owners)
    for a, b in zip(got, want):
        assert torch.equal(a.cpu(), b)


def test_cuda_unique_and_sparse_update(native):
    gen = torch.Generator().manual_seed(5)
    ids = torch.cat([torch.randint(-(2**40), 2**40, (3000,), generator=gen), torch.randint(0, 50, (3000,))])
    for got, want in zip(native.unique(ids.cuda()), K.unique_ref(ids)):
        assert torch.equal(got.cpu(), want)
    for optimizer in ("sgd", "rowwise_adagrad"):
        weight = torch.randn(200, 20, generator=gen)
        state = torch.rand(200, generator=gen)
        rows = torch.randint(0, 200, (1000,), generator=gen)
        grads = torch.randn(1000, 20, generator=gen)
        w_ref, s_ref = weight.clone(), state.clone()
        K.sparse_update_ref(w_ref, s_ref, rows, grads, optimizer, 0.1)
        w, s = weight.cuda(), state.cuda()
        native.sparse_update(w, s, rows.cuda(), grads.cuda(), optimizer, 0.1, 1e-8)
        torch.testing.assert_close(w.cpu(), w_ref, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(s.cpu(), s_ref, rtol=1e-6, atol=1e-6)


def test_cuda_dispatch_uses_native_for_cuda_tensors():
    assert K.load_native()
    weight = torch.randn(50, 16, device="cuda")
    indices = torch.randint(0, 50, (64,), device="cuda")
    offsets = torch.arange(0, 65, 4, device="cuda")
    out = K.bag_forward(weight, indices, offsets, "mean")
    torch.testing.assert_close(out, K.bag_forward_ref(weight, indices, offsets, "mean"), rtol=1e-6, atol=1e-6)
