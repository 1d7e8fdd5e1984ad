"""Does an error raised inside the native library reach Python as one exception?

Each case runs in its own process (`python bench/native_errors_check.py CASE`) so that a
crash names the case: kernel_throw (a C++ exception from the CPU kernels), torch_check (a
TORCH_CHECK in the binding). Used by bench/gpu_session.sh: on the GPU machine the library
built with CUDA crashed on the first case; the library is now CPU-only everywhere.
"""

from __future__ import annotations

import faulthandler
import sys

import torch

from csrc import build

CASES = ("kernel_throw", "torch_check")


def main(case: str) -> int:
    faulthandler.enable()
    lib = build.load()
    w = torch.randn(5, 4)
    mode = "max" if case == "torch_check" else "sum"
    ids = torch.tensor([0]) if case == "torch_check" else torch.tensor([0, 9])
    try:
        lib.bag_forward(w, ids, torch.tensor([0, len(ids)]), mode, None)
    except Exception as exc:  # noqa: BLE001 - any exception type is the answer sought
        print(f"{case}: raised {type(exc).__name__}: {str(exc)[:100]}")
        return 0
    print(f"{case}: no error raised")
    return 1


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in CASES:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(CASES)}}}")
    sys.exit(main(sys.argv[1]))
