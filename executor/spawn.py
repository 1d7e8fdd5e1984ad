"""Run a function on N local gloo ranks (tests and benchmarks; `picasso run` uses torchrun)."""

from __future__ import annotations

import datetime
import io
import os
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_process_group(rank: int, world: int, port: int, timeout_s: float = 60.0, backend: str = "gloo") -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


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
    for _ in range(world):
        try:
            rank, status, out = q.get(timeout=timeout_s * 3)
        except Exception as exc:  # noqa: BLE001 - queue.Empty: a rank died without reporting
            errors.append(f"a rank exited without reporting ({type(exc).__name__}: {exc})")
            break
        if status == "ok":
            results[rank] = torch.load(io.BytesIO(out), weights_only=False)
        else:
            errors.append(f"rank {rank}: {out}")
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    if errors:
        raise RuntimeError(errors[0])
    return [results[r] for r in range(world)]
