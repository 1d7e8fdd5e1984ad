"""Where the time of one embedding step goes on a GPU: kernel time vs host time per stage.

Runs the bench's step (route, unique, forward, backward, update) under torch.profiler for
the native and the pure-PyTorch path and prints the top operators by GPU and CPU time.

    python bench/profile_cuda_step.py [--batch 4096] [--dim 16]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import STAGES, make_case, step  # noqa: E402

from executor.sparse import kernels as K  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--rows", type=int, default=1_000_000)
    args = ap.parse_args()
    case = make_case("profile", tables=26, rows=args.rows, dim=args.dim, batch=args.batch, pooling=1,
                     owners=8, hot_frac=0.02, device="cuda")
    from torch.profiler import ProfilerActivity, profile

    for path in ("native", "reference"):
        K.use_native() if path == "native" else K.use_reference()
        for _ in range(3):
            step(case, {s: [] for s in STAGES}, torch.cuda.synchronize)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step(case, {s: [] for s in STAGES}, torch.cuda.synchronize)
        print(f"==== {path}, batch {args.batch}, dim {args.dim} (5 steps)")
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=60))
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
