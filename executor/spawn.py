"""Run a function on N local gloo ranks: the tests, benchmarks and calibration microbenchmarks.

`picasso run` starts its ranks through executor.agent (executor.launch). The store listens
on loopback only (executor.rendezvous); threads per rank follow executor.threads.
"""

from __future__ import annotations

import io
import os
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from executor.rendezvous import free_port, init_loopback_group
from executor.threads import WAIT_ENV, set_rank_threads

__all__ = ["free_port", "init_process_group", "run_ranks"]
init_process_group = init_loopback_group  # the store on loopback only (executor.rendezvous)


def _entry(rank: int, world: int, port: int, timeout_s: float, threads: int | None, fn: Callable, args: tuple,
           q) -> None:
    try:
        set_rank_threads(world, threads)
        init_process_group(rank, world, port, timeout_s)
        out = fn(rank, world, *args)
        buf = io.BytesIO()
        torch.save(out, buf)  # plain bytes: tensors shared through the queue die with the process
        q.put((rank, "ok", buf.getvalue()))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        q.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, timeout_s: float = 60.0,
              threads: int | None = 1) -> list[Any]:
    """fn(rank, world, *args) on `world` processes; returns the results in rank order.

    `fn` must be importable (a module-level function). `threads`: intra-op threads per
    rank (None: executor.threads' share of the cores). Raises RuntimeError with the first
    rank's error when any rank fails; a failure, a timeout, Ctrl-C or SIGTERM stops every
    rank (none outlives the caller).
    """
    for k, v in WAIT_ENV.items():  # read by OpenMP as each rank loads torch
        os.environ.setdefault(k, v)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, timeout_s, threads, fn, args, q))
             for r in range(world)]
    try:
        for p in procs:
            p.start()
        results, errors = _collect(procs, q, world, timeout_s * 3)
    except BaseException:  # Ctrl-C, SIGTERM (picasso.cli raises it here): stop them now
        _stop(procs, grace_s=0.0)
        raise
    _stop(procs)
    if errors:
        raise RuntimeError(errors[0])
    return [results[r] for r in range(world)]


def _collect(procs: list[Any], q: Any, world: int, wait_s: float) -> tuple[dict[int, Any], list[str]]:
    results: dict[int, Any] = {}
    errors: list[str] = []
    reported: set[int] = set()
    deadline = time.monotonic() + wait_s
    while len(reported) < world and time.monotonic() < deadline:
        try:
            rank, status, out = q.get(timeout=0.5)
        except queue.Empty:
            # a rank killed by a signal or os._exit never reports: stop waiting for it
            dead = [r for r, p in enumerate(procs) if r not in reported and p.exitcode not in (None, 0)]
            if dead:
                errors.append(f"rank {dead[0]} died (exit code {procs[dead[0]].exitcode})")
                break
            continue
        reported.add(rank)
        if status == "ok":
            results[rank] = torch.load(io.BytesIO(out), weights_only=False)  # our own child's bytes
        else:
            errors.append(f"rank {rank}: {out}")
    if len(reported) < world and not errors:
        errors.append(f"the ranks did not finish within {wait_s:.0f} s")
    return results, errors


def _stop(procs: list[Any], grace_s: float = 10.0) -> None:
    """Wait for the ranks a grace period, then terminate and, failing that, kill them."""
    deadline = time.monotonic() + grace_s
    for p in procs:
        if p.pid is not None:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(timeout=2.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=2.0)
