"""Run a child command so that it and everything it starts stops with us.

The child gets its own session (process group), so a Ctrl-C at the terminal reaches
only picasso, which then stops the whole tree itself: SIGTERM to the group and to every
descendant (torchrun's workers may sit in other groups), a grace period, then SIGKILL.
The same happens on a timeout or any exception while waiting (SIGTERM and SIGHUP reach
us as exceptions, see picasso.cli), and when the child itself stays stopped (SIGSTOP, a
debugger) longer than the caller allows: its children cannot tell a stopped parent from a
busy one, so the watch on it is ours. Output goes to files, not pipes: a chatty child can
never block on a full pipe while we wait.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

GRACE_S = 5.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h
STOPPED_STATES = ("T", "t")  # /proc/PID/stat: stopped by a signal, or by a tracer


class ChildFrozen(RuntimeError):
    """The child stayed stopped longer than allowed; the tree was stopped."""

    def __init__(self, pid: int, after_s: float) -> None:
        super().__init__(f"process {pid} stayed stopped (SIGSTOP or a debugger) for more than {after_s:g} s")
        self.pid, self.after_s = pid, after_s


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send `sig` to this process when its parent ends (Linux prctl
    PR_SET_PDEATHSIG; a no-op elsewhere). The tree's stop runs in the parent: a parent killed
    outright (SIGKILL, the OOM killer) cannot run it, and its agent and ranks would train on
    with nobody to stop them. The agent calls it once its own stop handler is in place, the
    ranks at start."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent ended before the request took effect
        os.kill(os.getpid(), sig)


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the name: [state, ppid, ...]; None when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # the name may hold spaces
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> dict[int, str]:
    """Every live process below `pid`, with its start time (Linux /proc; empty elsewhere).

    The start time tells a process from a later one that got its PID back.
    """
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        st = _stat(int(entry)) if entry.isdigit() else None
        if st is not None and len(st) > 19:
            children.setdefault(int(st[1]), []).append((int(entry), st[19]))
    out: dict[int, str] = {}
    todo = [pid]
    while todo:
        for c, start in children.get(todo.pop(), []):
            if c not in out:
                out[c] = start
                todo.append(c)
    return out


def running(procs: dict[int, str]) -> dict[int, str]:
    """The processes of `procs` still running (the same process: same start time; not a zombie)."""
    out = {}
    for pid, start in procs.items():
        st = _stat(pid)
        if st is not None and len(st) > 19 and st[19] == start and st[0] not in ("Z", "X"):
            out[pid] = start
    return out


def _signal_all(pids, pgid: int | None, sig: int) -> None:
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)


def stop_tree(proc: subprocess.Popen, grace_s: float = GRACE_S, seen: dict[int, str] | None = None) -> None:
    """SIGTERM the child and all its descendants, wait `grace_s`, SIGKILL what is left."""
    with _signals_deferred():
        seen = {**(seen or {}), **descendants(proc.pid)}
        _signal_all(running(seen), proc.pid, signal.SIGTERM)
        _signal_all(running(seen), proc.pid, signal.SIGCONT)  # a stopped process takes its SIGTERM now
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if proc.poll() is None:
                seen.update(descendants(proc.pid))
            if proc.returncode is not None and not running(seen):
                break
            time.sleep(0.05)
        _signal_all(running(seen), proc.pid if proc.returncode is None else None, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
        deadline = time.monotonic() + grace_s  # a SIGKILLed process is gone within moments: its caller
        while running(seen) and time.monotonic() < deadline:  # says "stopped" only after that
            time.sleep(0.02)


def _stop_new_sessions(grace_s: float) -> None:
    """Stop the children of this process that lead sessions of their own (what run_tree's
    Popen makes), with their groups: a stop signal that lands while Popen is still starting
    one leaves it without a handle to stop it by."""
    me = os.getpid()
    kids = {pid: start for pid, start in descendants(me).items()
            if (st := _stat(pid)) is not None and len(st) > 3 and st[1] == str(me) and st[3] == str(pid)}
    with _signals_deferred():
        for pid in kids:
            _signal_all([pid], pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while running(kids) and time.monotonic() < deadline:
            for pid in kids:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            time.sleep(0.05)
        for pid in running(kids):
            _signal_all([pid], pid, signal.SIGKILL)
        for pid in kids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


@contextlib.contextmanager
def _signals_deferred():
    """Hold SIGINT/SIGTERM/SIGHUP while the tree is being stopped (a second Ctrl-C must not cut it short)."""
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    except (AttributeError, ValueError, OSError):
        old = None
    try:
        yield
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def run_tree(cmd: list[str], env: dict[str, str] | None = None, timeout_s: float | None = None,
             log_path: str | os.PathLike | None = None, grace_s: float = GRACE_S,
             frozen_after_s: float | None = None,
             on_poll: Callable[[], None] | None = None) -> tuple[int, str, str]:
    """Run `cmd` in its own process group; returns (exit code, stdout, stderr). `on_poll` is
    called every quarter second while it runs (a progress bar's redraw).

    With `log_path` both streams go to that file and come back as stdout. On a timeout
    the tree is stopped and subprocess.TimeoutExpired raised; when the child stays stopped
    longer than `frozen_after_s`, the tree is stopped and ChildFrozen raised; on any exception
    (KeyboardInterrupt included) the tree is stopped and the exception re-raised.
    """
    with contextlib.ExitStack() as stack:
        if log_path is not None:
            out = stack.enter_context(open(log_path, "w+b"))
            err = out
        else:
            out = stack.enter_context(tempfile.TemporaryFile())
            err = stack.enter_context(tempfile.TemporaryFile())
        seen: dict[int, str] = {}
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        proc = None
        try:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    start_new_session=True)
            stopped_at = None
            while proc.poll() is None:
                seen.update(descendants(proc.pid))  # orphans are re-parented away: remember them now
                if deadline is not None and time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(cmd, timeout_s)
                if frozen_after_s is not None:
                    st = _stat(proc.pid)
                    stopped = st is not None and st[0] in STOPPED_STATES
                    stopped_at = (stopped_at or time.monotonic()) if stopped else None
                    if stopped_at is not None and time.monotonic() - stopped_at > frozen_after_s:
                        raise ChildFrozen(proc.pid, frozen_after_s)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.25)
                if on_poll is not None:
                    on_poll()
        except BaseException:
            if proc is not None:
                stop_tree(proc, grace_s, seen)
            else:  # interrupted inside Popen, after the child was made: it has no handle yet
                _stop_new_sessions(grace_s)
            raise
        # the child is gone; whatever it left running (in any group) goes too
        _signal_all(running(seen), None, signal.SIGKILL)
        texts = []
        for f in (out, err) if err is not out else (out,):
            f.seek(0)
            texts.append(f.read().decode("utf-8", "replace"))
        return proc.returncode, texts[0], texts[1] if len(texts) > 1 else ""
