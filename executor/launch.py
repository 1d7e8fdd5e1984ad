"""Start the workers of a plan through torchrun and collect rank 0's result."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from executor.process_tree import run_tree
from executor.result import RunResult
from executor.spawn import free_port
from executor.threads import rank_env
from foundation.files import regular_file


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
    # torchrun lists every failed rank; its "root cause" is only the first it noticed, often a
    # healthy rank whose collective broke (exit 1, our error path) when a peer died, or one it
    # stopped itself (SIGTERM, -15). A rank that exited otherwise (os._exit, a crash, another
    # signal) is the one that died.
    failed = re.findall(r"rank\s*:\s*(\d+)\s*\(local_rank.*?exitcode\s*:\s*(-?\d+)", log, re.S)
    died = [(r, c) for r, c in failed if c not in ("1", "-15")]
    root = log.split("Root Cause", 1)[1] if "Root Cause" in log else ""
    m = re.search(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", root, re.S)
    if died or m:  # a rank that died gives no line of its own; torchrun names it
        r, c = died[0] if died else m.groups()
        return f"worker rank {r} died (exit code {c}); the other ranks stopped"
    if mine:
        return re.sub(r"^executor (rank \d+): error: ", r"\1: ", mine[0])
    tail = [ln for ln in lines if ln.strip()]
    return tail[-1] if tail else "the workers failed without output"


def check_topology(nproc: int | None, nnodes: int, node_rank: int, steps: int) -> None:
    """Refuse counts that would make torchrun wait forever or fail deep inside."""
    if nnodes < 1:
        raise ValueError(f"--nnodes must be at least 1, got {nnodes}")
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"--node-rank must be in [0, {nnodes - 1}] for --nnodes {nnodes}, got {node_rank}")
    if nproc is not None and nproc < 1:
        raise ValueError(f"--nproc must be at least 1, got {nproc}")
    if steps < 1:
        raise ValueError(f"--steps must be at least 1, got {steps}")


def socket_env(master_addr: str, nnodes: int) -> dict[str, str]:
    """Keep one-node runs on the loopback interface (gloo and NCCL bind where told)."""
    if nnodes == 1 and master_addr in ("127.0.0.1", "localhost", "::1"):
        return {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    return {}


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
) -> RunResult | None:
    """Run the plan on `nproc` local workers; returns rank 0's result (None on another node).

    The workers' output goes to a log in a private temp folder (mode 0700), kept and
    named in the error when they fail, removed otherwise. An interrupt or timeout stops
    every process the run started (executor.process_tree).
    """
    from planner.plan import Plan

    check_topology(nproc, nnodes, node_rank, steps)
    plan = Plan.load(plan_path)
    plan.load_hot_ids(plan_path)  # a missing or wrong hot-ID file fails here, before any worker starts
    if data != "synthetic":
        if glob.has_magic(data):
            if not glob.glob(data):
                raise FileNotFoundError(f"{data}: no file matches this pattern")
        elif not Path(data).is_dir():  # a converted dataset is a folder (traces.dataset checks it)
            regular_file(data, "data file")  # one line for a missing file, a FIFO or a device
    nproc = nproc or max(1, plan.world_size // nnodes)
    if nproc * nnodes != plan.world_size:
        raise ValueError(
            f"{plan_path}: the plan is for {plan.world_size} ranks, --nproc {nproc} x {nnodes} node(s) gives {nproc * nnodes}"
        )
    tmp = Path(tempfile.mkdtemp(prefix="picasso-run-"))
    keep_log = False
    try:
        result_path = tmp / "result.json"
        log = tmp / "workers.log"
        args = ["--plan", str(plan_path), "--data", str(data), "--format", fmt, "--steps", str(steps),
                "--result", str(result_path), *(extra or [])]
        cmd = torchrun_command(args, nproc, nnodes, node_rank, master_addr, master_port)
        defaults = {**rank_env(nproc), **socket_env(master_addr, nnodes)}  # executor.threads: the policy
        full_env = {**defaults, **os.environ, **(env or {})}
        try:
            rc, output, _ = run_tree(cmd, env=full_env, timeout_s=timeout_s, log_path=log)
        except subprocess.TimeoutExpired:
            raise LaunchError(f"the workers did not finish within {timeout_s:.0f} s") from None
        if rc != 0:
            keep_log = True  # the one-line error names where to read the whole output
            raise LaunchError(f"{first_error(output)} (full worker log: {log})")
        if node_rank != 0:
            return None
        if not result_path.exists():
            keep_log = True
            raise LaunchError(f"the workers exited without a result: {first_error(output)} (full worker log: {log})")
        return RunResult.from_json(result_path.read_text())
    finally:
        if keep_log:
            for f in tmp.iterdir():
                if f != log:
                    f.unlink(missing_ok=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
