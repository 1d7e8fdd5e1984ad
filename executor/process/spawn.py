"""Run a function on N local gloo ranks: the tests, benchmarks and calibration microbenchmarks.

Ranks are started by the one launcher, executor.process.agent (`start_ranks`, `wait_ranks`), as
`python -m executor.process.rank_call`; the store is hosted here on loopback only
(executor.process.rendezvous); threads per rank follow executor.process.threads.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from executor.process.agent import start_ranks, stop_ranks, wait_ranks
from executor.process.rendezvous import free_port, host_store, init_loopback_group
from executor.process.threads import WAIT_ENV

__all__ = ["free_port", "init_process_group", "run_ranks"]
init_process_group = init_loopback_group  # the store on loopback only (executor.process.rendezvous)
# a collective that failed because a peer went away (gloo's words), not a rank's own error
BROKEN = re.compile(r"Connection (reset|closed) by peer|Broken pipe|Socket closed|[Tt]imed out", re.I)


def _reference(fn: Callable) -> tuple[str, str, str | None]:
    """How a rank finds `fn`: its module and name, and for the caller's script its path."""
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None) if fn.__module__ == "__main__" else None
    if "<locals>" in fn.__qualname__ or (fn.__module__ == "__main__" and not script):
        raise ValueError(f"run_ranks needs an importable module-level function, not {fn.__qualname__}")
    return fn.__module__, fn.__qualname__, script


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, timeout_s: float = 60.0,
              threads: int | None = 1) -> list[Any]:
    """fn(rank, world, *args) on `world` processes; returns the results in rank order.

    `fn` must be importable (a module-level function). `threads`: intra-op threads per
    rank (None: executor.process.threads' share of the cores). Raises RuntimeError with the first
    rank's error when any rank fails; a failure, a timeout, Ctrl-C or SIGTERM stops every
    rank (none outlives the caller).
    """
    ref = _reference(fn)
    base = {**WAIT_ENV, **os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    with tempfile.TemporaryDirectory(prefix="picasso-ranks-") as folder:
        d = Path(folder)
        torch.save((ref, args, timeout_s, threads), d / "call.pt")
        port = free_port()
        store = host_store("127.0.0.1", port, world, timeout_s)
        procs = start_ranks(["executor.process.rank_call", folder], world, 1, 0, "127.0.0.1", port, base)
        try:
            out = wait_ranks(procs, poll_s=0.02, grace_s=10.0, deadline_s=timeout_s * 3)
        except BaseException:  # Ctrl-C, SIGTERM (picasso.cli raises it here): stop them now
            stop_ranks(procs, 0.0)
            raise
        finally:
            del store
        if not out.ok:
            raise RuntimeError(_blame(d, out, timeout_s * 3))
        return [torch.load(d / f"rank{r}.pt", weights_only=False) for r in range(world)]  # our own ranks' files


def _blame(d: Path, out: Any, wait_s: float) -> str:
    """The failing rank's error, as executor.process.agent.first_error blames: a rank's own error
    first, then a rank that died without one, then a broken collective, then the time-out."""
    files = sorted(d.glob("rank*.err"), key=lambda f: f.stat().st_mtime_ns)  # in the order they failed
    errors = {int(f.stem.removeprefix("rank")): f.read_text() for f in files}
    own = [r for r, text in errors.items() if not BROKEN.search(text.split("\n", 1)[0])]
    died = sorted(r for r in out.failed if r not in errors)
    if own:
        return f"rank {own[0]}: {errors[own[0]]}"
    if died:
        return f"rank {died[0]} died (exit code {out.failed[died[0]]})"
    if errors:
        r = next(iter(errors))
        return f"rank {r}: {errors[r]}"
    return f"the ranks did not finish within {wait_s:.0f} s"
