"""executor.sparse.kernels dispatch: native swap, one warning on failure, PICASSO_NATIVE=0, doctor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from executor.sparse import kernels as K

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("bag_forward", "bag_backward", "route_ids", "unique", "sparse_update")


@pytest.fixture
def fresh_dispatch(monkeypatch):
    """Forget the load state for one test, then put everything back."""
    saved = {name: getattr(K, name) for name in (*NAMES, "_lib", "_tried", "_reason")}
    monkeypatch.setattr(K, "_lib", None)
    monkeypatch.setattr(K, "_tried", False)
    monkeypatch.setattr(K, "_reason", None)
    for name in NAMES:  # back to the lazy first-call trampolines, whatever earlier tests loaded
        monkeypatch.setattr(K, name, K._lazy(name))
    yield
    for name, value in saved.items():
        setattr(K, name, value)


def small_batch():
    weight = torch.randn(10, 4)
    indices = torch.tensor([1, 2, 2, 9, 0])
    offsets = torch.tensor([0, 2, 2, 5])
    return weight, indices, offsets


def test_first_call_loads_native_and_swaps_names(fresh_dispatch, monkeypatch):
    monkeypatch.delenv(K.NATIVE_ENV, raising=False)
    weight, indices, offsets = small_batch()
    out = K.bag_forward(weight, indices, offsets, "sum")  # the lazy trampoline builds/loads
    assert K.native_status()["active"], K.native_status()["reason"]
    assert K.bag_forward is K.bag_forward_native
    torch.testing.assert_close(out, K.bag_forward_ref(weight, indices, offsets, "sum"))
    K.use_reference()
    assert K.unique is K.unique_ref and not K.native_status()["active"]
    assert K.use_native() and K.unique is K.unique_native


def test_build_failure_warns_once_and_keeps_reference(fresh_dispatch, monkeypatch):
    from csrc import build

    def broken(verbose: bool = False):
        raise build.NativeBuildError("no compiler here")

    monkeypatch.delenv(K.NATIVE_ENV, raising=False)
    monkeypatch.setattr(build, "load", broken)
    weight, indices, offsets = small_batch()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = K.bag_forward(weight, indices, offsets, "mean")
        K.unique(indices)
        K.route_ids(indices, None, 2)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "no compiler here" in messages[0]
    assert K.bag_forward is K.bag_forward_ref
    status = K.native_status()
    assert not status["loaded"] and "no compiler here" in status["reason"]
    torch.testing.assert_close(first, K.bag_forward_ref(weight, indices, offsets, "mean"))


def test_env_var_forces_reference_without_warning(fresh_dispatch, monkeypatch):
    monkeypatch.setenv(K.NATIVE_ENV, "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert K.load_native() is False
    assert all(getattr(K, name) is getattr(K, f"{name}_ref") for name in NAMES)
    assert "PICASSO_NATIVE=0" in K.native_status()["reason"]


def test_native_autograd_gives_the_reference_gradients():
    assert K.load_native(), K.native_status()["reason"]
    weight, indices, offsets = small_batch()
    grad = torch.randn(3, 4)
    for psw_grad in (False, True):
        w_native = weight.clone().requires_grad_(True)
        w_ref = weight.clone().requires_grad_(True)
        psw = torch.rand(len(indices), requires_grad=psw_grad)
        (K.bag_forward_native(w_native, indices, offsets, "sum", psw) * grad).sum().backward()
        (K.bag_forward_ref(w_ref, indices, offsets, "sum", psw) * grad).sum().backward()
        torch.testing.assert_close(w_native.grad, w_ref.grad, rtol=1e-6, atol=1e-6)
        if psw_grad:  # gradients for per-sample weights come from the reference path
            assert psw.grad is not None
    with torch.no_grad():
        out = K.bag_forward_native(weight.requires_grad_(True), indices, offsets, "sum")
    assert out.grad_fn is None


def test_native_falls_back_where_it_does_not_apply():
    assert K.load_native()
    ids = torch.tensor([3, 1, 3], dtype=torch.int16)
    for got, want in zip(K.unique_native(ids), K.unique_ref(ids)):
        assert torch.equal(got, want)
    weight = torch.randn(6, 2).t()  # not contiguous: the reference updates it in place
    w_ref = weight.clone()
    K.sparse_update_native(weight, None, torch.tensor([0, 1]), torch.ones(2, 6), "sgd", 0.5)
    K.sparse_update_ref(w_ref, None, torch.tensor([0, 1]), torch.ones(2, 6), "sgd", 0.5)
    torch.testing.assert_close(weight, w_ref)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "picasso.cli", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_doctor_json_reports_torch_backends_and_native():
    done = run_cli("doctor", "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["torch"]["version"] == torch.__version__
    assert info["torch"]["build"] == ("CPU" if torch.version.cuda is None else f"CUDA {torch.version.cuda}")
    assert info["backends"]["gloo"] is torch.distributed.is_gloo_available()
    assert len(info["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert info["native"]["loaded"] is True and info["native"]["reason"] is None
    # the C++ library is the CPU's; the GPU's kernels are Triton, whose version doctor reports
    from importlib import metadata

    assert "cuda" not in info["native"] and "-cpu-" in info["native"]["build_dir"]
    assert info["toolchain"]["triton"] == metadata.version("triton")


def test_doctor_text_says_why_native_is_off():
    done = run_cli("doctor", env={K.NATIVE_ENV: "0"})
    assert done.returncode == 0, done.stderr
    assert "native    not loaded: disabled by PICASSO_NATIVE=0" in done.stdout
    assert "torch     " in done.stdout and "backends  " in done.stdout
