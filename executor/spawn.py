"""Run a function on N local gloo ranks (tests and benchmarks; `picasso run` uses executor.agent)."""

from __future__ import annotations

import io
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from executor.rendezvous import free_port, init_loopback_group

__all__ = ["free_port", "init_process_group", "run_ranks"]
init_process_group = init_loopback_group  # the store on loopback only (executor.rendezvous)


def _entry(rank: int, world: int, port: int, timeout_s: float, fn: Callable, args: tuple, q) -> None:
    try:
        torch.set_num_threads(1)
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


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, timeout_s: float = 60.0) -> list[Any]:
    """fn(rank, world, *args) on `world` processes; returns the results in rank order.

    `fn` must be importable (a module-level function). Raises RuntimeError with the first
    rank's error when any rank fails.
    """
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, timeout_s, fn, args, q)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors = []
    reported: set[int] = set()
    deadline = time.monotonic() + timeout_s * 3
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
        errors.append(f"the ranks did not finish within {timeout_s * 3:.0f} s")
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    if errors:
        raise RuntimeError(errors[0])
    return [results[r] for r in range(world)]
