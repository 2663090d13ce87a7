"""The in-server client: ships records to the agent's socket without ever harming the server.

``put`` takes no lock: it appends to a bounded ``deque`` (a full one drops its oldest record)
and ticks an ``itertools.count``, both atomic in CPython; drops are counted from that (see
``dropped_total``). A daemon thread sends batches; without an agent it drops and counts,
reconnects with backoff and reports the count in a ``dropped`` message. The server thread never
waits and never sees an exception: docs/agent.md, "The hook client (inside the server)".
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from vramscope.agent.ingest import protocol as proto
from vramscope.agent.records import Event, PostMortem, Sample
from vramscope.hooks.sink import Record

_Payload = TypeVar("_Payload")

log = logging.getLogger("vramscope.client")


class SocketSink:
    """A ``RecordSink`` to the agent's Unix socket."""

    _pushed_out: int  # set in _init_buffer; declared here for dropped_total, written first

    def __init__(self, socket_path: str, *, buffer_records: int = 10_000,
                 batch_records: int = 256, process: str | None = None,
                 devices: tuple[int, ...] = (), model: str | None = None,
                 max_message_bytes: int = proto.DEFAULT_MAX_MESSAGE_BYTES,
                 connect_timeout_s: float = 1.0, send_timeout_s: float = 1.0,
                 poll_s: float = 0.05, max_backoff_s: float = 5.0,
                 heartbeat_s: float = proto.HEARTBEAT_S, start: bool = True) -> None:
        if buffer_records < 1 or batch_records < 1:
            raise ValueError(f"buffer_records and batch_records must be >= 1, got "
                             f"{buffer_records}, {batch_records}")
        self.socket_path = socket_path
        self.buffer_records = buffer_records
        self.sent_total = 0
        self._reported = 0  # dropped_total already reported to the agent
        self._init_buffer()
        self._batch = batch_records
        self._hello = proto.hello(os.getpid(), process or _process_name(), devices, model)
        self._max_bytes = max_message_bytes
        self._connect_timeout_s = connect_timeout_s
        self._send_timeout_s = send_timeout_s
        self._poll_s = poll_s
        self._max_backoff_s = max_backoff_s
        self._heartbeat_s = heartbeat_s
        self._last_send_s = 0.0  # monotonic: the last frame sent (the hello, at first)
        self._sock: socket.socket | None = None
        self._send_error: Exception | None = None
        self._away_logged = False
        self._hello_args = (process or _process_name(), devices, model)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vramscope-client", daemon=True)
        if start:
            self._thread.start()
            _restart_in_forked_children(self)

    # --- the server's side: never blocks, never raises ------------------------------------
    def put(self, record: Record) -> None:
        try:
            self._buf.append(record)  # at maxlen the deque drops its oldest record itself
            next(self._puts)  # after the append, so the drop count never runs ahead
        except Exception:  # noqa: BLE001 - nothing may reach the server's thread
            pass

    @property
    def dropped_total(self) -> int:
        """Records that never reached the agent: pushed out of the full buffer, or taken from
        it and not sent (refused by the encoder, a failed send, still buffered at close).

        Pushed out = counted puts - taken - buffered, read in that order under the drain lock
        (so ``taken`` cannot move). A put counts itself after its append, so at any instant
        counted puts <= appends, and the count read first can only be behind the buffer length
        read after it: the figure is a lower bound of the truth, equal to it when no put is in
        progress. The largest figure seen is kept, so the count never goes down.
        """
        with self._lock:
            counted = next(self._puts) - self._count_reads  # this read ticks the counter too
            self._count_reads += 1
            pushed_out = counted - self._taken - len(self._buf)
            self._pushed_out = max(self._pushed_out, pushed_out)
            return self._pushed_out + self._unsent

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop the thread after one last quick drain (at most ``timeout_s``)."""
        self._closed.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    @property
    def buffered(self) -> int:
        return len(self._buf)

    @property
    def connected(self) -> bool:
        return self._sock is not None

    # --- the drain thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except Exception:  # noqa: BLE001 - a bug here must stay in this thread
            log.exception("vramscope client thread failed; records are dropped from now on")
            self._disconnect()

    def _loop(self) -> None:
        backoff_s = 0.05
        while True:
            closing = self._closed.is_set()
            if self._sock is None and not self._connect():
                if closing:
                    self._drop_buffered()
                    return
                self._closed.wait(backoff_s)
                backoff_s = min(self._max_backoff_s, backoff_s * 2)
                continue
            backoff_s = 0.05
            sent_any = self._drain_once() or self._heartbeat_if_quiet()
            if closing and (not sent_any or self._sock is None):
                self._drop_buffered()
                self._report_drops_at_close()
                self._disconnect()
                return
            if not sent_any:
                self._closed.wait(self._poll_s)

    def _drain_once(self) -> bool:
        """Send one batch (and the drop report, when due). True if something was sent."""
        count = self.dropped_total
        if count > self._reported:
            if not self._send(proto.dropped_message(count - self._reported)):
                self._lost()
                return False
            self._reported = count
        batch = self._take()
        if not batch:
            return False
        frames = self._frames(batch)
        for i, (data, count) in enumerate(frames):
            if not self._send(data):
                self._add_dropped(sum(c for _, c in frames[i:]))
                self._lost()
                return False
            self.sent_total += count
        return True

    def _heartbeat_if_quiet(self) -> bool:
        """Nothing sent for ``heartbeat_s``: say this server is alive, so that a quiet one
        (no CUDA allocator to sample, an idle engine) keeps its slot at the agent when every
        slot is taken. Never while closing (nothing to keep); False: nothing was sent."""
        if self._closed.is_set() or time.monotonic() - self._last_send_s < self._heartbeat_s:
            return False
        if not self._send(proto.heartbeat_message()):
            self._lost()
        return False  # a heartbeat is not progress: the loop still waits its poll

    def _report_drops_at_close(self) -> None:
        """Closing: tell the agent what was dropped since the last report (a batch whose send
        just failed, what is still buffered), over a fresh connection if the old one died.
        Best effort, within close()'s time; never raises."""
        count = self.dropped_total
        if count <= self._reported or (self._sock is None and not self._connect()):
            return
        if self._send(proto.dropped_message(count - self._reported)):
            self._reported = count

    def _drop_buffered(self) -> None:
        """Closing: what is still buffered will never be sent; count it."""
        self._add_dropped(len(self._take(len(self._buf))))

    def _add_dropped(self, n: int) -> None:
        """``n`` records taken from the buffer will never be sent."""
        with self._lock:
            self._unsent += n

    def _take(self, limit: int | None = None) -> list[Record]:
        """Up to ``limit`` (default: a batch) of the oldest records. This thread is the only
        one that removes records (puts only add), so ``n`` of them are surely there."""
        with self._lock:
            n = min(self._batch if limit is None else limit, len(self._buf))
            batch = [self._buf.popleft() for _ in range(n)]
            self._taken += n
            return batch

    def _frames(self, batch: list[Record]) -> list[tuple[bytes, int]]:
        """Encode a batch as (frame, records in it): records together, post-mortems alone."""
        records = [r for r in batch if not isinstance(r, PostMortem)]
        frames: list[tuple[bytes, int]] = []
        if records:
            frames += self._encode(records)
        for pm in (r for r in batch if isinstance(r, PostMortem)):
            frames += self._encode_one(proto.postmortem_message, pm, 1)
        return frames

    def _encode(self, records: list[Sample | Event]) -> list[tuple[bytes, int]]:
        out = self._encode_one(proto.records_message, records, len(records))
        if out or len(records) == 1:
            return out
        half = len(records) // 2  # too big for one message: split until it fits
        return self._encode(records[:half]) + self._encode(records[half:])

    def _encode_one(self, make: Callable[[_Payload], bytes], payload: _Payload,
                    count: int) -> list[tuple[bytes, int]]:
        try:
            data = make(payload)
        except (TypeError, ValueError, AttributeError):
            self._add_dropped(count)  # not encodable: a bug upstream, never the server's
            return []
        if len(data) - proto.HEADER_BYTES > self._max_bytes:
            if count == 1:
                self._add_dropped(1)
            return []
        return [(data, count)]

    def _after_fork_in_child(self) -> None:
        """A forked worker (gunicorn-style) gets its own buffer, connection and thread: the
        parent's thread does not exist in the child, and its socket must not be shared."""
        self._init_buffer()
        self._sock = None  # the parent's socket object stays open for the parent only
        self.sent_total = self._reported = 0
        self._hello = proto.hello(os.getpid(), *self._hello_args)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vramscope-client", daemon=True)
        self._thread.start()

    def _init_buffer(self) -> None:
        self._buf: deque[Record] = deque(maxlen=self.buffer_records)
        self._puts = itertools.count()  # ticked once per put, and once per dropped_total read
        self._lock = threading.Lock()  # the drain side's: put never takes it
        self._count_reads = 0  # ticks of _puts by dropped_total, not by put
        self._taken = 0  # records removed by the drain thread: sent, in flight or lost
        self._unsent = 0  # taken and never sent
        self._pushed_out = 0  # the largest count of records the full buffer pushed out seen

    # --- connection -----------------------------------------------------------------------
    def _connect(self) -> bool:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self._connect_timeout_s)
        try:
            sock.connect(self.socket_path)
            sock.sendall(self._hello)
            reply = _read_frame(sock, self._max_bytes)
        except (OSError, ValueError) as exc:
            sock.close()
            return self._note_away(f"{exc.__class__.__name__}: {exc}")
        if reply.get("type") != "welcome":
            sock.close()
            return self._note_away(f"refused: {reply.get('message', reply)}")
        sock.settimeout(self._send_timeout_s)
        self._sock = sock
        self._last_send_s = time.monotonic()
        if self._away_logged:
            log.warning("vramscope agent at %s is back; %d records were dropped meanwhile",
                        self.socket_path, self.dropped_total - self._reported)
            self._away_logged = False
        return True

    def _note_away(self, why: str) -> bool:
        if not self._away_logged:
            log.warning("vramscope agent not reachable at %s (%s); records are dropped and "
                        "counted until it is", self.socket_path, why)
            self._away_logged = True
        return False

    def _send(self, data: bytes) -> bool:
        """Send one frame; on failure, run ``on_failure`` (count the drop) *before* the
        connection is marked lost, so ``connected`` never turns False ahead of the count."""
        if self._sock is None:
            return False
        try:
            self._sock.sendall(data)
            self._last_send_s = time.monotonic()
            return True
        except OSError as exc:  # includes the timeout of a stopped or slow agent
            self._send_error = exc
            return False

    def _lost(self) -> None:
        self._disconnect()
        self._note_away(f"send failed: {self._send_error}")

    def _disconnect(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None


def _read_frame(sock: socket.socket, max_bytes: int) -> dict[str, Any]:
    header = _recv_exact(sock, proto.HEADER_BYTES)
    (length,) = proto.HEADER.unpack(header)
    if length > max_bytes:
        raise ValueError(f"reply of {length} bytes is too large")
    obj = json.loads(_recv_exact(sock, length))
    if not isinstance(obj, dict):
        raise ValueError("reply is not a JSON object")
    return obj


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(left)
        if not chunk:
            raise ConnectionError("the agent closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _restart_in_forked_children(sink: SocketSink) -> None:
    ref = weakref.ref(sink)  # the fork hook must not keep a closed sink alive

    def after_in_child() -> None:
        alive = ref()
        if alive is not None and not alive._closed.is_set():
            alive._after_fork_in_child()

    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=after_in_child)


def _process_name() -> str:
    try:
        with open("/proc/self/comm", encoding="utf-8") as fh:
            comm = fh.read().strip()
    except OSError:
        comm = ""
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return f"{comm} {script}".strip()[:255] or "python"


def make_default_sink(config: Mapping[str, Any], *, process: str | None = None,
                      devices: tuple[int, ...] = (), model: str | None = None) -> SocketSink:
    """The sink ``vramscope.install()`` uses: the socket client, configured from ``config``."""
    return SocketSink(config["agent.socket_path"], buffer_records=config["hooks.buffer_records"],
                      max_message_bytes=config["agent.max_message_bytes"], process=process,
                      devices=devices, model=model)
