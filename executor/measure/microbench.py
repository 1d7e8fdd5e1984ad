"""Microbenchmarks of this machine for `picasso calibrate`.

Every benchmark runs inside a group of `nproc` ranks (executor.process.spawn.run_ranks: gloo on
loopback, threads per executor.process.threads), all ranks doing the same work over the same
window of time (WINDOW_US): that is the condition of a real `picasso run` with the same
number of ranks, so the contention of ranks over the cores and the memory bus is in the
numbers. Each sample is a plain dict `{"kind", <size features>, "us"}` (median over
windows of the time per call, slowest rank), which
`simulator.calibration` fits to the cost model's coefficients.

On a GPU (`picasso calibrate --device cuda`) the benchmarks run on the device instead, through
the `DeviceBench` seam (`CudaBench`), and give the rates of a spec's perf section
(`measure_device`; simulator.device_perf).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, Protocol

from simulator.device_perf import DeviceRates

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


# ----------------------------------------------------------------------------- GPU device

# What `picasso calibrate` times on a GPU, in the classes the presets carry (simulator.device_perf):
# GEMM per dtype in two shapes, a device copy, random rows gathered and scatter-added, a pinned
# host-to-device copy, back-to-back kernels and an eager step's host time. Every figure is
# timed on the device: no CPU rate enters a GPU spec.
GPU_GEMM_SHAPES = {"square": (8192, 8192, 8192), "skinny": (65536, 512, 512)}
GPU_DTYPES = ("fp32", "tf32", "bf16", "fp16")
GPU_COPY_BYTES = 1 << 30
GPU_TABLE_ROWS = 4_000_000
GPU_ROW_DIM = 128  # fp32 rows of 512 B, as the recommendation presets' tables
GPU_LOOKUPS = 1 << 21


class DeviceBench(Protocol):
    """The seam between the calibration and a device: each method times one kind of work on
    the device and returns its rate. `CudaBench` is the real one; tests pass a fake."""

    name: str

    def gemm_flops(self, dtype: str, m: int, k: int, n: int) -> float: ...  # FLOP/s
    def copy_bw(self, nbytes: int) -> float: ...  # bytes read + written per second
    def gather_bw(self, rows: int, dim: int, n: int) -> float: ...  # random rows, read + written
    def scatter_bw(self, rows: int, dim: int, n: int) -> float: ...  # scatter-add of random rows
    def h2d_bw(self, nbytes: int) -> float: ...  # pinned host to device
    def launch_us(self) -> float: ...  # per kernel, back to back on one stream
    def step_host_us(self) -> float: ...  # an eager step's host time that no kernel hides


def measure_device(bench: DeviceBench, dtypes: tuple[str, ...] = GPU_DTYPES) -> DeviceRates:
    """Every GPU microbenchmark through `bench`, as the rates the spec's perf section is made of."""
    gemm = {dt: {shape: bench.gemm_flops(dt, *mkn) for shape, mkn in GPU_GEMM_SHAPES.items()} for dt in dtypes}
    return DeviceRates(gemm=gemm, copy_bw=bench.copy_bw(GPU_COPY_BYTES),
                       gather_bw=bench.gather_bw(GPU_TABLE_ROWS, GPU_ROW_DIM, GPU_LOOKUPS),
                       scatter_bw=bench.scatter_bw(GPU_TABLE_ROWS, GPU_ROW_DIM, GPU_LOOKUPS),
                       h2d_bw=bench.h2d_bw(1 << 28), launch_us=bench.launch_us(), step_host_us=bench.step_host_us(),
                       device=bench.name)


class CudaBench:
    """DeviceBench on the current CUDA device, timed with CUDA events (median of a few runs)."""

    def __init__(self, reps: int = 5) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device: GPU calibration needs one (use --device cpu)")
        self.torch = torch
        self.dev = torch.device("cuda")
        self.reps = reps
        self.name = torch.cuda.get_device_name(0)

    def _time_us(self, fn: Callable[[], Any], inner: int = 1) -> float:
        torch = self.torch
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(self.reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(inner):
                fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / inner)
        return statistics.median(times)

    def gemm_flops(self, dtype: str, m: int, k: int, n: int) -> float:
        torch = self.torch
        tdt = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        try:
            a = torch.randn(m, k, device=self.dev, dtype=tdt)
            b = torch.randn(k, n, device=self.dev, dtype=tdt)
            us = self._time_us(lambda: a @ b)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
        return 2.0 * m * k * n / us * 1e6

    def copy_bw(self, nbytes: int) -> float:
        src = self.torch.empty(nbytes // 4, device=self.dev)
        dst = self.torch.empty_like(src)
        return 2.0 * nbytes / self._time_us(lambda: dst.copy_(src)) * 1e6

    def _rows(self, rows: int, dim: int, n: int) -> tuple[Any, Any]:
        g = self.torch.Generator(device=self.dev).manual_seed(0)
        table = self.torch.randn(rows, dim, device=self.dev)
        ids = self.torch.randint(0, rows, (n,), device=self.dev, generator=g)
        return table, ids

    def gather_bw(self, rows: int, dim: int, n: int) -> float:
        table, ids = self._rows(rows, dim, n)
        nbytes = 2.0 * n * dim * 4 + n * 8
        return nbytes / self._time_us(lambda: table.index_select(0, ids)) * 1e6

    def scatter_bw(self, rows: int, dim: int, n: int) -> float:
        table, ids = self._rows(rows, dim, n)
        grads = self.torch.randn(n, dim, device=self.dev)
        nbytes = 3.0 * n * dim * 4 + n * 8  # gradient read, row read and written
        return nbytes / self._time_us(lambda: table.index_add_(0, ids, grads)) * 1e6

    def h2d_bw(self, nbytes: int) -> float:
        host = self.torch.empty(nbytes // 4).pin_memory()
        dev = self.torch.empty(nbytes // 4, device=self.dev)
        return nbytes / self._time_us(lambda: dev.copy_(host, non_blocking=True)) * 1e6

    def launch_us(self) -> float:
        x = self.torch.empty(1, device=self.dev)
        inner = 500
        return self._time_us(lambda: x.add_(0), inner)

    def step_host_us(self) -> float:
        """The host time of a small eager step (forward, backward, optimizer of one linear layer
        on a tiny batch: its kernels take no time) less its kernels' launches: what a step pays
        beyond its kernels."""
        torch = self.torch
        lin = torch.nn.Linear(16, 16, device=self.dev)
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        x = torch.randn(8, 16, device=self.dev)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            lin(x).sum().backward()
            opt.step()

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        steps = 50
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        per_step = (time.perf_counter() - t0) * 1e6 / steps
        return max(per_step - 10 * self.launch_us(), 0.0)  # about ten kernels a step
