"""Microbenchmarks of this machine for `picasso calibrate`.

Every benchmark runs inside a group of `nproc` ranks (executor.process.spawn.run_ranks: gloo on
loopback, threads per executor.process.threads), all ranks doing the same work over the same
window of time (WINDOW_US): that is the condition of a real `picasso run` with the same
number of ranks, so the contention of ranks over the cores and the memory bus is in the
numbers. Each sample is a plain dict `{"kind", <size features>, "us"}` (median over
windows of the time per call, slowest rank), which
`simulator.calibration` fits to the cost model's coefficients.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

Sample = dict[str, Any]

# Sizes kept small: the whole calibration must stay well under two minutes on 2 cores.
GATHER_ROWS = 200_000
GATHER_DIMS = (8, 16, 32, 64)
GATHER_IDS = (256, 2048, 16384, 65536)
POOL_BAGS = (256, 2048)
POOL_FACTORS = (1, 4, 16)
# Up to 64 MiB: with 4 ranks on 2 cores a collective's fixed cost (ranks waiting to be
# scheduled) is 3-7 ms, which hides the bytes up to 4 MiB; fitted on those sizes alone the
# all-reduce's bandwidth came out 4-13x too high and made every hot row look free.
COLL_BYTES = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22, 1 << 24, 1 << 26)
COLL_BYTES_QUICK = (1 << 10, 1 << 14, 1 << 17, 1 << 24)  # still one size where the bytes show
GEMM_BATCHES = (128, 512, 2048)
DEFAULT_MLP = ((13, 512), (512, 256), (256, 16), (367, 512), (512, 256), (256, 1))


# Each compute sample times a run of calls at least this long, between barriers. One call
# after a barrier mostly ran alone: 4 ranks on 2 cores do not start together, a short op is
# done before the next rank is scheduled, and the 512-row GEMMs measured a whole core per
# rank (84 GFLOP/s) where a run's ranks get half of one (~36 GFLOP/s, per-op timings of
# the DCNv2 bench). Over a window longer than the scheduler's slices the ranks share the
# cores as a run's ranks do, and a rank's time per call holds that share.
WINDOW_US = 20_000.0


def _time_us(fn: Callable[[], Any], reps: int, barrier: Callable[[], Any] | None = None,
             window_us: float = 0.0, clock: Callable[[], float] = time.perf_counter) -> float:
    """Median over `reps` windows of the wall time per call of `fn` in microseconds, after
    one warm-up call; a window is one call, or as many as fill `window_us`."""
    fn()
    times = []
    for _ in range(reps):
        if barrier is not None:
            barrier()
        calls = 0
        t0 = clock()
        while True:
            fn()
            calls += 1
            elapsed = (clock() - t0) * 1e6
            if elapsed >= window_us:
                break
        times.append(elapsed / calls)
    return statistics.median(times)


def _windows(reps: int) -> int:
    # a window holds many calls: three give a stable median
    return min(reps, 3)


def _reps_for(work_bytes: float) -> int:
    # Fewer repetitions for big ops: the median is stable and the budget is tight.
    return 3 if work_bytes > 8e6 else 7 if work_bytes > 5e5 else 15


def bench_gather(barrier: Callable[[], Any] | None = None, quick: bool = False) -> list[Sample]:
    """Row gather (index_select) over ID counts and dims: `bytes` read + written."""
    import torch

    out = []
    g = torch.Generator().manual_seed(0)
    ids_list = GATHER_IDS[:3] if quick else GATHER_IDS
    for dim in GATHER_DIMS[:2] if quick else GATHER_DIMS:
        table = torch.randn(GATHER_ROWS, dim)
        for n in ids_list:
            ids = torch.randint(0, GATHER_ROWS, (n,), generator=g)
            nbytes = 2 * n * dim * 4 + n * 8  # rows read, rows written, ids read
            us = _time_us(lambda t=table, i=ids: torch.index_select(t, 0, i),
                          _windows(_reps_for(nbytes)), barrier, WINDOW_US)
            out.append({"kind": "gather", "rows": GATHER_ROWS, "dim": dim, "n": n, "bytes": nbytes, "us": us})
    return out


def bench_pool(barrier: Callable[[], Any] | None = None, quick: bool = False) -> list[Sample]:
    """Sum pooling (embedding_bag) over bag counts and pooling factors."""
    import torch
    import torch.nn.functional as F

    out = []
    g = torch.Generator().manual_seed(1)
    dim = 16
    table = torch.randn(GATHER_ROWS, dim)
    for bags in POOL_BAGS:
        for L in POOL_FACTORS[:2] if quick else POOL_FACTORS:
            n = bags * L
            ids = torch.randint(0, GATHER_ROWS, (n,), generator=g)
            offsets = torch.arange(0, n, L)
            nbytes = n * dim * 4 + bags * dim * 4 + n * 8
            us = _time_us(
                lambda i=ids, o=offsets: F.embedding_bag(i, table, o, mode="sum"),
                _windows(_reps_for(nbytes)), barrier, WINDOW_US)
            out.append({"kind": "pool", "dim": dim, "bags": bags, "L": L, "n": n, "bytes": nbytes, "us": us})
    return out


def bench_gemm(
    shapes: tuple[tuple[int, int], ...] = DEFAULT_MLP,
    barrier: Callable[[], Any] | None = None,
    quick: bool = False,
) -> list[Sample]:
    """Linear layers of the model's MLPs, forward (x @ W^T) and the two backward GEMMs."""
    import torch

    out = []
    for batch in GEMM_BATCHES[:2] if quick else GEMM_BATCHES:
        for k, n in shapes:
            x = torch.randn(batch, k)
            w = torch.randn(n, k)
            gy = torch.randn(batch, n)
            flops = 2.0 * batch * k * n
            nbytes = 4.0 * (batch * k + k * n + batch * n)
            reps = _windows(_reps_for(flops / 10))
            fwd = _time_us(lambda x=x, w=w: torch.nn.functional.linear(x, w), reps, barrier, WINDOW_US)
            bwd = _time_us(lambda x=x, w=w, gy=gy: (gy @ w, gy.t() @ x), reps, barrier, WINDOW_US)
            out.append({"kind": "gemm", "phase": "fwd", "m": batch, "k": k, "n": n,
                        "flops": flops, "bytes": nbytes, "us": fwd})
            out.append({"kind": "gemm", "phase": "bwd", "m": batch, "k": k, "n": n,
                        "flops": 2 * flops, "bytes": 2 * nbytes, "us": bwd})
    return out


def bench_collectives(world: int, quick: bool = False) -> list[Sample]:
    """all_to_all_single and all_reduce over sizes (bytes per rank), this rank's view."""
    import torch
    import torch.distributed as dist

    out = []
    sizes = COLL_BYTES_QUICK if quick else COLL_BYTES
    for nbytes in sizes:
        n = max(world, nbytes // 4 // world * world)
        send = torch.randn(n)
        recv = torch.empty(n)
        reps = _reps_for(nbytes)
        us = _time_us(lambda s=send, r=recv: dist.all_to_all_single(r, s), reps, dist.barrier)
        out.append({"kind": "all_to_all", "world": world, "bytes": n * 4, "us": us})
        buf = torch.randn(n)
        us = _time_us(lambda b=buf: dist.all_reduce(b), reps, dist.barrier)
        out.append({"kind": "all_reduce", "world": world, "bytes": n * 4, "us": us})
    return out


def bench_cuda() -> list[Sample]:
    """Host-device copies (pinned) and empty-kernel launch overhead, when CUDA exists."""
    import torch

    if not torch.cuda.is_available():
        return []
    out = []
    dev = torch.device("cuda")

    def synced(fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> None:
            fn()
            torch.cuda.synchronize()
        return run

    for nbytes in (1 << 16, 1 << 20, 1 << 24, 1 << 27):
        host = torch.empty(nbytes // 4).pin_memory()
        devt = torch.empty(nbytes // 4, device=dev)
        out.append({"kind": "h2d", "bytes": nbytes,
                    "us": _time_us(synced(lambda h=host, d=devt: d.copy_(h, non_blocking=True)), 10)})
        out.append({"kind": "d2h", "bytes": nbytes,
                    "us": _time_us(synced(lambda h=host, d=devt: h.copy_(d, non_blocking=True)), 10)})
        out.append({"kind": "d2d", "bytes": 2 * nbytes,
                    "us": _time_us(synced(lambda d=devt: d.clone()), 10)})
    x = torch.empty(1, device=dev)
    launches = 200

    def many() -> None:
        for _ in range(launches):
            x.add_(0)
        torch.cuda.synchronize()

    out.append({"kind": "launch", "us": _time_us(many, 5) / launches})
    return out


def _rank(rank: int, world: int, opts: dict[str, Any]) -> list[Sample]:
    """One rank's samples (run by executor.process.spawn.run_ranks, process group set up)."""
    import torch.distributed as dist

    quick = bool(opts.get("quick"))
    shapes = tuple(tuple(s) for s in opts.get("mlp_shapes") or DEFAULT_MLP)
    samples: list[Sample] = []
    barrier = dist.barrier if world > 1 else None
    samples += bench_gather(barrier, quick)
    samples += bench_pool(barrier, quick)
    samples += bench_gemm(shapes, barrier, quick)
    if world > 1:
        samples += bench_collectives(world, quick)
    if rank == 0 and opts.get("cuda", True):
        samples += bench_cuda()
    return samples


def run_microbenchmarks(
    nproc: int = 2,
    threads: int | None = None,
    mlp_shapes: tuple[tuple[int, int], ...] | None = None,
    quick: bool = False,
    timeout_s: float = 300.0,
) -> list[Sample]:
    """Run every microbenchmark in `nproc` gloo ranks; slowest rank per sample.

    `threads` is the intra-op thread count per rank (default: executor.process.threads' share of
    the cores, as a run's ranks get).
    """
    from executor.process.spawn import run_ranks
    from executor.process.threads import threads_per_rank

    if nproc < 1:
        raise ValueError(f"--nproc must be at least 1, got {nproc}")
    threads = threads or threads_per_rank(nproc)
    opts = {"quick": quick, "mlp_shapes": [list(s) for s in mlp_shapes or DEFAULT_MLP]}
    try:
        per_rank = run_ranks(_rank, nproc, opts, timeout_s=timeout_s / 3, threads=threads)
    except RuntimeError as exc:
        raise RuntimeError(f"calibration microbenchmarks failed: {exc}".splitlines()[0]) from None
    # Ranks run the same list in the same order; a step is as slow as its slowest rank.
    merged = []
    for i, s in enumerate(per_rank[0]):
        others = [pr[i]["us"] for pr in per_rank if i < len(pr) and pr[i]["kind"] == s["kind"]]
        merged.append({**s, "us": max(others), "threads": threads, "nproc": nproc})
    return merged
