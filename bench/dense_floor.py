"""The dense floor of a DLRM step on one CPU core: the bottom and top MLPs' forward and backward alone.

Any executor of the model, TorchRec's or picasso's, runs these fp32 GEMMs every step on every
rank (data-parallel dense layers). Timed alone, without embeddings, interaction, optimizer or
communication, they bound the samples/s any fp32 executor can reach on this machine:
ranks x batch / floor. bench_vs_torchrec.py reports that ceiling beside both sides, measured in
the same command, so a goal above it is seen to be out of reach rather than merely missed.

Runs in its own process with one thread (OMP_NUM_THREADS=1 is the per-rank share of the 2
cores), and also times one large square GEMM: the core's fp32 GEMM peak, for scale.

    python bench/dense_floor.py --dim 64 --batch 2048 [--reps 20]   # prints one JSON line
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _timed(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(dim: int, batch: int, reps: int) -> dict:
    import torch

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_vs_torchrec import model_for

    from planner.dense import mlp_shapes

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = model_for(dim)
    shapes = mlp_shapes(model)
    nb = len(model.bottom_mlp)
    bottom = torch.nn.Sequential(*[m for i, o in shapes[:nb] for m in (torch.nn.Linear(i, o), torch.nn.ReLU())])
    top = torch.nn.Sequential(*[m for i, o in shapes[nb:] for m in (torch.nn.Linear(i, o), torch.nn.ReLU())][:-1])
    x = torch.randn(batch, shapes[0][0])
    # the top MLP's input needs its gradient: the interaction's backward reads it
    z = torch.randn(batch, shapes[nb][0], requires_grad=True)

    def step() -> None:
        for p in (*bottom.parameters(), *top.parameters()):
            p.grad = None
        bottom(x).sum().backward()
        top(z).sum().backward()

    floor = _timed(step, reps)
    flops = 3 * sum(2.0 * batch * i * o for i, o in shapes)  # forward + backward (input and weight gradients)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    peak = 2.0 * 2048**3 / _timed(lambda: a @ b, max(5, reps // 2))
    return {"dim": dim, "batch_per_rank": batch, "mlp_shapes": [list(s) for s in shapes], "floor_s": floor,
            "mlp_gflop": flops / 1e9, "mlp_gflop_per_s": flops / floor / 1e9, "core_gemm_peak_gflop_per_s": peak / 1e9}


def dense_floor(dim: int, batch: int, reps: int = 20) -> dict:
    """measure() in a fresh one-thread process (the bench's own process has other thread settings)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    p = subprocess.run([sys.executable, __file__, "--dim", str(dim), "--batch", str(batch), "--reps", str(reps)],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"dense floor failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True, help="per-rank batch")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    if args.dim < 1 or args.batch < 1 or args.reps < 1:
        raise SystemExit("--dim, --batch and --reps must be at least 1")
    print(json.dumps(measure(args.dim, args.batch, args.reps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
