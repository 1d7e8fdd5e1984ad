"""torch.compile (inductor) for the dense half, as an option against the hand-written path.

`PICASSO_DENSE_COMPILE=inductor` compiles the bottom and top stages of the dense model (and the
interaction of the architectures whose interaction is plain torch: DCN's cross layers, DeepFM,
Wide & Deep, DIN); DLRM's interaction stays on its fused kernels. The compiled functions are
built during the eager warm-up steps, so a CUDA graph captured after them replays the compiled
kernels. The default is the hand-written path (`off`): the GPU bench times both
(bench/bench_executor_gpu.py, variant `compiled`).
"""

from __future__ import annotations

import os
from enum import Enum

from executor.dense.model import DLRM, DenseArch

COMPILE_ENV = "PICASSO_DENSE_COMPILE"


class DenseCompile(Enum):
    OFF = "off"
    INDUCTOR = "inductor"

    @classmethod
    def from_env(cls) -> DenseCompile:
        value = os.environ.get(COMPILE_ENV, cls.OFF.value).strip().lower()
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"{COMPILE_ENV}={value!r}: expected one of {[m.value for m in cls]}") from None


def compile_dense(dense: DenseArch, mode: DenseCompile) -> list[str]:
    """Replace `dense`'s stage methods by their compiled versions (in place); the names compiled."""
    if mode == DenseCompile.OFF:
        return []
    import torch

    stages = ["bottom", "top"] + ([] if isinstance(dense, DLRM) else ["interaction"])
    for name in stages:
        setattr(dense, name, torch.compile(getattr(dense, name), backend="inductor", dynamic=False))
    return stages
