"""One connection to the ingest server: who the client is, and what the server keeps about it.

Who: the kernel's credentials of the peer (``SO_PEERCRED``: a pid and uid the client cannot
choose) and the pid its hello states, which differs for a server in another PID namespace
(``ns_pids`` reads the chain from ``/proc``). What: the connection's buffer, its times, the
names it holds and its write budget (:class:`Conn`), read by the server's loop and by the
record admission (``admission.py``). Kept apart from the loop so that both read one definition.
"""

from __future__ import annotations

import logging
import socket
import struct
from dataclasses import dataclass, field

from vramscope.agent.ingest import protocol as proto
from vramscope.agent.ingest.budget import Bucket
from vramscope.agent.ingest.names import ClientNames
from vramscope.agent.ingest.rate_log import RateLimitedLog

log = logging.getLogger("vramscope.ingest")
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass
class ClientInfo:
    """What the agent knows about one connection (from SO_PEERCRED and the hello).

    ``pid`` is the kernel's (``SO_PEERCRED``: the client's pid in the agent's PID namespace,
    the one NVML's process rows and ``/proc`` use), not the one the client states: a server in
    a container calls itself by its namespace's pid (often 1). The hello's pid is kept as
    ``ns_pid`` when it differs, and the client's records are moved onto ``pid``. Without a
    kernel pid (not Linux, or a peer outside the agent's namespace: 0) the hello's is used.
    """

    peer_pid: int | None
    peer_uid: int | None
    hello: proto.Hello | None = None

    @property
    def pid(self) -> int | None:
        if self.peer_pid:  # 0: the peer lives in a PID namespace the agent cannot see
            return self.peer_pid
        return self.hello.pid if self.hello is not None else None

    @property
    def ns_pid(self) -> int | None:
        """The pid the client calls itself, when it is not ``pid`` (another PID namespace)."""
        stated = self.hello.pid if self.hello is not None else None
        return stated if stated is not None and stated != self.pid else None


def ns_pids(pid: int, proc: str = "/proc") -> tuple[int, ...]:
    """``pid`` in each PID namespace it belongs to, outermost (``proc``'s) first: the NSpid line
    of ``/proc/<pid>/status`` (Linux >= 4.1). Empty when unknown."""
    try:
        with open(f"{proc}/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return tuple(int(x) for x in line.split()[1:])
    except (OSError, ValueError):
        pass
    return ()


@dataclass
class Conn:
    sock: socket.socket
    info: ClientInfo
    opened_s: float = 0.0  # monotonic
    last_frame_s: float = 0.0  # monotonic: the last complete frame (or the connect)
    buf: bytearray = field(default_factory=bytearray)
    bad_in_a_row: int = 0
    names: ClientNames = field(default_factory=ClientNames)  # the names it holds
    admitted_s: float | None = None  # monotonic: its hello was welcomed
    useful_s: float | None = None  # monotonic: it last had a record (or post-mortem) kept,
    # or sent a heartbeat after a silence (protocol.HEARTBEAT_MIN_GAP_S)
    last_message_s: float = 0.0  # monotonic: its last message was handled (or the connect)
    bucket: Bucket | None = None  # its write budget (its process's), from its first records


def peer_uid(conn: Conn) -> int | None:
    return conn.info.peer_uid


_log_pid_mismatch = RateLimitedLog(log, logging.WARNING)


def check_ns_pid(info: ClientInfo) -> None:
    """A hello pid that is none of the peer's pids (NSpid) is a client naming another process:
    its records still go to the kernel's pid; say so once per connection."""
    stated = info.ns_pid
    if stated is None or info.peer_pid is None:
        return
    chain = ns_pids(info.peer_pid)
    if chain and stated not in chain:  # rate-limited: a client reconnecting in a loop
        _log_pid_mismatch("client pid %s calls itself pid %s, which is none of its pids %s "
                          "(NSpid); its records are stored under pid %s", info.peer_pid, stated,
                          chain, info.peer_pid)


def peercred(sock: socket.socket) -> tuple[int | None, int | None]:
    try:
        pid, uid, _gid = _PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    except (OSError, AttributeError):  # not Linux: no SO_PEERCRED, no uid check possible
        return None, None
    return pid, uid
