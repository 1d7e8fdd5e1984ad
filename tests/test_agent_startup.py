"""The agent starts its ranks before it loads torch (executor.process.agent, executor.process.rendezvous): the
ranks import torch meanwhile, and the store serves on the socket bound before they started."""

import subprocess
import sys


def test_the_agent_reaches_its_ranks_without_importing_torch():
    code = ("import sys, executor.process.agent; "
            "sys.exit(1 if any(m == 'torch' or m.startswith('torch.') for m in sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_a_store_hosted_on_a_socket_bound_earlier_serves_clients_that_came_first():
    code = """
import datetime, threading
from executor.process.rendezvous import free_port, host_store, listen_socket
import torch.distributed as dist
port = free_port()
sock = listen_socket("127.0.0.1", port)
got = {}
def client():  # connects while nothing serves yet: waits in the backlog
    c = dist.TCPStore("127.0.0.1", port, 2, False, datetime.timedelta(seconds=30))
    c.set("k", "v")
    got["ok"] = c.get("k") == b"v"
t = threading.Thread(target=client); t.start()
import time; time.sleep(0.5)
store = host_store("127.0.0.1", port, 2, 30.0, sock=sock)
t.join(30)
assert got.get("ok") and store.get("k") == b"v"
"""
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
