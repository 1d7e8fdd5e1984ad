"""The rendezvous store of a run, bound to --master-addr only, and the workers' way to join it.

torchrun's static rendezvous creates its TCPStore on `*:PORT`: every interface of the
machine, although one node needs loopback only. Here node 0's agent (executor.process.agent)
binds a socket to (master_addr, port) itself and hands it to the store
(`master_listen_fd`); the workers join as clients and pass the store to
init_process_group. Gloo and NCCL listen on the interface named by *_SOCKET_IFNAME,
set here from the address: `lo` for loopback, else the interface that reaches it.
"""

from __future__ import annotations

import array
import datetime
import fcntl
import ipaddress
import os
import socket
import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a store is made: the agent starts its ranks first
    import torch.distributed as dist

HOSTED = "PICASSO_RENDEZVOUS"  # set by the agent: join the store at MASTER_ADDR:MASTER_PORT as a client
SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def _resolve(addr: str, port: int) -> tuple[int, tuple]:
    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValueError(f"--master-addr {addr}: cannot resolve it ({exc.strerror})") from None
    family, _, _, _, sockaddr = infos[0]
    return family, sockaddr


def listen_socket(addr: str, port: int, backlog: int = 2048) -> socket.socket:
    """A TCP socket listening on (addr, port) only; one line naming the address when it cannot."""
    family, sockaddr = _resolve(addr, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        hint = "; it must be an address of node 0" if exc.errno == 99 else ""  # EADDRNOTAVAIL
        raise OSError(f"cannot listen on {addr}:{port} ({exc.strerror}){hint}") from None
    return sock


def free_port(addr: str = "127.0.0.1") -> int:
    """A port free on `addr` now (the store binds it moments later)."""
    with listen_socket(addr, 0) as s:
        return s.getsockname()[1]


def host_store(addr: str, port: int, world: int, timeout_s: float,
               sock: socket.socket | None = None) -> dist.TCPStore:
    """The run's store on node 0, listening on (addr, port) and nowhere else (on `sock` when
    given: a socket listen_socket bound there already, whose early clients wait in its backlog)."""
    import torch.distributed as dist

    sock = sock if sock is not None else listen_socket(addr, port)
    fd = sock.detach()  # the store owns the descriptor from here on
    try:
        return dist.TCPStore(addr, port, world, True, datetime.timedelta(seconds=timeout_s),
                             wait_for_workers=False, master_listen_fd=fd)
    except BaseException:
        os.close(fd)
        raise


def join_store(timeout_s: float) -> dist.TCPStore | None:
    """The agent's store as a client (None outside an agent: init_process_group's env:// then)."""
    if os.environ.get(HOSTED) != "1":
        return None
    import torch.distributed as dist

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         int(os.environ["WORLD_SIZE"]), False, datetime.timedelta(seconds=timeout_s))


def _interface_with(ip: str) -> str | None:
    """The name of the local interface that holds IPv4 address `ip` (Linux), else None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            req = array.array("B", struct.pack("256s", name.encode()[:15]))
            try:
                fcntl.ioctl(s.fileno(), SIOCGIFADDR, req)
            except OSError:  # no IPv4 address on it
                continue
            if socket.inet_ntoa(req.tobytes()[20:24]) == ip:
                return name
    return None


def socket_env(master_addr: str) -> dict[str, str]:
    """GLOO_/NCCL_SOCKET_IFNAME for workers that talk to `master_addr`: `lo` for loopback,
    else the interface this machine reaches the address through ({} when not found)."""
    _, sockaddr = _resolve(master_addr, 1)
    ip = ipaddress.ip_address(sockaddr[0])
    if ip.is_loopback:
        name = "lo"
    elif ip.version == 4:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect((str(ip), 1))  # no packet is sent: only the route is looked up
                local = s.getsockname()[0]
            except OSError:
                return {}
        name = _interface_with(local)
    else:
        name = None
    return {"GLOO_SOCKET_IFNAME": name, "NCCL_SOCKET_IFNAME": name} if name else {}


def init_loopback_group(rank: int, world: int, port: int, timeout_s: float = 60.0, backend: str = "gloo") -> None:
    """Join a one-machine process group whose store rank 0 hosts on 127.0.0.1:`port` only
    (init_method="tcp://..." would have rank 0 listen on every interface)."""
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        store = host_store("127.0.0.1", port, world, timeout_s)
    else:
        store = dist.TCPStore("127.0.0.1", port, world, False, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
