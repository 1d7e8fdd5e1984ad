"""Every socket a `picasso run` listens on is bound to --master-addr (loopback for one node)."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from executor.process.process_tree import descendants
from tests.run_tree import ROOT, cmdline, small_plan

LISTEN = "0A"  # TCP state in /proc/net/tcp


def _decode(hex_addr: str) -> str:
    """An address of /proc/net/tcp{,6}: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_addr)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def listening(pids) -> dict[int, list[tuple[str, int]]]:
    """pid -> [(address, port)] of the TCP sockets in LISTEN state that the process holds."""
    out: dict[int, list[tuple[str, int]]] = {}
    for pid in pids:
        inodes = set()
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone meanwhile
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:  # closed meanwhile (the listing's own descriptor, for one)
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        for table in ("tcp", "tcp6"):
            try:
                rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                f = row.split()
                if f[3] == LISTEN and f[9] in inodes:
                    addr, port = f[1].split(":")
                    out.setdefault(pid, []).append((_decode(addr), int(port, 16)))
    return out


def test_listening_reads_a_socket_of_this_process():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert ("127.0.0.1", s.getsockname()[1]) in listening([os.getpid()])[os.getpid()]


@pytest.mark.dist
def test_a_one_node_run_listens_only_on_loopback(tmp_path):
    small_plan(tmp_path / "plan.json", bottom=16)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GLOO_SOCKET_IFNAME", None)
    cmd = [sys.executable, "-m", "picasso", "run", str(tmp_path / "plan.json"), "--data", "synthetic",
           "--steps", "1000000", "--timeout", "60"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            tree = [proc.pid, *descendants(proc.pid)]
            ranks = [p for p in tree if "-m executor " in cmdline(p)]
            if len(ranks) == 2 and all(listening([r]) for r in ranks):  # both ranks joined gloo
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        else:
            pytest.fail("the workers did not start")
        time.sleep(1.0)  # let them train
        found = listening([proc.pid, *descendants(proc.pid)])
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    sockets = [(pid, a) for pid, addrs in found.items() for a in addrs]
    assert len(sockets) >= 3, sockets  # the rendezvous store and each rank's gloo listener
    wide = [(cmdline(pid)[:80], a) for pid, a in sockets if not ipaddress.ip_address(a[0]).is_loopback]
    assert not wide, f"listening beyond loopback: {wide}"
