"""Start the workers of a plan (executor.process.agent on each node) and collect rank 0's result."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

from executor.process.agent import agent_command, agent_ended, first_error
from executor.process.process_tree import ChildFrozen, run_tree
from executor.process.threads import rank_env
from executor.run.config import RunConfig
from executor.run.result import RunResult
from foundation.files import regular_file
from foundation.progress import PROGRESS_FILE_ENV, RankProgressWatcher, drawing

__all__ = ["LaunchError", "first_error", "launch"]


class LaunchError(RuntimeError):
    """A worker failed; the message is the first worker error (one line)."""


def launch(config: RunConfig, timeout_s: float | None = None, env: dict[str, str] | None = None,
           progress: str | None = "run steps") -> RunResult | None:
    """Run the plan on `config.nproc` local workers; returns rank 0's result (None on another node).
    `progress`: the label of the bar of rank 0's steps (foundation.progress: drawn only on a
    terminal; None: no bar, for a caller drawing its own).

    The config (checked when it was built) reaches every rank as one JSON file. The workers'
    output goes to a log in a private temp folder (mode 0700), kept and named in the error when
    they fail, removed otherwise. An interrupt or timeout stops every process the run started
    (executor.process.process_tree).
    """
    from planner.plan import Plan

    plan_path, data = config.plan, config.data
    plan = Plan.load(plan_path)
    plan.load_hot_ids(plan_path)  # a missing or wrong hot-ID file fails here, before any worker starts
    if data != "synthetic":
        if glob.has_magic(data):
            if not glob.glob(data):
                raise FileNotFoundError(f"{data}: no file matches this pattern")
        elif not Path(data).is_dir():  # a converted dataset is a folder (traces.dataset checks it)
            regular_file(data, "data file")  # one line for a missing file, a FIFO or a device
    nnodes = config.nnodes
    nproc = config.nproc or max(1, plan.world_size // nnodes)
    if nproc * nnodes != plan.world_size:
        raise ValueError(
            f"{plan_path}: the plan is for {plan.world_size} ranks, --nproc {nproc} x {nnodes} node(s) gives {nproc * nnodes}"
        )
    tmp = Path(tempfile.mkdtemp(prefix="picasso-run-"))
    keep_log = False
    try:
        result_path = tmp / "result.json"
        log = tmp / "workers.log"
        config_path = tmp / "config.json"
        replace(config, result=str(result_path)).save(config_path)
        cmd = agent_command([str(config_path)], nproc, nnodes, config.node_rank, config.master_addr,
                            config.master_port)
        defaults = rank_env(nproc)  # executor.process.threads: the policy; the agent sets the socket interface
        inherited = {k: v for k, v in os.environ.items() if k != PROGRESS_FILE_ENV}  # another launcher's
        full_env = {**defaults, **inherited, **(env or {})}
        watcher = RankProgressWatcher(str(tmp / "progress.json"), progress) if progress and drawing() else None
        if watcher is not None:
            full_env[PROGRESS_FILE_ENV] = watcher.path
        try:
            # the launcher is held to the ranks' own watch: stopped for their --timeout, the run ends
            rc, output, _ = run_tree(cmd, env=full_env, timeout_s=timeout_s, log_path=log,
                                     frozen_after_s=config.timeout,
                                     on_poll=watcher.poll if watcher is not None else None)
        except subprocess.TimeoutExpired:
            raise LaunchError(f"the workers did not finish within {timeout_s:.0f} s") from None
        except ChildFrozen as exc:
            raise LaunchError(f"the rank launcher (python -m executor.process.agent) stayed stopped (SIGSTOP or a "
                              f"debugger) for more than {exc.after_s:g} s, the ranks' --timeout; stopped the run "
                              "and its ranks") from None
        finally:
            if watcher is not None:
                watcher.close()
        if rc != 0:
            keep_log = True  # the one-line error names where to read the whole output
            raise LaunchError(f"{agent_ended(rc) or first_error(output)} (full worker log: {log})")
        if config.node_rank != 0:
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
