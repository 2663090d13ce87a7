"""Which process on this host listens on a TCP port: the pid behind a scrape target.

The kernel lists listening sockets in ``/proc/net/tcp{,6}`` (state ``0A``, with their inode) and
each process's sockets in ``/proc/<pid>/fd``. Linux only; for a target elsewhere, a process the
agent may not inspect or one in another network namespace, the answer is ``None`` and the records
stay without a pid. Nothing here raises.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's ``st`` column
PROC = "/proc"


def is_local_host(host: str) -> bool:
    """Whether ``host`` (a URL's host part, without port) names this machine: a loopback
    address, ``localhost``, or this host's own name."""
    name = host.strip("[]").lower()
    if name in ("localhost", socket.gethostname().lower()):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def listening_inodes(port: int, tables: Iterable[str] = ("net/tcp", "net/tcp6"),
                     proc: str = PROC) -> set[str]:
    """Socket inodes listening on ``port`` (any local address), from the kernel's tables."""
    out: set[str] = set()
    for table in tables:
        try:
            with open(os.path.join(proc, table), encoding="ascii") as f:
                next(f, None)  # the header
                for line in f:
                    parts = line.split()
                    if len(parts) < 10 or parts[3] != LISTEN:
                        continue
                    local = parts[1]
                    if int(local.rsplit(":", 1)[1], 16) == port:
                        out.add(parts[9])
        except (OSError, ValueError, IndexError):
            continue
    out.discard("0")
    return out


def pid_listening(port: int, proc: str = PROC) -> int | None:
    """The pid of a process holding a socket that listens on ``port``, or ``None`` (see the
    module docstring). Several (a pre-forked server): the lowest pid, the parent as a rule."""
    inodes = listening_inodes(port, proc=proc)
    if not inodes:
        return None
    links = {f"socket:[{i}]" for i in inodes}
    found: list[int] = []
    try:
        entries = os.listdir(proc)
    except OSError:
        return None
    for entry in entries:
        if not entry.isdigit():
            continue
        fd_dir = os.path.join(proc, entry, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_dir, fd)) in links:
                    found.append(int(entry))
                    break
            except OSError:
                continue
    return min(found, default=None)
