"""The ingest wire protocol, version 1: length-prefixed JSON frames over a Unix stream socket.

Frames, messages and why JSON: docs/protocol.md. A frame whose length prefix exceeds the cap
cannot be skipped safely (we would have to trust the length), so the connection is dropped; a
frame with a good length but a bad payload is rejected and skipped, so the stream stays in sync.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeGuard, cast

from vramscope.agent.records import (
    INT32_MAX,
    INT64_MAX,
    PHASE_OF,
    SAMPLE_COUNTER_FIELDS,
    Event,
    PostMortem,
    Sample,
)
from vramscope.agent.timefmt import MAX_TS_S, MIN_TS_S
from vramscope.agent.trace import (
    STR_LIMITS,
    check_data,
    event_to_json,
    is_encodable,
    record_from_json,
    sample_to_json,
    timestamp,
)

PROTOCOL_VERSION = 1
HEADER = struct.Struct(">I")
HEADER_BYTES = HEADER.size
DEFAULT_MAX_MESSAGE_BYTES = 1_048_576
MAX_RECORDS_PER_MESSAGE = 100_000
# hello fields: the processes table's String(255) columns; a pid as the kernel hands them out
# (Linux's PID_MAX_LIMIT is 2**22; the column is a 32-bit Integer).
MAX_NAME_CHARS = 255
MAX_PID = INT32_MAX
MAX_DEVICES = 64
CLIENT_TYPES = frozenset({"hello", "records", "postmortem", "dropped", "heartbeat", "status"})
# A quiet client's heartbeat: the hooks' client sends one after HEARTBEAT_S without another
# message (under the default agent.handshake_timeout_s, 5 s, so a quiet server that just said
# hello has a useful message in before its grace ends). The agent counts it as
# useful only after HEARTBEAT_MIN_GAP_S of silence: what tells a quiet client from a chatterer
# is how seldom it speaks, since neither stores anything (issue 45: 256 clients sending a small
# message every 3 s held every slot).
HEARTBEAT_S = 4.5
HEARTBEAT_MIN_GAP_S = 4.0


class ProtocolError(ValueError):
    """A message that breaks the protocol. ``fatal`` means the connection cannot continue."""

    def __init__(self, reason: str, message: str, fatal: bool = False) -> None:
        super().__init__(message)
        self.reason = reason  # a short counter key: "json", "schema", "oversized", ...
        self.fatal = fatal


class Hello(NamedTuple):
    protocol: int
    pid: int | None
    process: str | None
    devices: tuple[int, ...]
    model: str | None


# --- encoding ---------------------------------------------------------------------------------
def frame(obj: dict[str, Any]) -> bytes:
    """One frame: the 4-byte length, then the compact JSON payload."""
    payload = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")
    return HEADER.pack(len(payload)) + payload


def hello(pid: int, process: str, devices: Sequence[int] = (), model: str | None = None,
          protocol: int = PROTOCOL_VERSION) -> bytes:
    return frame({"type": "hello", "protocol": protocol, "pid": pid, "process": process,
                  "devices": list(devices), "model": model})


def record_to_json(record: Sample | Event) -> dict[str, Any]:
    return event_to_json(record) if isinstance(record, Event) else sample_to_json(record)


def records_message(records: Sequence[Sample | Event]) -> bytes:
    return frame({"type": "records", "records": [record_to_json(r) for r in records]})


def postmortem_message(pm: PostMortem) -> bytes:
    return frame({"type": "postmortem", "postmortem": pm.to_json()})


def dropped_message(count: int) -> bytes:
    return frame({"type": "dropped", "count": count})


def heartbeat_message() -> bytes:
    return frame({"type": "heartbeat"})


# --- decoding ---------------------------------------------------------------------------------
def split_frames(buf: bytearray, max_bytes: int) -> list[bytes]:
    """Remove and return every complete payload at the front of ``buf``.

    Raises a fatal ``ProtocolError`` on a length above ``max_bytes`` (the stream cannot be
    trusted past it). An incomplete frame stays in ``buf`` for the next read.
    """
    out: list[bytes] = []
    pos = 0
    while len(buf) - pos >= HEADER_BYTES:
        (length,) = HEADER.unpack_from(buf, pos)
        if length > max_bytes:
            del buf[:pos]
            raise ProtocolError("oversized", f"message of {length} bytes exceeds the cap of "
                                f"{max_bytes} bytes (agent.max_message_bytes)", fatal=True)
        end = pos + HEADER_BYTES + length
        if end > len(buf):
            break
        out.append(bytes(buf[pos + HEADER_BYTES:end]))
        pos = end
    del buf[:pos]
    return out


def decode(payload: bytes) -> dict[str, Any]:
    """Parse one payload into a JSON object with a known ``type``; raise ``ProtocolError``."""
    try:
        obj = json.loads(payload, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ProtocolError("json", f"payload is not valid UTF-8 JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("schema", f"payload must be a JSON object, got {type(obj).__name__}")
    kind = obj.get("type")
    if kind not in CLIENT_TYPES:
        raise ProtocolError("schema", f"unknown message type {kind!r}; known: "
                            f"{', '.join(sorted(CLIENT_TYPES))}")
    return obj


def _reject_constant(token: str) -> Any:
    raise ValueError(f"{token} is not allowed")


def parse_hello(obj: dict[str, Any]) -> Hello:
    """Validate a hello; a wrong protocol version is fatal and says which versions we speak."""
    version = obj.get("protocol")
    if type(version) is not int or version != PROTOCOL_VERSION:  # 1.0 and True are not 1
        raise ProtocolError("version", f"protocol version {_cut(version)} is not supported; "
                            f"this agent speaks version {PROTOCOL_VERSION} (an integer)",
                            fatal=True)
    pid = _optional(obj, "pid", int)
    if pid is not None and not 0 <= pid <= MAX_PID:
        raise ProtocolError("schema", f"'pid' must be a process id from 0 to {MAX_PID}, got "
                            f"{_cut(pid)}", fatal=True)
    process = _name(obj, "process")
    model = _name(obj, "model")
    devices = obj.get("devices") or []
    if (not isinstance(devices, list) or len(devices) > MAX_DEVICES
            or not all(_is_index(d) and d <= MAX_PID for d in devices)):
        raise ProtocolError("schema", f"'devices' must be a list of at most {MAX_DEVICES} "
                            f"device indexes, got {_cut(devices)}", fatal=True)
    return Hello(version, pid, process, tuple(devices), model)


def _name(obj: dict[str, Any], key: str) -> str | None:
    value: str | None = _optional(obj, key, str)
    if value is not None and len(value) > MAX_NAME_CHARS:
        raise ProtocolError("schema", f"{key!r} is longer than {MAX_NAME_CHARS} characters "
                            f"({len(value)})", fatal=True)
    if value is not None and not is_encodable(value):
        raise ProtocolError("schema", f"{key!r} is not valid Unicode (a lone surrogate) "
                            "or holds a NUL character",
                            fatal=True)
    return value


def _cut(value: Any) -> str:
    """repr of a client's value for an error message, cut short (the reply is one frame)."""
    try:
        text = repr(value)
    except ValueError:  # an int with more digits than str() allows
        return f"<{type(value).__name__} too large to show>"
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def parse_records(obj: dict[str, Any], default_pid: int | None = None) -> list[Sample | Event]:
    """Validate every record of a ``records`` message with the trace-v1 validator; records
    without a pid get ``default_pid`` (the sending process's).

    A batch made only of well-typed samples takes a column-wise fast path that accepts exactly
    what ``record_from_json`` accepts (tested for equality); anything else, and every error
    message, comes from ``record_from_json`` itself.
    """
    items = obj.get("records")
    if not isinstance(items, list):
        raise ProtocolError("schema", "'records' must be a list of trace-v1 objects")
    if len(items) > MAX_RECORDS_PER_MESSAGE:
        raise ProtocolError("schema", f"{len(items)} records in one message; at most "
                            f"{MAX_RECORDS_PER_MESSAGE}")
    fast = fast_samples(items, default_pid)
    if fast is not None:
        return cast("list[Sample | Event]", fast)  # no copy: read-only from here
    out: list[Sample | Event] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ProtocolError("schema", f"record {i}: expected an object, got "
                                f"{type(item).__name__}")
        try:
            out.append(record_from_json(item))
        except (ValueError, TypeError, OverflowError) as exc:
            raise ProtocolError("schema", f"record {i}: {exc}"[:500]) from None
    if default_pid is not None:
        out = [r if r.pid is not None else r._replace(pid=default_pid) for r in out]
    return out


_NONE = type(None)


def fast_samples(items: list[Any], default_pid: int | None = None) -> list[Sample] | None:
    """Samples from a batch of plain, valid sample objects, checked a column at a time (the
    per-value checks run in C through ``map``/``set``); ``None`` means "take the slow path"."""
    if not items or not all(type(o) is dict and "event" not in o for o in items):
        return None
    ts = [o.get("ts") for o in items]
    try:
        if (not set(map(type, ts)) <= {float, int} or not all(map(math.isfinite, ts))
                or min(ts) < MIN_TS_S or max(ts) > MAX_TS_S):
            return None
    except OverflowError:  # an int beyond float range: the slow path explains it
        return None
    device = _int_column(items, "device", INT32_MAX)
    pid = _int_column(items, "pid", INT32_MAX)
    phases = [PHASE_OF.get(p) if type(p) is str else None
              for p in (o.get("phase", "unknown") for o in items)]
    source = _str_column(items, "source", STR_LIMITS["source"])
    host = _str_column(items, "host", STR_LIMITS["host"])
    uuid = _str_column(items, "device_uuid", STR_LIMITS["device_uuid"])
    counters = [_int_column(items, k, INT64_MAX) for k in SAMPLE_COUNTER_FIELDS]
    if (device is None or pid is None or source is None or host is None or uuid is None
            or None in phases
            or any(c is None for c in counters)):
        return None
    device = [0 if d is None else d for d in device]
    if default_pid is not None:
        pid = [default_pid if p is None else p for p in pid]
    columns = [c for c in counters if c is not None]  # all of them (checked above)
    return list(map(Sample._make, zip(map(float, ts), device, phases, source, pid, *columns,
                                      host, uuid, strict=True)))


def _column(items: list[dict[str, Any]], key: str, kind: type) -> list[Any] | None:
    """Every item's ``key``, when each is of ``kind`` (exactly: a bool is no int) or absent."""
    col = [o.get(key) for o in items]
    return col if set(map(type, col)) <= {kind, _NONE} else None


def _int_column(items: list[dict[str, Any]], key: str, top: int) -> list[int | None] | None:
    col = _column(items, key, int)
    values = [v for v in col or () if v is not None]
    return col if not values or (min(values) >= 0 and max(values) <= top) else None


def _str_column(items: list[dict[str, Any]], key: str, limit: int) -> list[str | None] | None:
    col = _column(items, key, str)
    present = [v for v in col or () if v is not None]
    if present and (max(map(len, present)) > limit or not is_encodable("".join(present))):
        return None  # the slow path names the bad record
    return col


def parse_postmortem(obj: dict[str, Any]) -> PostMortem:
    body = obj.get("postmortem")
    if not isinstance(body, dict):
        raise ProtocolError("schema", "'postmortem' must be an object")
    try:
        pm = PostMortem.from_json(body)
        # what the store will write: bounded, encodable, and it must serialize
        check_data(pm.to_json(), "post-mortem", max_bytes=DEFAULT_MAX_MESSAGE_BYTES)
        json.dumps(pm.to_json(), allow_nan=False)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise ProtocolError("schema", f"bad post-mortem: {exc}"[:500]) from None
    for key, limit in (("cause", 32), ("snapshot_path", 4096)):
        value = getattr(pm, key)
        if value is not None and (not isinstance(value, str) or len(value) > limit):
            raise ProtocolError("schema", f"post-mortem {key!r} must be a string of at most "
                                f"{limit} characters, got {_cut(value)}")
    try:
        ts = timestamp(pm.ts_s, "ts_s")
    except ValueError as exc:
        raise ProtocolError("schema", f"post-mortem: {exc}") from None
    if not (_is_index(pm.device) and pm.device <= MAX_PID):
        raise ProtocolError("schema", f"post-mortem 'device' must be an index, got "
                            f"{pm.device!r}")
    if pm.pid is not None and not (_is_index(pm.pid) and pm.pid <= MAX_PID):
        raise ProtocolError("schema", f"post-mortem 'pid' must be an integer, got {pm.pid!r}")
    return pm._replace(ts_s=ts)


def parse_dropped(obj: dict[str, Any]) -> int:
    count = obj.get("count")
    if not _is_index(count):
        raise ProtocolError("schema", f"'count' must be an integer >= 0, got {count!r}")
    return count


def _is_index(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT64_MAX


def _optional(obj: dict[str, Any], key: str, kind: type) -> Any:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ProtocolError("schema", f"{key!r} must be {kind.__name__}, got {value!r}"[:300],
                            fatal=True)
    return value
