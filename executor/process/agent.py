"""`python -m executor.process.agent`: start this node's worker ranks, watch them, stop them together.

The one launcher of ranks: `picasso run` starts its worker ranks through this command, and
executor.process.spawn.run_ranks (tests, benchmarks, calibration) starts function ranks with the
same `start_ranks` and `wait_ranks`.

It replaces torchrun for `picasso run` so that the run listens only on --master-addr
(executor.process.rendezvous: node 0's agent hosts the store there). Each worker gets RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT and the socket interface.
The workers share the agent's process group (executor.process.process_tree stops the whole
group). When one rank fails the agent stops the others (SIGTERM, a grace period,
SIGKILL) and writes one line per rank that did not finish, which `first_error` reads
to blame the right rank: one that failed on its own, else one that died (a crash, a
signal, os._exit), else one still running while its peers' collectives timed out.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from executor.process.lines import say
from executor.process.process_tree import die_with_parent
from executor.process.rendezvous import HOSTED, free_port, host_store, listen_socket, socket_env

GRACE_S = 5.0
STORE_TIMEOUT_S = 300.0  # the host's own waits; each worker joins with its --timeout
PREFIX = "picasso agent"
REPORT_START = re.compile(rf"(?=executor rank \d+: error: |{PREFIX}: )")
COLLECTIVE = "another rank probably died or hung"  # executor.run.worker's line for a broken collective


def agent_command(worker_args: list[str], nproc: int, nnodes: int = 1, node_rank: int = 0,
                  master_addr: str = "127.0.0.1", master_port: int | None = None) -> list[str]:
    """The command line that runs this node's `nproc` ranks of `python -m executor worker_args`."""
    return [sys.executable, "-m", "executor.process.agent", "--nproc", str(nproc), "--nnodes", str(nnodes),
            "--node-rank", str(node_rank), "--master-addr", master_addr,
            "--master-port", str(master_port or free_port(master_addr)), "--", *worker_args]


def worker_env(base: dict[str, str], rank: int, local_rank: int, nproc: int, world: int, master_addr: str,
               master_port: int) -> dict[str, str]:
    return {**socket_env(master_addr), **base, HOSTED: "1", "RANK": str(rank), "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port)}


class _Stop(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stop(signum, _frame):
    raise _Stop(signum)


def stop_ranks(procs: dict[int, subprocess.Popen], grace_s: float) -> list[int]:
    """SIGTERM (and SIGCONT) the ranks still running, SIGKILL them after `grace_s`; returns the ranks stopped."""
    alive = [r for r, p in procs.items() if p.poll() is None]
    for r in alive:
        procs[r].terminate()
        with contextlib.suppress(ProcessLookupError):  # a stopped (SIGSTOP) rank takes its SIGTERM now
            os.kill(procs[r].pid, signal.SIGCONT)
    deadline = time.monotonic() + grace_s
    while any(procs[r].poll() is None for r in alive) and time.monotonic() < deadline:
        time.sleep(0.05)
    for r in alive:
        if procs[r].poll() is None:
            procs[r].kill()
            procs[r].wait()
    return alive


@dataclass
class Outcome:
    """How a set of ranks ended: the codes of those that failed, those stopped after it."""

    failed: dict[int, int] = field(default_factory=dict)
    stopped: list[int] = field(default_factory=list)
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return not self.failed and not self.stopped and not self.timed_out


def wait_ranks(procs: dict[int, subprocess.Popen], poll_s: float = 0.1, grace_s: float = GRACE_S,
               deadline_s: float | None = None) -> Outcome:
    """Wait for every rank; on the first failure (or past `deadline_s`) stop the rest."""
    end = None if deadline_s is None else time.monotonic() + deadline_s
    while True:
        codes = {r: p.poll() for r, p in procs.items()}
        if any(c not in (None, 0) for c in codes.values()):
            break
        if all(c == 0 for c in codes.values()):
            return Outcome()
        if end is not None and time.monotonic() > end:
            return Outcome(stopped=stop_ranks(procs, grace_s), timed_out=True)
        time.sleep(poll_s)
    time.sleep(min(grace_s, 0.5))  # peers of a dead rank fail on their own within moments: let them say so
    failed = {r: p.poll() for r, p in procs.items() if p.poll() not in (None, 0)}
    return Outcome(failed=failed, stopped=stop_ranks(procs, grace_s))


def supervise(procs: dict[int, subprocess.Popen], poll_s: float = 0.1, grace_s: float = GRACE_S) -> int:
    """Wait for every rank; on the first failure stop the rest, saying which rank did what
    (the lines `first_error` reads). Returns the agent's exit code."""
    out = wait_ranks(procs, poll_s, grace_s)
    if out.ok:
        return 0
    for r, c in sorted(out.failed.items()):
        say(f"{PREFIX}: rank {r} exited with code {c}")
    for r in out.stopped:
        say(f"{PREFIX}: rank {r} was still running after rank {min(out.failed)} failed; stopped")
    return 1


def start_ranks(argv: list[str], nproc: int, nnodes: int, node_rank: int, master_addr: str, master_port: int,
                base_env: dict[str, str]) -> dict[int, subprocess.Popen]:
    """This node's `nproc` ranks of `python -u -m <argv>`, each told its rank and the store's
    address (executor.process.rendezvous.join_store). Started in the caller's process group, so that
    executor.process.process_tree stops them with it."""
    world = nproc * nnodes
    procs: dict[int, subprocess.Popen] = {}
    try:
        for local in range(nproc):
            rank = node_rank * nproc + local
            env = worker_env(base_env, rank, local, nproc, world, master_addr, master_port)
            procs[rank] = subprocess.Popen([sys.executable, "-u", "-m", *argv], env=env, stdin=subprocess.DEVNULL)
    except BaseException:
        stop_ranks(procs, 0.0)
        raise
    return procs


def agent_ended(rc: int) -> str | None:
    """The line for an agent that did not end on its own (a signal killed or stopped it), else None:
    then the workers' lines are consequences, not the cause."""
    signum = -rc if rc < 0 else rc - 128 if rc > 128 else 0
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return None
    why = " (the kernel's out-of-memory killer, or a kill from outside?)" if signum == signal.SIGKILL else ""
    return (f"the rank launcher (python -m executor.process.agent) was killed by {name} before the run ended, "
            f"and its ranks with it{why}")


def first_error(log: str) -> str:
    """The clearest single line out of the workers' and the agent's output."""
    # a line another process wrote in pieces (C++ logging, a print under -u) may have a report glued
    # into it: each report starts a line of its own
    lines = [piece for ln in log.splitlines() for piece in REPORT_START.split(ln)]
    log = "\n".join(lines)
    agent = [ln.split(": error: ", 1)[1] for ln in lines if ln.startswith(f"{PREFIX}: error: ")]
    if agent:  # the agent could not start the ranks
        return agent[0]
    mine = [ln for ln in lines if re.match(r"executor rank \d+: error:", ln)]
    direct = [m for m in mine if COLLECTIVE not in m]
    if direct:  # a rank that failed on its own says why
        return re.sub(r"^executor (rank \d+): error: ", r"\1: ", direct[0])
    exits = re.findall(rf"^{PREFIX}: rank (\d+) exited with code (-?\d+)$", log, re.M)
    died = [(r, c) for r, c in exits if c != "1"]  # 1 is a worker's own error path
    if died:  # a rank that died gives no line of its own
        r, c = died[0]
        return f"worker rank {r} died (exit code {c}); the other ranks stopped"
    hung = re.findall(rf"^{PREFIX}: rank (\d+) was still running after", log, re.M)
    if hung and mine:  # every rank that ended reported a broken collective: the one still running hung
        return f"worker rank {hung[0]} hung (still running when the other ranks' collectives timed out); stopped"
    if mine:
        return re.sub(r"^executor (rank \d+): error: ", r"\1: ", mine[0])
    tail = [ln for ln in lines if ln.strip()]
    return tail[-1] if tail else "no worker printed an error"  # not "failed": they may all have exited 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m executor.process.agent", description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, required=True)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, required=True)
    p.add_argument("worker_args", nargs=argparse.REMAINDER)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    worker_args = args.worker_args[1:] if args.worker_args[:1] == ["--"] else args.worker_args
    world = args.nproc * args.nnodes
    procs: dict[int, subprocess.Popen] = {}
    old = {s: signal.signal(s, _raise_stop) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    die_with_parent()  # `picasso run` killed outright: stop the ranks all the same
    try:
        store = None  # kept referenced: the store serves until the agent ends
        # node 0 binds the store's address first, starts its ranks, and only then loads torch
        # to serve the store there: the ranks import torch meanwhile, and a rank that connects
        # before the store serves waits in the socket's backlog
        sock = listen_socket(args.master_addr, args.master_port) if args.node_rank == 0 else None
        procs.update(start_ranks(["executor", *worker_args], args.nproc, args.nnodes, args.node_rank,
                                 args.master_addr, args.master_port, dict(os.environ)))
        if sock is not None:
            store = host_store(args.master_addr, args.master_port, world, STORE_TIMEOUT_S, sock=sock)
        rc = supervise(procs)
        del store
        return rc
    except _Stop as exc:
        stop_ranks(procs, GRACE_S)
        return 128 + exc.signum
    except Exception as exc:  # noqa: BLE001 - one line; the ranks must not outlive the agent
        stop_ranks(procs, GRACE_S)
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        say(f"{PREFIX}: error: {msg}")
        return 1
    finally:
        for s, h in old.items():
            signal.signal(s, h)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # the ranks are gone and nothing is left to write: skip the interpreter's teardown of torch
    # (seconds on a busy machine), so the run ends when its ranks do
    os._exit(code)
