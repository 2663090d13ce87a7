"""The ingest server: a Unix stream socket the in-server hooks connect to (protocol v1).

One thread, one ``selectors`` loop, non-blocking sockets: a slow or hostile client can only
fill its own bounded receive buffer (one frame, at most ``agent.max_message_bytes``), never
stall the others. Every rejected message is counted by reason; a connection is dropped only
when the stream cannot be resynchronised (oversized length, wrong version, bad hello, EOF in
the middle of a frame) or after too many bad messages in a row.

Security: the socket lives in a directory of mode 0700 (created if missing; an existing one
with another mode is refused, never chmod-ed, so ``--socket /tmp/x.sock`` cannot open up
``/tmp``), the socket itself is 0600, and each peer's uid (``SO_PEERCRED``) must be the agent's
own or in ``agent.allowed_uids``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import socket
import stat
import struct
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from vramscope.agent.errors import VramscopeError
from vramscope.agent.ingest import protocol as proto
from vramscope.agent.records import PostMortem

log = logging.getLogger("vramscope.ingest")

MAX_CLIENTS = 1024
MAX_BAD_IN_A_ROW = 64  # a client sending this many rejected messages in a row is dropped
_RECV_BYTES = 256 * 1024
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass
class ClientInfo:
    """What the agent knows about one connection (from SO_PEERCRED and the hello)."""

    peer_pid: int | None
    peer_uid: int | None
    hello: proto.Hello | None = None

    @property
    def pid(self) -> int | None:
        if self.hello is not None and self.hello.pid is not None:
            return self.hello.pid
        return self.peer_pid


@dataclass
class IngestStats:
    connections_total: int = 0
    messages_total: int = 0
    records_total: int = 0
    client_dropped_total: int = 0  # drops the clients reported (their buffers were full)
    paused_ticks: int = 0  # 10 ms waits while the writer was behind (back-pressure)
    rejected: Counter = field(default_factory=Counter)  # reason -> count

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())


@dataclass
class _Conn:
    sock: socket.socket
    info: ClientInfo
    buf: bytearray = field(default_factory=bytearray)
    bad_in_a_row: int = 0


class IngestServer:
    """Accepts hook clients and hands their validated records to ``on_records``.

    Callbacks run on the server thread and must not block (they put into the writer queue).
    """

    def __init__(self, path: str, *, on_records: Callable[[list, ClientInfo], None],
                 on_postmortem: Callable[[PostMortem, ClientInfo], None] | None = None,
                 on_hello: Callable[[ClientInfo], None] | None = None,
                 status: Callable[[], dict[str, Any]] | None = None,
                 max_message_bytes: int = proto.DEFAULT_MAX_MESSAGE_BYTES,
                 allowed_uids: Iterable[int] = (),
                 pause: Callable[[], bool] | None = None) -> None:
        self.path = path
        self.stats = IngestStats()
        self._on_records = on_records
        self._on_postmortem = on_postmortem
        self._on_hello = on_hello
        self._status = status
        self._pause = pause  # True while the writer is behind: stop reading, clients wait
        self._max_bytes = max_message_bytes
        self._allowed_uids = {os.getuid(), *allowed_uids}
        self._sel = selectors.DefaultSelector()
        self._conns: dict[int, _Conn] = {}
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------
    def bind(self) -> None:
        """Create the private directory and the 0600 socket; refuse a live agent's socket."""
        prepare_socket_dir(os.path.dirname(os.path.abspath(self.path)))
        remove_stale_socket(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # the socket is born 0600: no window where others connect
        try:
            listener.bind(self.path)
        except OSError as exc:
            listener.close()
            raise VramscopeError(f"cannot listen on {self.path}: {exc.strerror}; choose "
                                 f"another path with --socket or agent.socket_path") from None
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        listener.listen(128)
        listener.setblocking(False)
        self._sel.register(listener, selectors.EVENT_READ, None)
        self._listener = listener

    def start(self) -> None:
        if self._listener is None:
            self.bind()
        self._thread = threading.Thread(target=self.serve_forever, name="vramscope-ingest",
                                        daemon=True)
        self._thread.start()

    def serve_forever(self) -> None:
        while not self._stop.is_set():
            self.run_once(1.0)  # data wakes it at once; the timeout only bounds stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._listener is not None:
            self.run_once(0)  # take in what clients already sent, for the final flush
        for conn in list(self._conns.values()):
            self._close(conn)
        if self._listener is not None:
            self._sel.unregister(self._listener)
            self._listener.close()
            self._listener = None
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        self._sel.close()

    @property
    def clients(self) -> list[ClientInfo]:
        return [c.info for c in self._conns.values() if c.info.hello is not None]

    # --- the loop -------------------------------------------------------------------------
    def run_once(self, timeout_s: float = 0.0) -> None:
        """Wait up to ``timeout_s`` for activity and handle everything that is ready.

        While ``pause()`` is true nothing is read: the kernel's socket buffers fill and the
        clients' sends wait (a blocking replay is slowed to the writer's pace; the in-server
        client drops and counts after its send timeout), instead of the agent reading records
        only to drop them from a full queue.
        """
        if self._pause is not None and self._pause():
            self.stats.paused_ticks += 1
            self._stop.wait(0.01)
            return
        for key, _ in self._sel.select(timeout_s):
            if key.data is None:
                self._accept()
            else:
                self._read(key.data)

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        sock.setblocking(False)
        pid, uid = _peercred(sock)
        self.stats.connections_total += 1
        conn = _Conn(sock, ClientInfo(pid, uid))
        if len(self._conns) >= MAX_CLIENTS:
            return self._refuse(conn, "clients", f"too many clients (limit {MAX_CLIENTS})")
        if uid not in self._allowed_uids:
            return self._refuse(conn, "uid", f"uid {uid} is not allowed to connect; add it to "
                                "agent.allowed_uids")
        self._conns[sock.fileno()] = conn
        self._sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(_RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            if conn.buf:
                self._reject(conn, "truncated", f"connection closed inside a message "
                             f"({len(conn.buf)} bytes pending)")
            return self._close(conn)
        conn.buf += data
        try:
            payloads = proto.split_frames(conn.buf, self._max_bytes)
        except proto.ProtocolError as exc:
            return self._refuse(conn, exc.reason, str(exc))
        for payload in payloads:
            if not self._handle(conn, payload):
                return

    def _handle(self, conn: _Conn, payload: bytes) -> bool:
        """Handle one payload; False when the connection was closed."""
        self.stats.messages_total += 1
        try:
            self._dispatch(conn, proto.decode(payload))
        except proto.ProtocolError as exc:
            return self._on_bad_message(conn, exc)
        except Exception as exc:  # noqa: BLE001 - a validator bug must not end ingest
            log.exception("unexpected error handling a message from pid %s", conn.info.pid)
            return self._on_bad_message(conn, proto.ProtocolError("internal", str(exc)))
        conn.bad_in_a_row = 0
        return conn.sock.fileno() >= 0

    def _on_bad_message(self, conn: _Conn, exc: proto.ProtocolError) -> bool:
        if exc.fatal:
            self._refuse(conn, exc.reason, str(exc))
            return False
        self._reject(conn, exc.reason, str(exc))
        conn.bad_in_a_row += 1
        if conn.bad_in_a_row >= MAX_BAD_IN_A_ROW:
            self._refuse(conn, "resync", f"{MAX_BAD_IN_A_ROW} bad messages in a row")
            return False
        return True

    def _dispatch(self, conn: _Conn, obj: dict[str, Any]) -> None:
        kind = obj["type"]
        if kind == "status":
            return self._send(conn, {"type": "status", **(self._status() if self._status else {})})
        if conn.info.hello is None and kind != "hello":
            raise proto.ProtocolError("order", f"expected a hello first, got {kind!r}",
                                      fatal=True)
        if kind == "hello":
            return self._on_hello_message(conn, obj)
        if kind == "records":
            return self._on_records_message(conn, obj)
        if kind == "postmortem":
            pm = proto.parse_postmortem(obj)
            if pm.pid is None:
                pm = pm._replace(pid=conn.info.pid)
            if self._on_postmortem is not None:
                self._on_postmortem(pm, conn.info)
            return None
        self.stats.client_dropped_total += proto.parse_dropped(obj)  # "dropped"
        return None

    def _on_hello_message(self, conn: _Conn, obj: dict[str, Any]) -> None:
        if conn.info.hello is not None:
            raise proto.ProtocolError("order", "a second hello on one connection")
        conn.info.hello = proto.parse_hello(obj)
        self._send(conn, {"type": "welcome", "protocol": proto.PROTOCOL_VERSION})
        if self._on_hello is not None:
            self._on_hello(conn.info)

    def _on_records_message(self, conn: _Conn, obj: dict[str, Any]) -> None:
        records = proto.parse_records(obj, default_pid=conn.info.pid)
        self.stats.records_total += len(records)
        self._on_records(records, conn.info)

    # --- replies and closing --------------------------------------------------------------
    def _send(self, conn: _Conn, obj: dict[str, Any]) -> None:
        """Replies are tiny; a client that cannot take one is not reading, so drop it."""
        data = proto.frame(obj)
        try:
            sent = conn.sock.send(data)
        except OSError:
            sent = -1
        if sent != len(data):
            self._close(conn)

    def _reject(self, conn: _Conn, reason: str, message: str) -> None:
        self.stats.rejected[reason] += 1
        log.debug("rejected a message from pid %s: %s", conn.info.pid, message)

    def _refuse(self, conn: _Conn, reason: str, message: str) -> None:
        """Reject, tell the client why (best effort), and close."""
        self._reject(conn, reason, message)
        log.info("dropped client pid %s: %s", conn.info.pid, message)
        with contextlib.suppress(OSError):
            conn.sock.send(proto.frame({"type": "error", "message": message}))
        self._close(conn)

    def _close(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if fd >= 0 and self._conns.pop(fd, None) is not None:
            self._sel.unregister(conn.sock)
        conn.sock.close()


def _peercred(sock: socket.socket) -> tuple[int | None, int | None]:
    try:
        pid, uid, _gid = _PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    except (OSError, AttributeError):  # not Linux: no SO_PEERCRED, no uid check possible
        return None, None
    return pid, uid


def prepare_socket_dir(path: str) -> None:
    """Create ``path`` with mode 0700, or accept it only if it already is private and ours."""
    try:
        os.makedirs(path, mode=0o700)
        os.chmod(path, 0o700)  # makedirs applies the umask; be exact
        return
    except FileExistsError:
        pass
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise VramscopeError(f"{path} is not a directory; choose another --socket path")
    mode = stat.S_IMODE(st.st_mode)
    if mode != 0o700 or st.st_uid != os.getuid():
        raise VramscopeError(
            f"socket directory {path} has mode {mode:o} and owner uid {st.st_uid}; the agent "
            f"needs a private directory (mode 700, owned by uid {os.getuid()}): choose another "
            f"path with --socket or agent.socket_path")


def remove_stale_socket(path: str) -> None:
    """Remove a socket left by a dead agent; refuse to steal a live one's."""
    if not os.path.lexists(path):
        return
    if not stat.S_ISSOCK(os.lstat(path).st_mode):
        raise VramscopeError(f"{path} exists and is not a socket; choose another --socket path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise VramscopeError(f"cannot check {path}: {exc.strerror}") from None
        os.unlink(path)
        return
    finally:
        probe.close()
    raise VramscopeError(f"another agent is listening on {path}; stop it or choose another "
                         f"path with --socket")

