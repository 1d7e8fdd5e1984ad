"""The native dot interaction (csrc/interaction_cpu.cpp) against the bmm reference.

Forward and backward must agree to fp32 rounding (both sum over d in order) for batch sizes
that are not a multiple of the kernel's 16 lanes, input counts and dims that are not a multiple
of its 4 x 4 register tiles (DLRM's 27 inputs among them), and one or two inputs; DLRM's dense model must dispatch to it on CPU fp32.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor.dense.interaction import dot_interaction_ref
from executor.sparse import kernels as K
from executor.sparse.kernels import dot_interaction_native


@pytest.fixture(scope="module", autouse=True)
def native():
    assert K.use_native(), K.native_status()["reason"]  # a build failure is a failure, not a skip


def both(xs: list[torch.Tensor], grad: torch.Tensor):
    outs = []
    for fn in (dot_interaction_ref, dot_interaction_native):
        leaves = [x.clone().requires_grad_() for x in xs]
        out = fn(leaves)
        out.backward(grad)
        outs.append((out.detach(), [q.grad for q in leaves]))
    return outs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(0, 70), f=st.integers(1, 30), d=st.sampled_from([1, 3, 6, 8, 13, 16, 64]), seed=st.integers(0, 99))
def test_native_matches_bmm_reference(n: int, f: int, d: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, d, generator=g) for _ in range(f)]
    grad = torch.randn(n, d + f * (f - 1) // 2, generator=g)
    (ref, ref_g), (nat, nat_g) = both(xs, grad)
    assert nat.shape == ref.shape
    torch.testing.assert_close(nat, ref, rtol=1e-5, atol=1e-5 * d)
    for a, b in zip(nat_g, ref_g):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * d * f)


def test_pairs_in_lower_triangle_order_and_first_input_passes_through() -> None:
    xs = [torch.full((17, 2), float(v)) for v in (1, 2, 3)]
    out = dot_interaction_native(xs)
    # [x0 | x1.x0, x2.x0, x2.x1] with x_i = v_i in both columns
    assert out[0].tolist() == [1.0, 1.0, 4.0, 6.0, 12.0]
    assert torch.equal(out[:, :2], xs[0])


def test_dlrm_dispatches_to_the_native_kernel(monkeypatch) -> None:
    from executor.dense.model import build_dense
    from planner.presets import get_model

    model = get_model("dlrm-criteo-kaggle").with_row_cap(100)
    dense = build_dense(model, seed=0)
    calls = []
    monkeypatch.setattr(K, "dot_interaction", lambda xs: calls.append(len(xs)) or dot_interaction_ref(xs))
    d = model.tables[0].dim
    embs = {t.name: torch.randn(4, d) for t in model.tables}
    dense(torch.randn(4, model.num_dense), embs, {})
    assert calls == [len(model.tables) + 1]


def test_other_dtypes_fall_back_to_the_reference() -> None:
    xs = [torch.randn(5, 4, dtype=torch.float64) for _ in range(3)]
    torch.testing.assert_close(dot_interaction_native(xs), dot_interaction_ref(xs))


def test_pack_gradient_is_a_view_of_the_interaction_gradient() -> None:
    """The per-table gradients the native backward writes end to end reach the pack uncopied."""
    from executor.step.trainer import leaves_grad

    xs = [torch.randn(33, 8) for _ in range(4)]
    leaves = [x.clone().requires_grad_() for x in xs]
    dot_interaction_native(leaves).sum().backward()
    g = leaves_grad(leaves[1:])
    assert g.shape == (99, 8)
    assert g.data_ptr() == leaves[1].grad.data_ptr()
    torch.testing.assert_close(g, torch.cat([q.grad for q in leaves[1:]]))
    # not adjacent (the first input's gradient is its own buffer): copied, same values
    g2 = leaves_grad(leaves[:2])
    torch.testing.assert_close(g2, torch.cat([leaves[0].grad, leaves[1].grad]))
    assert g2.data_ptr() != leaves[0].grad.data_ptr()
