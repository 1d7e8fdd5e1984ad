import pytest
import torch

from executor.dense.precision import apply_global, dense_precision
from planner.modes import DenseDtype


def test_fp32_everywhere_and_fallbacks_say_why():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert dense_precision(DenseDtype.FP32, cpu).used == "fp32" and dense_precision(DenseDtype.FP32, cpu).note is None
    p = dense_precision("bf16", cpu, bf16_ok=False)
    assert (p.asked, p.used) == ("bf16", "fp32") and "CPU" in p.note
    p = dense_precision("tf32", cpu)
    assert (p.asked, p.used) == ("tf32", "fp32") and "cpu" in p.note
    assert dense_precision("bf16", gpu, bf16_ok=False).used == "fp32"
    assert dense_precision("bf16", gpu, bf16_ok=True).used == "bf16"
    assert dense_precision("tf32", gpu).used == "tf32"
    with pytest.raises(ValueError, match="fp16"):
        dense_precision("fp16", cpu)


def test_bf16_autocast_runs_linear_layers_in_bf16_and_fp32_does_not():
    # the autocast context itself, exercised on the CPU (the executor uses it on CUDA only)
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    p = dense_precision("bf16", torch.device("cuda"), bf16_ok=True)
    with p.autocast(torch.device("cpu")):
        assert lin(x).dtype == torch.bfloat16
    with dense_precision(DenseDtype.FP32, torch.device("cpu")).autocast(torch.device("cpu")):
        assert lin(x).dtype == torch.float32
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        apply_global(dense_precision("tf32", torch.device("cuda")))
        assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_bf16_on_a_cpu_with_bf16_instructions_runs_mixed_precision():
    """dense_dtype bf16 on such a CPU: bf16 autocast for the dense layers, fp32 weights and gradients."""
    p = dense_precision("bf16", torch.device("cpu"), bf16_ok=True)
    assert (p.asked, p.used, p.note) == ("bf16", "bf16", None)
    lin = torch.nn.Linear(8, 4)
    with p.autocast(torch.device("cpu")):
        y = lin(torch.randn(3, 8))
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert lin.weight.dtype == lin.weight.grad.dtype == torch.float32
