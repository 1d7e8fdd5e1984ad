"""The embedding step of one pack on one GPU: the Triton kernels against the torch path, and the
backward with its update against its byte floor.

One pack of the Criteo Kaggle tables (26 tables, dim 16 or 128, row-wise Adagrad), one ID per
bag, IDs drawn per table from a Zipf law (the long runs of hot rows that Criteo has). Timed
with CUDA events, median of --repeats, in the same run:
- forward: dedup sort + pooling (Triton reads rows by ID; torch gathers the unique rows and
  runs embedding_bag);
- backward+update: Triton's fused pass against bag_grad_rows (index_add_) + sparse update.
Each is timed as called (host launches included) and replayed as a CUDA graph (the GPU alone).
The byte floor of the backward+update: the pooled gradients read, each touched row read and
written, its Adagrad state read and written, at the device copy bandwidth measured here.

    python bench/bench_embedding_gpu.py [--batch 65536] [--dim 16] [-o OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from results_path import results_path  # noqa: E402

from executor.sparse import syncfree, triton_tbe  # noqa: E402
from planner.presets import CRITEO_KAGGLE_CARDINALITIES  # noqa: E402


def timed(fn: Callable[[], None], repeats: int) -> float:
    """Median milliseconds of fn (CUDA events on a GPU; the wall clock for the CPU smoke run)."""
    for _ in range(3):
        fn()
    out = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


def timed_graph(fn: Callable[[], None], repeats: int) -> float | None:
    """Median milliseconds of fn replayed as a CUDA graph: the GPU's time alone, without the
    host's launches (which a single timed call includes when they outlast the kernels)."""
    if not torch.cuda.is_available():
        return None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return timed(graph.replay, repeats)


def copy_bandwidth(dev: torch.device) -> float:
    """Device copy bandwidth in bytes/s (read + write)."""
    x = torch.empty(1 << (28 if dev.type == "cuda" else 22), dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    ms = timed(lambda: y.copy_(x), 10)
    return 2 * x.numel() / (ms * 1e-3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--row-cap", type=int, default=10_000_000)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: the interpreter, a smoke run
    rng = np.random.default_rng(0)
    cards = [min(c, args.row_cap) for c in CRITEO_KAGGLE_CARDINALITIES]
    starts = np.concatenate([[0], np.cumsum(cards)[:-1]])
    ids = np.concatenate([s + (rng.zipf(args.zipf, args.batch) - 1) % c for s, c in zip(starts, cards)])
    ids = torch.from_numpy(ids).to(dev)
    offsets = torch.arange(len(ids) + 1, device=dev)
    rows, n, d = int(sum(cards)), len(ids), args.dim
    weight = torch.randn(rows, d, device=dev) * 0.01
    state = torch.zeros(rows, device=dev)
    grad_out = torch.randn(n, d, device=dev)
    dd = syncfree.dedup_fixed(ids)
    touched = int(dd.n_valid)
    longest = int(torch.bincount(dd.inverse).max())

    def fwd_triton() -> None:
        syncfree.dedup_fixed(ids)
        triton_tbe.pool(weight, ids, offsets, "sum")

    def fwd_torch() -> None:
        x = syncfree.dedup_fixed(ids)
        u = weight.index_select(0, x.uniq)
        torch.nn.functional.embedding_bag(x.inverse, u, offsets, mode="sum", include_last_offset=True)

    def bwd_triton() -> None:
        triton_tbe.bag_update(grad_out, dd.perm, dd.seg, offsets, "sum", dd.uniq, weight, state,
                              "rowwise_adagrad", 1e-9, 1e-8)

    def bwd_torch() -> None:
        gu = syncfree.bag_grad_rows_fixed(grad_out, dd.inverse, offsets, "sum", n)
        syncfree.sparse_update_fixed(weight, state, dd.uniq, gu, "rowwise_adagrad", 1e-9, 1e-8)

    bw = copy_bandwidth(dev)
    floor_bytes = n * d * 4 + touched * (2 * d * 4 + 2 * 4)
    floor_ms = floor_bytes / bw * 1e3
    res = {"device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu (interpreter)", "batch": args.batch, "dim": d, "tables": len(cards),
           "ids": n, "touched_rows": touched, "longest_run": longest, "copy_bandwidth_GBps": bw / 1e9,
           "backward_update_floor_ms": floor_ms}
    for name, fn in (("forward_triton", fwd_triton), ("forward_torch", fwd_torch),
                     ("backward_update_triton", bwd_triton), ("backward_update_torch", bwd_torch)):
        res[f"{name}_ms"] = timed(fn, args.repeats)
        res[f"{name}_graph_ms"] = timed_graph(fn, args.repeats)  # the GPU's time alone
    gpu_ms = res["backward_update_triton_graph_ms"] or res["backward_update_triton_ms"]
    res["backward_update_over_floor"] = gpu_ms / floor_ms
    res["backward_update_speedup"] = res["backward_update_torch_ms"] / res["backward_update_triton_ms"]
    res["forward_speedup"] = res["forward_torch_ms"] / res["forward_triton_ms"]
    for k, v in res.items():
        print(f"{k:28s} {v:,.4g}" if isinstance(v, float) else f"{k:28s} {v}")
    out = args.output or results_path("embedding_gpu", f"d{d}")
    out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
