"""Start the workers of a plan through torchrun and collect rank 0's result."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from executor.spawn import free_port


class LaunchError(RuntimeError):
    """A worker failed; the message is the first worker error (one line)."""


def torchrun_command(
    worker_args: list[str],
    nproc: int,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc-per-node", str(nproc), "--nnodes", str(nnodes), "--node-rank", str(node_rank),
        "--master-addr", master_addr, "--master-port", str(master_port or free_port()),
        "--max-restarts", "0", "--monitor-interval", "0.5",
        "-m", "executor", *worker_args,
    ]


def first_error(log: str) -> str:
    """The clearest single line out of the workers' and torchrun's output."""
    lines = log.splitlines()
    mine = [ln for ln in lines if re.match(r"executor rank \d+: error:", ln)]
    direct = [m for m in mine if "another rank probably died" not in m]
    if direct:  # a rank that failed on its own says why
        return re.sub(r"^executor (rank \d+): error: ", r"\1: ", direct[0])
    root = log.split("Root Cause", 1)[1] if "Root Cause" in log else ""
    m = re.search(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", root, re.S)
    if m:  # a rank that died gives no line of its own; torchrun names it
        return f"worker rank {m.group(1)} died (exit code {m.group(2)}); the other ranks stopped"
    if mine:
        return re.sub(r"^executor (rank \d+): error: ", r"\1: ", mine[0])
    tail = [ln for ln in lines if ln.strip()]
    return tail[-1] if tail else "the workers failed without output"


def launch(
    plan_path: str,
    data: str,
    fmt: str = "criteo",
    nproc: int | None = None,
    steps: int = 20,
    extra: list[str] | None = None,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    timeout_s: float | None = None,
    env: dict[str, str] | None = None,
) -> dict:
    """Run the plan on `nproc` local workers; returns rank 0's result dict."""
    from planner.plan import Plan

    plan = Plan.load(plan_path)
    plan.load_hot_ids(plan_path)  # a missing or wrong hot-ID file fails here, before any worker starts
    if data != "synthetic" and not Path(data).exists() and not glob.glob(data):
        raise FileNotFoundError(f"{data}: no such data file")
    nproc = nproc or plan.world_size // nnodes
    if nproc * nnodes != plan.world_size:
        raise ValueError(
            f"{plan_path}: the plan is for {plan.world_size} ranks, --nproc {nproc} x {nnodes} node(s) gives {nproc * nnodes}"
        )
    with tempfile.TemporaryDirectory(prefix="picasso-run-") as tmp:
        result_path = Path(tmp) / "result.json"
        args = ["--plan", str(plan_path), "--data", str(data), "--format", fmt, "--steps", str(steps),
                "--result", str(result_path), *(extra or [])]
        cmd = torchrun_command(args, nproc, nnodes, node_rank, master_addr, master_port)
        # OpenMP threads that spin while waiting make a shared core many times slower
        defaults = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // nproc)), "OMP_WAIT_POLICY": "PASSIVE"}
        full_env = {**defaults, **os.environ, **(env or {})}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise LaunchError(f"the workers did not finish within {timeout_s:.0f} s") from None
        if proc.returncode != 0:
            # Keep the workers' whole output: the one-line error names where to read it.
            log = Path(tempfile.gettempdir()) / f"picasso-run-{os.getpid()}.log"
            log.write_text(proc.stdout + "\n" + proc.stderr)
            raise LaunchError(f"{first_error(proc.stdout + chr(10) + proc.stderr)} (full worker log: {log})")
        if node_rank != 0:
            return {"node_rank": node_rank}
        if not result_path.exists():
            raise LaunchError("the workers exited without a result: " + first_error(proc.stdout + proc.stderr))
        return json.loads(result_path.read_text())
