"""The ingest server: a Unix stream socket the in-server hooks connect to (protocol v1).

One thread, one ``selectors`` loop, non-blocking sockets: a slow or hostile client can only fill
its own bounded receive buffer, never stall the others. Everything is bounded, rejections are
counted by reason, and a connection is dropped only when the stream cannot be resynchronised or
after too many bad messages in a row: docs/protocol.md, "Validation and what happens to bad
input", and docs/agent.md, "Limits per client and per name". The per-client checks live beside
this loop (``slots.py``, ``admission.py`` and what it applies, ``socket_dir.py``, ``peer.py``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from vramscope.agent.clock import SYSTEM_CLOCK, Clock
from vramscope.agent.errors import VramscopeError
from vramscope.agent.ingest import protocol as proto
from vramscope.agent.ingest.admission import RecordAdmission
from vramscope.agent.ingest.budget import WriteBudget
from vramscope.agent.ingest.names import NameLimits
from vramscope.agent.ingest.peer import ClientInfo, Conn, check_ns_pid, peer_uid, peercred
from vramscope.agent.ingest.rare_events import RareEventsPerDay
from vramscope.agent.ingest.rate_log import RateLimitedLog
from vramscope.agent.ingest.slots import SlotRules
from vramscope.agent.ingest.socket_dir import (
    prepare_socket_folder,
    remove_stale_socket,
    shared_with_others,
)
from vramscope.agent.ingest.timewindow import TimeWindow
from vramscope.agent.records import INT64_MAX, Event, PostMortem, Sample

log = logging.getLogger("vramscope.ingest")

# MAX_CLIENTS x agent.max_message_bytes (1 MiB) must fit the unit's MemoryMax (1 GiB) with the
# writer's queue; MAX_CLIENTS + MAX_PENDING + the agent's own files must fit its LimitNOFILE.
MAX_CLIENTS = 256
MAX_PENDING = 32
PENDING_MAX_BYTES = 65_536  # the largest frame before a hello: a hello or a status request
BUFFER_BUDGET_BYTES = 384 * 2**20  # partial frames of all connections together
HANDSHAKE_TIMEOUT_S = 5.0
IDLE_TIMEOUT_S = 60.0
SLOT_IDLE_S = 120.0  # a client that stored no record for this long may give its slot up
MAX_BAD_IN_A_ROW = 64  # a client sending this many rejected messages in a row is dropped
COUNTER_MAX = INT64_MAX  # counters saturate here (the store's BigInteger)
_RECV_BYTES = 256 * 1024
_SWEEP_INTERVAL_S = 0.25
_ACCEPT_BACKOFF_S = (0.05, 1.0)  # first and largest pause after accept() failed


@dataclass
class IngestStats:
    messages_total: int = 0
    records_total: int = 0
    client_dropped_total: int = 0  # drops the clients reported (their buffers were full)
    paused_ticks: int = 0  # 10 ms waits while the writer was behind (back-pressure)
    accept_errors: int = 0  # accept() failures (EMFILE...): the loop paused accepting
    loop_errors: int = 0  # unexpected errors the loop survived
    log_suppressed: int = 0  # refused-connection log lines not written (rate limit)
    heartbeats_total: int = 0  # quiet clients' heartbeats
    heartbeats_early: int = 0  # of those, too soon after another message to keep a slot
    rejected: Counter[str] = field(default_factory=Counter)  # reason -> count

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())


class IngestServer:
    """Accepts hook clients and hands their validated records to ``on_records``.

    Callbacks run on the server thread and must not block (they put into the writer queue).
    """

    def __init__(self, path: str, *, on_records: Callable[[list[Sample | Event], ClientInfo], None],
                 on_postmortem: Callable[[PostMortem, ClientInfo], None] | None = None,
                 on_hello: Callable[[ClientInfo], None] | None = None,
                 status: Callable[[], dict[str, Any]] | None = None,
                 max_message_bytes: int = proto.DEFAULT_MAX_MESSAGE_BYTES,
                 allowed_uids: Iterable[int] = (),
                 pause: Callable[[], bool] | None = None,
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
                 idle_timeout_s: float = IDLE_TIMEOUT_S,
                 time_window: TimeWindow | None = None,
                 name_limits: NameLimits | None = None,
                 budget: WriteBudget | None = None,
                 rare_events: RareEventsPerDay | None = None,
                 slot_idle_s: float = SLOT_IDLE_S,
                 clock: Clock = SYSTEM_CLOCK) -> None:
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
        self._conns: dict[int, Conn] = {}
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handshake_s = handshake_timeout_s
        self._idle_s = idle_timeout_s
        self._buffered = 0  # bytes of partial frames, all connections
        self._next_sweep_s = 0.0
        self._accept_paused_until: float | None = None
        self._accept_backoff_s = 0.0
        self._log_refused = RateLimitedLog(log, logging.INFO)
        self._log_trouble = RateLimitedLog(log, logging.WARNING, burst=1)
        self._counter_warned = False
        self._admission = RecordAdmission(self.stats.rejected, time_window=time_window,
                                          name_limits=name_limits, budget=budget,
                                          rare_events=rare_events, clock=clock)
        self._slots = SlotRules(handshake_timeout_s, slot_idle_s)
        self._payload_bytes = 0  # of the message being handled: what the budget charges

    # --- lifecycle ------------------------------------------------------------------------
    def bind(self) -> None:
        """Create the private directory and the 0600 socket; refuse a live agent's socket."""
        shared = shared_with_others(self._allowed_uids)
        prepare_socket_folder(self.path, self._allowed_uids)
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
        # With agent.allowed_uids, other users must be able to connect(): that needs write on
        # the socket. Who gets through is decided by the directory (group or ACL: mode 710)
        # and, for every connection, by the peer's uid (SO_PEERCRED).
        os.chmod(self.path, 0o666 if shared else 0o600)
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
            try:
                self.run_once(1.0)  # data wakes it at once; the timeout only bounds stop()
            except Exception:  # noqa: BLE001 - the ingest thread must outlive any one error
                self.stats.loop_errors += 1
                self._log_trouble("ingest loop error (survived; counted as loop_errors)",
                                  exc_info=True)
                self._stop.wait(0.01)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._listener is not None:
            self.run_once(0)  # take in what clients already sent, for the final flush
        for conn in list(self._conns.values()):
            self._close(conn)
        if self._listener is not None:
            with contextlib.suppress(KeyError):  # unregistered while accepting was paused
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
        now = time.monotonic()
        self._resume_accepting(now)
        if now >= self._next_sweep_s:
            self._sweep(now)
        if self._pause is not None and self._pause():
            self.stats.paused_ticks += 1
            self._stop.wait(0.01)
            return
        if self._accept_paused_until is not None:
            timeout_s = max(0.0, min(timeout_s, self._accept_paused_until - now))
        for key, _ in self._sel.select(min(timeout_s, _SWEEP_INTERVAL_S)):
            if key.data is None:
                self._accept()
            else:
                self._read(key.data)

    def _accept(self) -> None:
        assert self._listener is not None  # the loop runs after bind()
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # EMFILE, ENFILE, ENOBUFS...: pause, never die
            return self._accept_failed(exc)
        self._accept_backoff_s = 0.0
        sock.setblocking(False)
        pid, uid = peercred(sock)
        now = time.monotonic()
        conn = Conn(sock, ClientInfo(pid, uid), opened_s=now, last_frame_s=now,
                     last_message_s=now)
        if uid not in self._allowed_uids:
            return self._refuse(conn, "uid", f"uid {uid} is not allowed to connect; add it to "
                                "agent.allowed_uids")
        pending = [c for c in self._conns.values() if c.info.hello is None]
        if len(pending) >= MAX_PENDING:  # the oldest waits longest: it gives way
            oldest = min(pending, key=lambda c: c.opened_s)
            self._refuse(oldest, "pending", f"more than {MAX_PENDING} connections without a "
                         "hello; the oldest is closed")
        self._conns[sock.fileno()] = conn
        self._sel.register(sock, selectors.EVENT_READ, conn)

    def _accept_failed(self, exc: OSError) -> None:
        """Out of descriptors (or kernel memory): the pending connection stays in the listen
        backlog, so stop polling the listener for a while instead of spinning on it."""
        self.stats.accept_errors += 1
        lo, hi = _ACCEPT_BACKOFF_S
        self._accept_backoff_s = min(hi, max(lo, self._accept_backoff_s * 2))
        self._accept_paused_until = time.monotonic() + self._accept_backoff_s
        assert self._listener is not None  # accepting: bound
        self._sel.unregister(self._listener)
        self._log_trouble("cannot accept connections: %s (%d connections open, %d client "
                          "slots); pausing %.2f s. Raise LimitNOFILE (systemd) or ulimit -n",
                          exc.strerror or exc, len(self._conns), MAX_CLIENTS,
                          self._accept_backoff_s)

    def _resume_accepting(self, now: float) -> None:
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._accept_paused_until = None
            if self._listener is not None:
                self._sel.register(self._listener, selectors.EVENT_READ, None)

    def _sweep(self, now: float) -> None:
        """Close connections that never said hello, and frames that never completed."""
        self._next_sweep_s = now + _SWEEP_INTERVAL_S
        for conn in list(self._conns.values()):
            if conn.info.hello is None and now - conn.opened_s > self._handshake_s:
                self._refuse(conn, "timeout", f"no hello within {self._handshake_s:g} s "
                             "(agent.handshake_timeout_s)")
            elif conn.buf and now - conn.last_frame_s > self._idle_s:
                self._refuse(conn, "timeout", f"a message still incomplete after "
                             f"{self._idle_s:g} s (agent.idle_timeout_s)")

    def _read(self, conn: Conn) -> None:
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
        before = len(conn.buf)
        conn.buf += data
        limit = self._max_bytes if conn.info.hello is not None else PENDING_MAX_BYTES
        try:
            payloads = proto.split_frames(conn.buf, limit)
        except proto.ProtocolError as exc:
            return self._refuse(conn, exc.reason, str(exc))
        finally:
            self._buffered += len(conn.buf) - before
        if payloads:
            conn.last_frame_s = time.monotonic()
            if not conn.buf:
                conn.buf = bytearray()  # give a large frame's memory back
        if self._buffered > BUFFER_BUDGET_BYTES:
            return self._refuse(conn, "memory", f"partial messages of all clients exceed "
                                f"{BUFFER_BUDGET_BYTES >> 20} MiB; the client reading now is "
                                "dropped")
        for payload in payloads:
            if not self._handle(conn, payload):
                return

    def _handle(self, conn: Conn, payload: bytes) -> bool:
        """Handle one payload; False when the connection was closed."""
        self.stats.messages_total += 1
        self._payload_bytes = len(payload)  # the write budget's bytes
        try:
            self._dispatch(conn, proto.decode(payload))
        except proto.ProtocolError as exc:
            return self._on_bad_message(conn, exc)
        except Exception as exc:  # noqa: BLE001 - a validator bug must not end ingest
            log.exception("unexpected error handling a message from pid %s", conn.info.pid)
            return self._on_bad_message(conn, proto.ProtocolError("internal", str(exc)))
        finally:
            conn.last_message_s = time.monotonic()  # a heartbeat's silence starts here
        conn.bad_in_a_row = 0
        return conn.sock.fileno() >= 0

    def _on_bad_message(self, conn: Conn, exc: proto.ProtocolError) -> bool:
        if exc.fatal:
            self._refuse(conn, exc.reason, str(exc))
            return False
        self._reject(conn, exc.reason, str(exc))
        conn.bad_in_a_row += 1
        if conn.bad_in_a_row >= MAX_BAD_IN_A_ROW:
            self._refuse(conn, "resync", f"{MAX_BAD_IN_A_ROW} bad messages in a row")
            return False
        return True

    def _dispatch(self, conn: Conn, obj: dict[str, Any]) -> None:
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
            if not self._admission.postmortem(conn, pm.ts_s, self._payload_bytes):
                return None
            if pm.pid is None or pm.pid == conn.info.ns_pid:
                pm = pm._replace(pid=conn.info.pid)
            conn.useful_s = time.monotonic()
            if self._on_postmortem is not None:
                self._on_postmortem(pm, conn.info)
            return None
        if kind == "heartbeat":
            return self._on_heartbeat(conn)
        self._add_client_dropped(proto.parse_dropped(obj))  # "dropped"
        return None

    def _on_heartbeat(self, conn: Conn) -> None:
        """A quiet client is alive: after a silence it keeps its slot as a stored record
        does. One that follows another message closely is chatter and keeps nothing."""
        self.stats.heartbeats_total += 1
        now = time.monotonic()
        if now - conn.last_message_s >= proto.HEARTBEAT_MIN_GAP_S:
            conn.useful_s = now
        else:
            self.stats.heartbeats_early += 1

    def _add_client_dropped(self, count: int) -> None:
        """Saturate instead of growing past what the store (and Prometheus) can hold."""
        total = self.stats.client_dropped_total + count
        if total > COUNTER_MAX:
            total = COUNTER_MAX
            if not self._counter_warned:
                self._counter_warned = True
                log.warning("client_dropped_total reached %d and stays there (a client reported "
                            "an absurd drop count)", COUNTER_MAX)
        self.stats.client_dropped_total = total

    def _on_hello_message(self, conn: Conn, obj: dict[str, Any]) -> None:
        if conn.info.hello is not None:
            raise proto.ProtocolError("order", "a second hello on one connection")
        hello = proto.parse_hello(obj)
        if self._client_count() >= MAX_CLIENTS and not self._free_slot(conn):
            raise proto.ProtocolError("clients", f"too many clients (limit {MAX_CLIENTS}), "
                                      "each of them storing records or still new "
                                      "(agent.slot_idle_s, agent.handshake_timeout_s); retry "
                                      f"in {self._handshake_s:g} s", fatal=True)
        conn.info.hello = hello
        conn.admitted_s = time.monotonic()
        check_ns_pid(conn.info)
        self._send(conn, {"type": "welcome", "protocol": proto.PROTOCOL_VERSION})
        if self._on_hello is not None:
            self._on_hello(conn.info)

    def _client_count(self) -> int:
        return sum(1 for c in self._conns.values() if c.info.hello is not None)

    def _free_slot(self, newcomer: Conn) -> bool:
        """Every slot is taken: free one for ``newcomer`` (``slots.py`` says whose), or say
        no (False)."""
        clients = [c for c in self._conns.values() if c.info.hello is not None]
        found = self._slots.victim(clients, peer_uid, newcomer.info.peer_uid, time.monotonic())
        if found is None:
            return not clients
        self._refuse(*found)
        return True

    def _on_records_message(self, conn: Conn, obj: dict[str, Any]) -> None:
        records = proto.parse_records(obj, default_pid=conn.info.pid)
        ns_pid = conn.info.ns_pid
        if ns_pid is not None:  # a client in another PID namespace: its records, the host's pid
            pid = conn.info.pid
            records = [r._replace(pid=pid) if r.pid == ns_pid else r for r in records]
        records = self._admission.records(conn, records, self._payload_bytes)
        self.stats.records_total += len(records)
        if records:
            conn.useful_s = time.monotonic()
            self._on_records(records, conn.info)

    @property
    def names(self) -> NameLimits:
        return self._admission.names

    # --- replies and closing --------------------------------------------------------------
    def _send(self, conn: Conn, obj: dict[str, Any]) -> None:
        """Replies are tiny; a client that cannot take one is not reading, so drop it."""
        data = proto.frame(obj)
        try:
            sent = conn.sock.send(data)
        except OSError:
            sent = -1
        if sent != len(data):
            self._close(conn)

    def _reject(self, conn: Conn, reason: str, message: str) -> None:
        self.stats.rejected[reason] += 1
        log.debug("rejected a message from pid %s: %s", conn.info.pid, message)

    def _refuse(self, conn: Conn, reason: str, message: str) -> None:
        """Reject, tell the client why (best effort), and close."""
        self._reject(conn, reason, message)
        self._log_refused("dropped client pid %s: %s", conn.info.pid, message)
        self.stats.log_suppressed = self._log_refused.left_out_total
        with contextlib.suppress(OSError):
            conn.sock.send(proto.frame({"type": "error", "message": message}))
        self._close(conn)

    def _close(self, conn: Conn) -> None:
        fd = conn.sock.fileno()
        if fd >= 0 and self._conns.pop(fd, None) is not None:
            self._sel.unregister(conn.sock)
            self._buffered -= len(conn.buf)
            self._admission.names.release(conn.names)
        conn.buf = bytearray()
        conn.sock.close()

