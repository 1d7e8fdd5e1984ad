"""The precision the dense layers run at, from the model's dense_precision (planner.modes.DenseDtype).

The planner costs the dense ops at fp32, tf32 or bf16 (planner.dense.dense_dtype); the
executor runs them the same way where the device can: tf32 matmuls or bf16 autocast on a
CUDA GPU that supports it, bf16 autocast on a CPU with bf16 dot-product instructions
(AVX512_BF16 or AMX: there oneDNN's bf16 GEMMs run about twice the fp32 rate; without them
bf16 would be emulated, slower than fp32). Elsewhere (tf32 on CPU, GPUs or CPUs without
bf16) the dense layers run in fp32, which is also what lowering assumes for hardware
without that FLOP rate. Mixed precision: the weights (the master copy), their gradients and
optimizer state, the embedding tables and the loss stay fp32 either way.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from planner.modes import DenseDtype


@dataclass(frozen=True)
class DensePrecision:
    asked: DenseDtype
    used: DenseDtype
    note: str | None = None

    def autocast(self, device: torch.device) -> Any:
        """Context for the dense forward: bf16 autocast when the dense layers run at bf16."""
        if self.used == DenseDtype.BF16:
            return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()


def cpu_has_bf16() -> bool:
    """Whether this CPU has bf16 dot-product instructions (Linux: /proc/cpuinfo flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


def dense_precision(asked: DenseDtype | str, device: torch.device, bf16_ok: bool | None = None) -> DensePrecision:
    """What the dense layers run at on `device` when `asked` (ModelSpec.dense_precision) is asked
    for (bf16_ok: the device has bf16; None asks torch or the CPU)."""
    want = DenseDtype.from_str(asked, "dense_dtype")
    if want == DenseDtype.FP32:
        return DensePrecision(want, DenseDtype.FP32)
    if device.type == "cpu" and want == DenseDtype.BF16:
        if cpu_has_bf16() if bf16_ok is None else bf16_ok:
            return DensePrecision(want, DenseDtype.BF16)
        return DensePrecision(want, DenseDtype.FP32, "dense_dtype bf16: this CPU has no bf16 instructions; runs in fp32")
    if device.type != "cuda":
        return DensePrecision(want, DenseDtype.FP32, f"dense_dtype {want}: runs in fp32 on {device.type}")
    if want == DenseDtype.BF16:
        ok = torch.cuda.is_bf16_supported() if bf16_ok is None else bf16_ok
        if not ok:
            return DensePrecision(want, DenseDtype.FP32, "dense_dtype bf16: this GPU has no bf16; runs in fp32")
    return DensePrecision(want, want)


def apply_global(p: DensePrecision) -> None:
    """tf32 is a process-wide matmul switch in torch; set it for the run."""
    if p.used == DenseDtype.TF32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
