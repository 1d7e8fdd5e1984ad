"""Native CPU kernels against the pure-PyTorch reference of executor/sparse/kernels.py.

Integer outputs must match bitwise; floats within 1e-6 of the magnitude of the summed terms
(the summation order may differ). The library is built once per session; a build failure is a
test failure, never a skip, since CI has a compiler.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor.sparse import kernels as K

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def native():
    from csrc import build

    return build.load()  # raises NativeBuildError -> error, not skip


def assert_close_to(actual: torch.Tensor, expected: torch.Tensor, magnitude: torch.Tensor, rel: float = 1e-6):
    """|actual - expected| <= rel * magnitude (+ a denormal floor), elementwise."""
    assert actual.shape == expected.shape
    assert actual.dtype == expected.dtype
    diff = (actual.double() - expected.double()).abs()
    bound = rel * magnitude.double().abs() + 1e-30
    worst = (diff - bound).max().item() if diff.numel() else 0.0
    assert worst <= 0, f"max excess {worst}, max diff {diff.max().item()}"


@st.composite
def bags(draw, with_weights: bool = True):
    num_rows = draw(st.integers(1, 40))
    dim = draw(st.sampled_from([1, 3, 8, 16, 33]))
    lengths = draw(st.lists(st.integers(0, 7), min_size=1, max_size=12))
    n = sum(lengths)
    indices = draw(st.lists(st.integers(0, num_rows - 1), min_size=n, max_size=n))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    mode = draw(st.sampled_from(["sum", "mean"]))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(num_rows, dim, generator=gen, dtype=dtype)
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    psw = None
    if with_weights and draw(st.booleans()):
        psw = torch.rand(n, generator=gen, dtype=dtype) * 2 - 0.5
    return weight, torch.tensor(indices, dtype=torch.int64), offsets, mode, psw


@SETTINGS
@given(bags())
def test_bag_forward_matches_reference(native, case):
    weight, indices, offsets, mode, psw = case
    if mode == "mean":
        psw = None  # embedding_bag takes per-sample weights only with sum
    got = native.bag_forward(weight, indices, offsets, mode, psw)
    want = K.bag_forward_ref(weight, indices, offsets, mode, psw)
    magnitude = K.bag_forward_ref(weight.abs(), indices, offsets, mode, None if psw is None else psw.abs())
    assert_close_to(got, want, magnitude)


@SETTINGS
@given(bags())
def test_bag_backward_matches_reference(native, case):
    weight, indices, offsets, mode, psw = case
    grad = torch.randn(len(offsets) - 1, weight.shape[1], dtype=weight.dtype)
    rows, grads = native.bag_backward(grad, indices, offsets, mode, psw)
    want_rows, want_grads = K.bag_backward_ref(grad, indices, offsets, mode, psw)
    assert torch.equal(rows, want_rows)
    _, magnitude = K.bag_backward_ref(grad.abs(), indices, offsets, mode, None if psw is None else psw.abs())
    assert_close_to(grads, want_grads, magnitude)


@SETTINGS
@given(
    st.lists(st.integers(-(2**62), 2**62), max_size=300)
    | st.lists(st.integers(0, 20), max_size=300)
    | st.lists(st.integers(0, 5000), min_size=256, max_size=600),
    st.sampled_from([torch.int64, torch.int32]),
)
def test_unique_matches_reference(native, values, dtype):
    if dtype == torch.int32:
        values = [v % 2**31 for v in values]
    ids = torch.tensor(values, dtype=dtype)
    for got, want in zip(native.unique(ids), K.unique_ref(ids)):
        assert got.dtype == want.dtype
        assert torch.equal(got, want)


@st.composite
def routing_cases(draw):
    num_rows = draw(st.integers(1, 200))
    ids = draw(st.lists(st.integers(0, num_rows - 1), max_size=300))
    kind = draw(st.sampled_from(["none", "all_hot", "all_cold", "random"]))
    num_owners = draw(st.integers(1, 9))
    hot_dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    if kind == "none":
        hot_map = None
    else:
        if kind == "all_hot":
            hot = torch.ones(num_rows, dtype=torch.bool)
        elif kind == "all_cold":
            hot = torch.zeros(num_rows, dtype=torch.bool)
        else:
            hot = torch.tensor(draw(st.lists(st.booleans(), min_size=num_rows, max_size=num_rows)))
        hot_map = torch.full((num_rows,), -1, dtype=hot_dtype)
        hot_map[hot] = torch.randperm(int(hot.sum())).to(hot_dtype)
    return torch.tensor(ids, dtype=torch.int64), hot_map, num_owners


@SETTINGS
@given(routing_cases())
def test_route_ids_matches_reference(native, case):
    ids, hot_map, num_owners = case
    got = K.Routing(*native.route_ids(ids, hot_map, num_owners))
    want = K.route_ids_ref(ids, hot_map, num_owners)
    for field in K.Routing._fields:
        a, b = getattr(got, field), getattr(want, field)
        assert a.dtype == b.dtype, field
        assert torch.equal(a, b), field


@SETTINGS
@given(routing_cases(), st.data())
def test_bag_owner_counts_matches_reference(native, case, data):
    """The pooled exchange's per-bag lengths: cold IDs per owner, then hot IDs, for bags cut
    anywhere in the IDs (empty bags included)."""
    ids, hot_map, num_owners = case
    cuts = sorted(data.draw(st.lists(st.integers(0, len(ids)), max_size=8)))
    offsets = torch.tensor([0, *cuts, len(ids)], dtype=torch.int64)
    got = native.bag_owner_counts(ids, offsets, hot_map, num_owners)
    want = K.bag_owner_counts_ref(ids, offsets, hot_map, num_owners)
    assert got.dtype == want.dtype == torch.int64
    assert torch.equal(got, want)
    assert int(got.sum()) == len(ids)


def test_bag_owner_counts_refuses_bad_input(native):
    with pytest.raises(IndexError, match="id at position 1 is 7"):
        native.bag_owner_counts(torch.tensor([0, 7]), torch.tensor([0, 2]), torch.full((5,), -1), 2)
    with pytest.raises(IndexError, match="id at position 0 is -1"):
        native.bag_owner_counts(torch.tensor([-1]), torch.tensor([0, 1]), None, 2)
    with pytest.raises(IndexError, match="offsets of bag 1 are"):
        native.bag_owner_counts(torch.tensor([0, 1, 2]), torch.tensor([0, 2, 1, 3]), None, 2)


@SETTINGS
@given(
    st.integers(1, 30),
    st.sampled_from([1, 4, 16, 17]),
    st.lists(st.integers(0, 29), max_size=80),
    st.sampled_from(["sgd", "rowwise_adagrad"]),
    st.sampled_from([torch.float32, torch.float64]),
    st.floats(1e-3, 1.0),
)
def test_sparse_update_matches_reference(native, num_rows, dim, rows, optimizer, dtype, lr):
    rows = [r % num_rows for r in rows]
    gen = torch.Generator().manual_seed(len(rows) * 31 + num_rows)
    weight = torch.randn(num_rows, dim, generator=gen, dtype=dtype)
    state = torch.rand(num_rows, generator=gen, dtype=dtype)
    grads = torch.randn(len(rows), dim, generator=gen, dtype=dtype)
    rows_t = torch.tensor(rows, dtype=torch.int64)
    w_ref, s_ref = weight.clone(), state.clone()
    K.sparse_update_ref(w_ref, s_ref, rows_t, grads, optimizer, lr)
    native.sparse_update(weight, state, rows_t, grads, optimizer, lr, 1e-8)
    # Per-row magnitude: |w| + lr * (summed |g|) / sqrt(s) bounds every term of the update.
    g_abs = torch.zeros(num_rows, dim, dtype=dtype).index_add_(0, rows_t, grads.abs())
    scale = 1.0 if optimizer == "sgd" else 1.0 / (s_ref.sqrt() + 1e-8).unsqueeze(1)
    assert_close_to(weight, w_ref, w_ref.abs() + lr * g_abs * scale + 1e-7, rel=2e-6)
    assert_close_to(state, s_ref, s_ref, rel=2e-6)


def test_empty_inputs(native):
    weight = torch.randn(5, 4)
    empty = torch.empty(0, dtype=torch.int64)
    offsets = torch.zeros(4, dtype=torch.int64)
    assert torch.equal(native.bag_forward(weight, empty, offsets, "sum", None), torch.zeros(3, 4))
    rows, grads = native.bag_backward(torch.randn(3, 4), empty, offsets, "mean", None)
    assert rows.numel() == 0 and grads.shape == (0, 4)
    uniq, inverse, counts = native.unique(empty)
    assert uniq.numel() == inverse.numel() == counts.numel() == 0
    routing = K.Routing(*native.route_ids(empty, None, 4))
    assert torch.equal(routing.counts, torch.zeros(4, dtype=torch.int64))
    w = weight.clone()
    native.sparse_update(w, None, empty, torch.empty(0, 4), "sgd", 0.1, 1e-8)
    assert torch.equal(w, weight)


def test_large_inputs_take_the_parallel_paths(native):
    """Sizes above the parallel grain, with heavy duplication (one very hot row)."""
    gen = torch.Generator().manual_seed(7)
    num_rows, dim, bags_n = 5000, 16, 20000
    weight = torch.randn(num_rows, dim, generator=gen)
    lengths = torch.randint(0, 6, (bags_n,), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    indices = torch.randint(0, num_rows, (int(lengths.sum()),), generator=gen)
    indices[::3] = 17
    out = native.bag_forward(weight, indices, offsets, "mean", None)
    torch.testing.assert_close(out, K.bag_forward_ref(weight, indices, offsets, "mean"), rtol=1e-6, atol=1e-5)
    grad = torch.randn(bags_n, dim, generator=gen)
    rows, grads = native.bag_backward(grad, indices, offsets, "sum", None)
    want_rows, want_grads = K.bag_backward_ref(grad, indices, offsets, "sum")
    assert torch.equal(rows, want_rows)
    torch.testing.assert_close(grads, want_grads, rtol=1e-6, atol=1e-4)
    for got, want in zip(native.unique(indices), K.unique_ref(indices)):
        assert torch.equal(got, want)
    hot_map = torch.full((num_rows,), -1, dtype=torch.int32)
    hot_map[:500] = torch.arange(500, dtype=torch.int32)
    for got, want in zip(native.route_ids(indices, hot_map, 8), K.route_ids_ref(indices, hot_map, 8)):
        assert torch.equal(got, want)
    w1, s1 = weight.clone(), torch.zeros(num_rows)
    w2, s2 = weight.clone(), torch.zeros(num_rows)
    native.sparse_update(w1, s1, rows, grads, "rowwise_adagrad", 0.05, 1e-8)
    K.sparse_update_ref(w2, s2, rows, grads, "rowwise_adagrad", 0.05)
    torch.testing.assert_close(w1, w2, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(s1, s2, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_forward_accumulates_in_fp32(native, dtype):
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(100, 16, generator=gen).to(dtype)
    indices = torch.randint(0, 100, (400,), generator=gen)
    offsets = torch.arange(0, 401, 10)
    got = native.bag_forward(weight, indices, offsets, "sum", None)
    exact = K.bag_forward_ref(weight.float(), indices, offsets, "sum")
    assert got.dtype == dtype
    # One rounding of the fp32 sum: within half an ulp of the 16-bit type.
    ulp = torch.finfo(dtype).eps
    assert ((got.float() - exact).abs() <= ulp * exact.abs() + 1e-3).all()


def test_bad_input_raises_one_clear_error(native):
    weight = torch.randn(5, 4)
    with pytest.raises(IndexError, match="index at position 1 is 9"):
        native.bag_forward(weight, torch.tensor([0, 9]), torch.tensor([0, 2]), "sum", None)
    with pytest.raises(ValueError, match="mode must be"):
        native.bag_forward(weight, torch.tensor([0]), torch.tensor([0, 1]), "max", None)
    with pytest.raises(IndexError, match="offsets"):
        native.bag_forward(weight, torch.tensor([0]), torch.tensor([0, 2]), "sum", None)
    with pytest.raises(IndexError, match="offsets of bag 1 are"):
        native.bag_forward(weight, torch.tensor([0, 1, 2, 3]), torch.tensor([0, 3, 1, 4]), "sum", None)
    with pytest.raises(ValueError, match="non-decreasing"):
        native.bag_backward(
            torch.ones(3, 4), torch.tensor([0, 1, 2, 3]), torch.tensor([0, 3, 1, 4]), "sum", None
        )
    with pytest.raises(IndexError, match="id at position 0"):
        native.route_ids(torch.tensor([7]), torch.full((5,), -1), 2)
    with pytest.raises(ValueError, match="unknown sparse optimizer"):
        native.sparse_update(weight, None, torch.tensor([0]), torch.ones(1, 4), "adam", 0.1, 1e-8)
    with pytest.raises(ValueError, match="needs a state"):
        native.sparse_update(weight, None, torch.tensor([0]), torch.ones(1, 4), "rowwise_adagrad", 0.1, 1e-8)


def test_tensors_off_the_cpu_and_float_ids_are_refused_before_any_read(native):
    """Every tensor argument's device and every ID tensor's dtype is checked before the kernel
    reads it (a device tensor's data read on the host is a crash; a float ID was truncated).
    The meta device stands for CUDA here: no data behind it either."""
    weight, meta = torch.randn(5, 4), torch.device("meta")
    with pytest.raises(ValueError, match="got indices on meta"):
        native.bag_forward(weight, torch.tensor([0, 1], device=meta), torch.tensor([0, 2]), "sum", None)
    with pytest.raises(ValueError, match="got offsets on meta"):
        native.bag_backward(torch.ones(1, 4), torch.tensor([0, 1]), torch.tensor([0, 2], device=meta), "sum", None)
    with pytest.raises(ValueError, match="got hot_map on meta"):
        native.route_ids(torch.tensor([1]), torch.full((5,), -1, device=meta), 2)
    with pytest.raises(ValueError, match="got rows on meta"):
        native.sparse_update(weight, None, torch.tensor([0], device=meta), torch.ones(1, 4), "sgd", 0.1, 1e-8)
    with pytest.raises(TypeError, match="indices must be an integer tensor"):
        native.bag_forward(weight, torch.tensor([0.0, 1.7]), torch.tensor([0, 2]), "sum", None)
    with pytest.raises(TypeError, match="ids must be an integer tensor"):
        native.unique(torch.tensor([True, False]))


def test_sorted_inputs_take_the_presorted_path(native):
    """Non-decreasing keys (as bag_backward hands rows to sparse_update) skip the sort."""
    ids = torch.tensor([2, 2, 3, 7, 7, 7, 40, 41], dtype=torch.int64)
    for got, want in zip(native.unique(ids), K.unique_ref(ids)):
        assert torch.equal(got, want)
    weight = torch.randn(50, 5)
    state = torch.rand(50)
    grads = torch.randn(len(ids), 5)
    w_ref, s_ref = weight.clone(), state.clone()
    K.sparse_update_ref(w_ref, s_ref, ids, grads, "rowwise_adagrad", 0.3)
    native.sparse_update(weight, state, ids, grads, "rowwise_adagrad", 0.3, 1e-8)
    torch.testing.assert_close(weight, w_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(state, s_ref, rtol=1e-6, atol=1e-6)
    offsets = torch.tensor([0, 3, 3, 8])
    grad = torch.randn(3, 5)
    rows, g = native.bag_backward(grad, ids, offsets, "mean", None)
    want_rows, want_g = K.bag_backward_ref(grad, ids, offsets, "mean")
    assert torch.equal(rows, want_rows)
    torch.testing.assert_close(g, want_g, rtol=1e-6, atol=1e-6)


def test_offsets_may_start_past_zero(native):
    """CSR offsets that skip a prefix of indices (a slice of a larger batch)."""
    weight = torch.randn(20, 3, dtype=torch.float64)
    indices = torch.tensor([5, 1, 2, 2, 9, 4])
    offsets = torch.tensor([2, 4, 6])
    grad = torch.randn(2, 3, dtype=torch.float64)
    psw = torch.rand(6, dtype=torch.float64)
    rows, g = native.bag_backward(grad, indices, offsets, "sum", psw)
    want_rows, want_g = K.bag_backward_ref(grad, indices[2:], offsets - 2, "sum", psw[2:])
    assert torch.equal(rows, want_rows)
    torch.testing.assert_close(g, want_g)
    out = native.bag_forward(weight, indices, offsets, "sum", psw)
    torch.testing.assert_close(out, K.bag_forward_ref(weight, indices[2:], offsets - 2, "sum", psw[2:]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_backward_and_update(native, dtype):
    """16-bit grads accumulate in fp32 and round once; compare with the fp32 reference."""
    gen = torch.Generator().manual_seed(11)
    indices = torch.randint(0, 30, (200,), generator=gen)
    offsets = torch.arange(0, 201, 5)
    grad = torch.randn(40, 8, generator=gen).to(dtype)
    rows, g = native.bag_backward(grad, indices, offsets, "mean", None)
    want_rows, want_g = K.bag_backward_ref(grad.float(), indices, offsets, "mean")
    assert torch.equal(rows, want_rows) and g.dtype == dtype
    ulp = torch.finfo(dtype).eps
    assert ((g.float() - want_g).abs() <= ulp * want_g.abs() + 1e-3).all()
    weight = torch.randn(30, 8, generator=gen).to(dtype)
    w_ref = weight.float()
    native.sparse_update(weight, None, rows, g, "sgd", 0.5, 1e-8)
    K.sparse_update_ref(w_ref, None, rows, g.float(), "sgd", 0.5)
    assert ((weight.float() - w_ref).abs() <= ulp * w_ref.abs() + 1e-3).all()


@pytest.mark.parametrize(
    "low, high, n",
    [(0, 30, 5000), (0, 200_000, 5000), (-(2**40), 2**40, 5000), (-(2**62), 2**62, 3000)],
    ids=["dense-counting", "radix-32bit", "radix-64bit", "radix-full-range"],
)
def test_unique_every_grouping_path(native, low, high, n):
    gen = torch.Generator().manual_seed(n)
    ids = torch.randint(low, high, (n,), generator=gen)
    ids[::7] = ids[0]  # duplicates in every path
    for got, want in zip(native.unique(ids), K.unique_ref(ids)):
        assert torch.equal(got, want)
    grad = torch.randn(n, 3, generator=gen, dtype=torch.float64)
    rows, g = native.bag_backward(grad, ids - ids.min(), torch.arange(n + 1), "sum", None)
    want_rows, want_g = K.bag_backward_ref(grad, ids - ids.min(), torch.arange(n + 1), "sum")
    assert torch.equal(rows, want_rows)
    torch.testing.assert_close(g, want_g)


@SETTINGS
@given(
    st.integers(1, 30),
    st.sampled_from([1, 4, 16, 17]),
    st.lists(st.integers(0, 29), max_size=80),
    st.integers(1, 6),
    st.sampled_from(["sgd", "rowwise_adagrad"]),
    st.sampled_from([torch.float32, torch.float64]),
)
def test_sparse_update_indexed_equals_the_update_of_expanded_gradients(native, num_rows, dim, rows, n_grads,
                                                                       optimizer, dtype):
    # a pooled pack's owner applies each lookup its bag's gradient: read in place, the result
    # must be bit for bit the update of the expanded gradients (same sums, same order)
    rows = [r % num_rows for r in rows]
    gen = torch.Generator().manual_seed(len(rows) * 7 + n_grads)
    weight = torch.randn(num_rows, dim, generator=gen, dtype=dtype)
    state = torch.rand(num_rows, generator=gen, dtype=dtype)
    grads = torch.randn(n_grads, dim, generator=gen, dtype=dtype)
    index = torch.randint(0, n_grads, (len(rows),), generator=gen)
    rows_t = torch.tensor(rows, dtype=torch.int64)
    w_exp, s_exp = weight.clone(), state.clone()
    native.sparse_update(w_exp, s_exp, rows_t, grads.index_select(0, index), optimizer, 0.1, 1e-8)
    w_ref, s_ref = weight.clone(), state.clone()
    K.sparse_update_indexed_ref(w_ref, s_ref, rows_t, grads, index, optimizer, 0.1)
    native.sparse_update_indexed(weight, state, rows_t, grads, index, optimizer, 0.1, 1e-8)
    assert torch.equal(weight, w_exp) and torch.equal(state, s_exp)
    g_abs = torch.zeros(num_rows, dim, dtype=dtype).index_add_(0, rows_t, grads.index_select(0, index).abs())
    scale = 1.0 if optimizer == "sgd" else 1.0 / (s_ref.sqrt() + 1e-8).unsqueeze(1)
    assert_close_to(weight, w_ref, w_ref.abs() + 0.1 * g_abs * scale + 1e-7, rel=2e-6)


def test_sparse_update_indexed_refuses_a_bad_gradient_index(native):
    weight = torch.randn(5, 4)
    with pytest.raises(IndexError, match="gradient row at position 1 is 3"):
        native.sparse_update_indexed(weight, None, torch.tensor([0, 1]), torch.ones(3, 4), torch.tensor([0, 3]),
                                     "sgd", 0.1, 1e-8)
    with pytest.raises(ValueError, match="one length"):
        native.sparse_update_indexed(weight, None, torch.tensor([0, 1]), torch.ones(3, 4), torch.tensor([0]),
                                     "sgd", 0.1, 1e-8)


def test_the_library_is_cpu_only_and_refuses_other_devices(native):
    """The C++ kernels serve the CPU (the GPU's are Triton): a tensor elsewhere gets one clear
    ValueError from the binding, never a kernel reading device memory."""
    assert not hasattr(native, "has_cuda")
    meta = torch.empty(5, 4, device="meta")
    with pytest.raises(ValueError, match="runs on CPU tensors"):
        native.bag_forward(meta, torch.tensor([0]), torch.tensor([0, 1]), "sum", None)
    with pytest.raises(ValueError, match="runs on CPU tensors"):
        native.unique(torch.empty(3, dtype=torch.int64, device="meta"))
    with pytest.raises(ValueError, match="runs on CPU tensors"):
        native.sparse_update(meta, None, torch.tensor([0]), torch.ones(1, 4), "sgd", 0.1, 1e-8)
