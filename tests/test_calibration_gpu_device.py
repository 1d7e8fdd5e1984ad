"""picasso calibrate on a GPU, through the DeviceBench seam: a fake device whose
microbenchmarks return known rates gives exactly those factors (measured / the spec's peaks),
and nothing timed on the CPU enters the GPU spec."""

from __future__ import annotations

import subprocess
import sys

import pytest

import validation.calibrate as vc
from simulator.calibration import CalibrationError
from simulator.hardware import load_hardware
from validation.calibrate import CalibrateConfig, calibrate

H200 = load_hardware("h200")
# known rates: simple fractions of the h200 preset's peaks
FRACTIONS = {("fp32", "square"): 0.75, ("fp32", "skinny"): 0.5, ("tf32", "square"): 0.8, ("tf32", "skinny"): 0.625,
             ("bf16", "square"): 0.8125, ("bf16", "skinny"): 0.5625, ("fp16", "square"): 0.75, ("fp16", "skinny"): 0.5}
SHAPE_OF = {(8192, 8192, 8192): "square", (65536, 512, 512): "skinny"}


class FakeBench:
    name = "Fake GPU"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def gemm_flops(self, dtype: str, m: int, k: int, n: int) -> float:
        self.calls.append(f"gemm {dtype}")
        return H200.gpu.flops[dtype] * FRACTIONS[(dtype, SHAPE_OF[(m, k, n)])]

    def copy_bw(self, nbytes: int) -> float:
        return H200.gpu.hbm_bw * 0.875

    def gather_bw(self, rows: int, dim: int, n: int) -> float:
        return H200.gpu.hbm_bw * 0.5

    def scatter_bw(self, rows: int, dim: int, n: int) -> float:
        return H200.gpu.hbm_bw * 0.375  # the slower of the two random-row kinds is the spec's

    def h2d_bw(self, nbytes: int) -> float:
        return H200.pcie_bw * 0.75

    def launch_us(self) -> float:
        return 3.25

    def step_host_us(self) -> float:
        return 42.0


def _no_cpu(*a, **k):
    raise AssertionError("a GPU calibration ran the CPU microbenchmarks")


def test_fake_device_rates_become_exactly_the_spec_factors(monkeypatch, tmp_path):
    monkeypatch.setattr(vc, "run_microbenchmarks", _no_cpu)
    bench = FakeBench()
    hw, report = calibrate(CalibrateConfig(base="h200", nproc=1), bench=bench)
    for (dt, shape), f in FRACTIONS.items():
        assert hw.perf.gemm[dt][shape] == pytest.approx(f, rel=1e-12), (dt, shape)
    assert hw.perf.hbm_stream == pytest.approx(0.875, rel=1e-12)
    assert hw.perf.hbm_random == pytest.approx(0.375, rel=1e-12)
    assert hw.perf.pcie == pytest.approx(0.75, rel=1e-12)
    assert hw.perf.step_host_us == 42.0
    assert hw.gpu.launch_us == 3.25
    assert hw.perf.parallel_units == H200.perf.parallel_units  # a datasheet count, kept
    assert hw.efficiency == {}  # no CPU-fitted factor
    assert hw.gpu.flops == H200.gpu.flops  # peaks stay the datasheet's: factors are fractions of them
    # the factors mean what the presets' mean: the cost model's GEMM rate is the measured one
    assert hw.flops_rate("bf16", "gemm") == pytest.approx(H200.gpu.flops["bf16"] * 0.5625)
    assert hw.hbm_rate("random") == pytest.approx(H200.gpu.hbm_bw * 0.375)
    assert sorted(report["perf"]["gemm"]) == ["bf16", "fp16", "fp32", "tf32"]
    # written and read back, the same figures
    hw.save(tmp_path / "hw.json")
    back = load_hardware(tmp_path / "hw.json")
    assert back.perf == hw.perf and back.gpu.launch_us == 3.25


def test_gpu_calibration_needs_a_gpu_base(monkeypatch):
    monkeypatch.setattr(vc, "run_microbenchmarks", _no_cpu)
    with pytest.raises(CalibrationError, match="needs a GPU preset"):
        calibrate(CalibrateConfig(base="local-cpu", nproc=1), bench=FakeBench())


def test_cli_device_cuda_without_cuda_is_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = subprocess.run([sys.executable, "-m", "picasso", "calibrate", "--device", "cuda", "--base", "h200",
                        "-o", str(tmp_path / "hw.json")], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "no CUDA device" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "hw.json").exists()
