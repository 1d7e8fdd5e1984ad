"""Start the workers of a plan (executor.process.agent on each node) and collect rank 0's result."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from executor.process.agent import agent_command, agent_ended, first_error
from executor.process.process_tree import run_tree
from executor.process.threads import rank_env
from executor.run.result import RunResult
from foundation.files import regular_file

__all__ = ["LaunchError", "check_topology", "first_error", "launch"]


class LaunchError(RuntimeError):
    """A worker failed; the message is the first worker error (one line)."""


MAX_PORT = 65535


def check_topology(nproc: int | None, nnodes: int, node_rank: int, steps: int, master_port: int | None = None) -> None:
    """Refuse counts that would make the rendezvous wait forever or fail deep inside (a port no socket
    can have failed only after the workers started)."""
    if master_port is not None and not 1 <= master_port <= MAX_PORT:
        raise ValueError(f"--master-port must be a TCP port in [1, {MAX_PORT}], got {master_port} "
                         "(leave it out for a free one)")
    if nnodes < 1:
        raise ValueError(f"--nnodes must be at least 1, got {nnodes}")
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"--node-rank must be in [0, {nnodes - 1}] for --nnodes {nnodes}, got {node_rank}")
    if nproc is not None and nproc < 1:
        raise ValueError(f"--nproc must be at least 1, got {nproc}")
    if steps < 1:
        raise ValueError(f"--steps must be at least 1, got {steps}")


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
    every process the run started (executor.process.process_tree).
    """
    from planner.plan import Plan

    check_topology(nproc, nnodes, node_rank, steps, master_port)
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
        cmd = agent_command(args, nproc, nnodes, node_rank, master_addr, master_port)
        defaults = rank_env(nproc)  # executor.process.threads: the policy; the agent sets the socket interface
        full_env = {**defaults, **os.environ, **(env or {})}
        try:
            rc, output, _ = run_tree(cmd, env=full_env, timeout_s=timeout_s, log_path=log)
        except subprocess.TimeoutExpired:
            raise LaunchError(f"the workers did not finish within {timeout_s:.0f} s") from None
        if rc != 0:
            keep_log = True  # the one-line error names where to read the whole output
            raise LaunchError(f"{agent_ended(rc) or first_error(output)} (full worker log: {log})")
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
