"""Trace format v1 (JSON Lines), a public contract (docs/trace-format.md).

One JSON object per line. A line with an ``"event"`` key is an event; any other is a sample.
Unknown keys are ignored (never an error). Strict by default: the first malformed line raises
:class:`TraceError` with ``FILE:LINE: what is wrong``; ``skip_invalid=True`` keeps the good lines
and counts the bad ones.

Pure functions over text; the CLI and the store do the I/O around them.
"""

from __future__ import annotations

import gzip
import heapq
import io
import json
import math
import zlib
from collections.abc import Callable, Iterable, Iterator
from operator import attrgetter
from typing import IO, Any, NamedTuple, cast

import orjson
from vramscope.agent.errors import TraceError
from vramscope.agent.records import (
    INT32_MAX,
    INT64_MAX,
    PHASE_OF,
    SAMPLE_COUNTER_FIELDS,
    Event,
    Phase,
    Sample,
)
from vramscope.agent.timefmt import MAX_TS_S, MIN_TS_S, representable

FORMAT_VERSION = 1
_EVENT_FIELDS = {"ts", "event", "device", "pid", "phase", "request_id", "host", "device_uuid"}
# Column limits of the store (schema.py), checked here so that a bad record is refused where it
# enters (a file line, one client's message) instead of failing a batch that also holds other
# clients' rows. Every string must also be encodable as UTF-8 (no lone surrogates) and hold no
# NUL (PostgreSQL's text refuses it).
STR_LIMITS = {"source": 32, "event": 64, "request_id": 255, "host": 255, "device_uuid": 80}
_TS = attrgetter("ts_s")

# Bounds on an event's extra keys (stored as JSON text): readers recurse over them.
MAX_DATA_DEPTH = 16
MAX_DATA_BYTES = 65_536


class Trace(NamedTuple):
    samples: list[Sample]
    events: list[Event]
    skipped: list[TraceError]  # empty unless skip_invalid


MAX_LINE_BYTES = 16 * 2**20  # one record; a longer line is not a trace line
GZIP_MAGIC = b"\x1f\x8b"


class TraceDamage(TraceError):
    """The file itself is damaged at this line (a gzip stream cut short: a recorder killed
    mid-write): nothing after it can be read. With ``skip_invalid`` the lines before it are
    kept and this is reported among the skipped problems."""


OnRead = Callable[[int], None]  # told each time more of a file's bytes are read: how many


def read_trace(path: str, *, skip_invalid: bool = False, on_read: OnRead | None = None) -> Trace:
    """Read a whole trace file; strict unless ``skip_invalid`` (then bad lines, and a damaged
    end, are skipped and listed in ``Trace.skipped``)."""
    skipped: list[TraceError] = []
    return parse_lines(file_lines(path, salvage=skipped if skip_invalid else None,
                                  on_read=on_read), path,
                       skip_invalid=skip_invalid, skipped=skipped)


def iter_trace(path: str, *, skip_invalid: bool = False, skipped: list[TraceError] | None = None,
               chunk: int = 5000, on_read: OnRead | None = None
               ) -> Iterator[tuple[list[Sample], list[Event]]]:
    """Stream a trace file as ``(samples, events)`` chunks of at most ``chunk`` records, so a
    file of any size costs one chunk of memory. Strict unless ``skip_invalid`` (then the bad
    lines, and a :class:`TraceDamage` where the file breaks off, go to ``skipped``)."""
    skipped = skipped if skipped is not None else []
    lines = file_lines(path, salvage=skipped if skip_invalid else None, on_read=on_read)
    yield from _chunks(_records(lines, path, skip_invalid, skipped), chunk)


def _chunks(records: Iterable[tuple[int, Sample | Event]], chunk: float
            ) -> Iterator[tuple[list[Sample], list[Event]]]:
    samples: list[Sample] = []
    events: list[Event] = []
    for _lineno, record in records:
        if isinstance(record, Event):
            events.append(record)
        else:
            samples.append(record)
        if len(samples) + len(events) >= chunk:
            yield samples, events
            samples, events = [], []
    if samples or events:
        yield samples, events


def file_lines(path: str, *, salvage: list[TraceError] | None = None,
               on_read: OnRead | None = None) -> Iterator[str]:
    """The lines of a trace file, decoded one at a time: a file that is not UTF-8 JSON Lines
    (invalid UTF-8, binary, a damaged or truncated gzip stream) is reported at the line where it
    goes wrong. A gzip-compressed trace (``.jsonl.gz``, found by its magic bytes, whatever its
    name) is decompressed as it is read: long recordings are kept compressed.

    ``salvage``: a damaged gzip stream (the commonest damaged trace: a recorder killed
    mid-write) ends the lines there instead of raising, its :class:`TraceDamage` added to the
    list: every whole line before the damage is kept.

    ``on_read`` is told the bytes of the file as they are read (a gzip file's compressed
    bytes): the progress of ``import`` and ``analyze`` (agent/cli/progress.py)."""
    try:
        # closed by the generator's finally
        if on_read is None:
            raw_fh = open(path, "rb")  # noqa: SIM115
        else:
            unbuffered = open(path, "rb", buffering=0)  # noqa: SIM115
            raw_fh = io.BufferedReader(CountedReads(unbuffered, on_read), COUNTED_BUFFER_BYTES)
        compressed = raw_fh.read(2) == GZIP_MAGIC
        raw_fh.seek(0)
    except OSError as exc:
        raise TraceError(path, 0, f"cannot read: {exc.strerror}") from None
    # GzipFile does not close the file it is given: both are closed in the finally below
    fh: IO[bytes] = (cast(IO[bytes], gzip.GzipFile(fileobj=raw_fh, mode="rb")) if compressed
                     else raw_fh)
    lineno = 0
    try:
        while raw := _read_line(fh, path, lineno + 1):
            lineno += 1
            if b"\0" in raw:
                raise TraceError(path, lineno, "binary data (a NUL byte), not a JSON Lines "
                                 "trace")
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceError(path, lineno, f"not UTF-8 at byte {exc.start + 1} of the "
                                 f"line: {exc.reason}") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        # a gzip stream cut short (a recording killed mid-write) or damaged
        damage = TraceDamage(path, lineno + 1, f"damaged gzip stream: {exc}")
        if salvage is None:
            raise damage from None
        salvage.append(damage)
    except OSError as exc:
        raise TraceError(path, 0, f"cannot read: {exc.strerror}") from None
    finally:
        fh.close()
        raw_fh.close()


# the buffer of a counted file: one call of ``on_read`` per 64 KiB read
COUNTED_BUFFER_BYTES = 64 * 1024


class CountedReads(io.RawIOBase):
    """A file whose reads tell ``on_read`` how many bytes are new: each byte once, however
    often it is read (``file_lines`` reads the gzip magic, then seeks back to the start)."""

    def __init__(self, raw: io.RawIOBase, on_read: OnRead) -> None:
        self._raw = raw
        self._on_read = on_read
        self._pos = 0
        self._furthest = 0  # the bytes up to here have been told

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._raw.seekable()

    def readinto(self, buffer: Any) -> int | None:
        n = self._raw.readinto(buffer)
        if n:
            self._pos += n
            if self._pos > self._furthest:
                self._on_read(self._pos - self._furthest)
                self._furthest = self._pos
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = self._raw.seek(offset, whence)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        self._raw.close()
        super().close()


def _read_line(fh: IO[bytes], path: str, lineno: int) -> bytes:
    raw = fh.readline(MAX_LINE_BYTES + 1)
    if len(raw) > MAX_LINE_BYTES:
        raise TraceError(path, lineno, f"line longer than {MAX_LINE_BYTES} bytes; a trace "
                         f"line is one record")
    return raw


def parse_lines(lines: Iterable[str], name: str = "<trace>", *,
                skip_invalid: bool = False, skipped: list[TraceError] | None = None) -> Trace:
    skipped = skipped if skipped is not None else []
    samples, events = next(_chunks(_records(lines, name, skip_invalid, skipped), math.inf),
                           ([], []))
    return Trace(samples, events, skipped)


def _records(lines: Iterable[str], name: str, skip_invalid: bool,
             skipped: list[TraceError]) -> Iterator[tuple[int, Sample | Event]]:
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield lineno, parse_record(line, name, lineno)
        except TraceError as exc:
            if not skip_invalid:
                raise
            skipped.append(exc)


def parse_record(line: str, name: str = "<trace>", lineno: int = 1) -> Sample | Event:
    """Parse one line into a ``Sample`` or an ``Event``; raise ``TraceError`` naming the line."""
    # orjson decodes a line in a third of the standard library's time, the largest cost of
    # reading a trace. A line it refuses, or whose record the checks refuse, is decoded again
    # by the standard library, whose reading the error messages describe (a NaN named as one,
    # an integer too large for a column named with its digits, which orjson reads as a float).
    try:
        obj = orjson.loads(line)
        if type(obj) is dict:
            return record_from_json(obj)
    except ValueError:  # orjson.JSONDecodeError is one
        pass
    return _parse_strict(line, name, lineno)


def _parse_strict(line: str, name: str, lineno: int) -> Sample | Event:
    try:
        obj = _DECODER.decode(line)
    except ValueError as exc:  # also an integer of more digits than int() takes
        raise TraceError(name, lineno, f"not valid JSON: {exc}") from None
    except RecursionError:
        raise TraceError(name, lineno, "not valid JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise TraceError(name, lineno, f"expected a JSON object, got {type(obj).__name__}")
    try:
        return record_from_json(obj)
    except ValueError as exc:
        raise TraceError(name, lineno, str(exc)) from None


def _reject_constant(token: str) -> Any:
    raise ValueError(f"{token} is not allowed (JSON has no NaN or Infinity)")


# One decoder for every line (``json.loads`` with an argument builds a new one per call).
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_INT_ONLY = {int}  # bool is a subclass of int, but not this type: True is not a counter


def record_from_json(obj: dict[str, Any]) -> Sample | Event:
    """Validate a decoded trace object; ``ValueError`` names the key and the bad value."""
    if "ts" not in obj or obj["ts"] is None:
        raise ValueError("missing required key 'ts'")
    ts = timestamp(obj["ts"])
    device = _int(obj.get("device"), "device", default=0, top=INT32_MAX)
    pid = _int(obj.get("pid"), "pid", default=None, top=INT32_MAX)
    host = _str(obj.get("host"), "host")
    uuid = _str(obj.get("device_uuid"), "device_uuid")
    if "event" in obj:
        name = _str(obj["event"], "event")
        if not name:
            raise ValueError(f"'event' must be a non-empty string, got {name!r}")
        phase = _phase(obj.get("phase")) if obj.get("phase") is not None else None
        rid = obj.get("request_id")
        if rid is not None and not isinstance(rid, (str, int)) or isinstance(rid, bool):
            raise ValueError(f"'request_id' must be a string, got {_show(rid)}")
        rid = None if rid is None else _str(str(rid), "request_id")
        data = {k: v for k, v in obj.items() if k not in _EVENT_FIELDS}
        return Event(ts, name, device, pid, phase, rid, check_data(data) or None, host, uuid)
    counters = list(map(obj.get, SAMPLE_COUNTER_FIELDS))
    # The common case checked in one pass of builtins (a sample line carries up to 14 of
    # them); anything else goes key by key, which names the first bad one.
    present = [v for v in counters if v is not None]
    if not (set(map(type, present)) <= _INT_ONLY
            and (not present or (min(present) >= 0 and max(present) <= INT64_MAX))):
        counters = [_int(obj.get(k), k, default=None, bytes_like=True)
                    for k in SAMPLE_COUNTER_FIELDS]
    named = obj.get("phase", "unknown")
    phase = (PHASE_OF.get(named) if type(named) is str else None) or _phase(named)
    # _make: the tuple built directly, without NamedTuple's keyword-handling __new__
    return Sample._make((ts, device, phase, _str(obj.get("source"), "source"), pid, *counters,
                         host, uuid))


def _number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"'{key}' must be a number, got {_show(value)}")
    try:
        finite = math.isfinite(value)  # an int past float's range raises OverflowError
    except OverflowError:
        finite = False
    if not finite:
        raise ValueError(f"'{key}' must be a finite number of seconds, got {_show(value)}")
    return float(value)


def timestamp(value: Any, key: str = "ts") -> float:
    """A record's time: a number of Unix seconds from 1970 to the end of year 9999, the times a
    store, a page and ``datetime`` can all represent (a trace keeps its own times; one record at
    ``1e12`` or ``-1e300`` would otherwise break every page that shows it)."""
    ts = _number(value, key)
    if not representable(ts):
        raise ValueError(f"'{key}' must be Unix seconds from {MIN_TS_S:.0f} (1970) to "
                         f"{MAX_TS_S:.0f} (9999-12-31), got {_show(value)}")
    return ts


def _int(value: Any, key: str, default: Any, bytes_like: bool = False,
         top: int = INT64_MAX) -> Any:
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer() and not bytes_like:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "a non-negative integer" if bytes_like else "an integer"
        raise ValueError(f"'{key}' must be {kind}, got {_show(value)}")
    if value < 0:
        raise ValueError(f"'{key}' must be >= 0, got {_show(value)}")
    if value > top:
        raise ValueError(f"'{key}' is too large (at most {top}), got {_show(value)}")
    return value


def _str(value: Any, key: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"'{key}' must be a string, got {_show(value)}")
    limit = STR_LIMITS.get(key)
    if limit is not None and len(value) > limit:
        raise ValueError(f"'{key}' is longer than {limit} characters ({len(value)})")
    if "\x00" in value:
        raise ValueError(f"'{key}' holds a NUL character (\\u0000), which PostgreSQL cannot "
                         f"store: {_show(value)}")
    if not is_encodable(value):
        raise ValueError(f"'{key}' is not valid Unicode (a lone surrogate): {_show(value)}")
    return value


def is_encodable(text: str) -> bool:
    """True if ``text`` encodes as UTF-8 (JSON's ``"\\ud800"`` decodes to a lone surrogate,
    which every database driver refuses) and holds no NUL (``"\\u0000"``: SQLite stores it,
    PostgreSQL refuses it in text, so one client's string would fail the writer's batch)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_data(data: dict[str, Any], what: str = "event data",
               max_bytes: int = MAX_DATA_BYTES) -> dict[str, Any]:
    """Bound an event's extra keys (or a post-mortem): nesting at most ``MAX_DATA_DEPTH`` deep,
    at most ``max_bytes`` as JSON, encodable strings and finite numbers. Iterative, so a deep
    value cannot exhaust the stack here; readers get only what passes."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_DATA_DEPTH:
                raise ValueError(f"{what} nests deeper than {MAX_DATA_DEPTH} levels")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for k, v in items:
                if isinstance(k, str) and not is_encodable(k):
                    raise ValueError(f"{what} key {_show(k)} is not valid Unicode or holds a "
                                     "NUL character")
                stack.append((v, depth + 1))
        elif isinstance(value, str) and not is_encodable(value):
            raise ValueError(f"{what} value {_show(value)} is not valid Unicode or holds a "
                             "NUL character")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{what} value {value!r} is not a finite number")
    size = len(json.dumps(data, separators=(",", ":")))
    if size > max_bytes:
        raise ValueError(f"{what} is {size} bytes as JSON; at most {max_bytes}")
    return data


def _show(value: Any) -> str:
    """A bad value for an error message: its repr, cut short (a 400-digit number, a long
    string)."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


def _phase(value: Any) -> Phase:
    if not isinstance(value, str):
        raise ValueError(f"'phase' must be a string, got {value!r}")
    return Phase.parse(value)


# --- writing ---------------------------------------------------------------------------------
def sample_to_json(s: Sample) -> dict[str, Any]:
    out: dict[str, Any] = {"ts": s.ts_s, "device": s.device, "phase": s.phase.value}
    if s.source is not None:
        out["source"] = s.source
    if s.pid is not None:
        out["pid"] = s.pid
    for key, value in zip(SAMPLE_COUNTER_FIELDS, s[5:5 + len(SAMPLE_COUNTER_FIELDS)]):
        if value is not None:
            out[key] = value
    if s.host is not None:
        out["host"] = s.host
    if s.device_uuid is not None:
        out["device_uuid"] = s.device_uuid
    return out


def event_to_json(e: Event) -> dict[str, Any]:
    out: dict[str, Any] = dict(e.data or {})
    out.update({"ts": e.ts_s, "event": e.name, "device": e.device})
    for key, value in (("pid", e.pid), ("request_id", e.request_id), ("host", e.host),
                       ("device_uuid", e.device_uuid)):
        if value is not None:
            out[key] = value
    if e.phase is not None:
        out["phase"] = e.phase.value
    return out


def write_trace(out: IO[str], samples: Iterable[Sample], events: Iterable[Event]) -> int:
    """Write samples and events merged in time order (in any order, held to be sorted);
    returns lines written."""
    return write_sorted_trace(out, sorted(samples, key=_TS), sorted(events, key=_TS))


OnWritten = Callable[[int, float], None]  # told lines written since its last call, the last's time
WRITTEN_EVERY = 1024  # lines between two calls of ``on_written``


def write_sorted_trace(out: IO[str], samples: Iterable[Sample], events: Iterable[Event], *,
                       on_written: OnWritten | None = None) -> int:
    """:func:`write_trace` of samples and events each already in time order (a store's
    cursors: ``vramscope export``), as a stream, whatever their number; a sample before an
    event of the same instant, each kind in its input order.

    ``on_written`` is told of the first line, every ``WRITTEN_EVERY`` lines after it and of
    the last ones: how many, and the time the last of them is at (``export``'s progress)."""
    n = told = 0
    ts_s = 0.0
    for r in heapq.merge(samples, events, key=_TS):  # a tie: the first iterable's first
        obj = event_to_json(r) if type(r) is Event else sample_to_json(r)  # type: ignore[arg-type]
        out.write(json.dumps(obj, separators=(",", ":")) + "\n")
        n += 1
        ts_s = _TS(r)
        if on_written is not None and n % WRITTEN_EVERY == 1:
            on_written(n - told, ts_s)
            told = n
    if on_written is not None and n > told:
        on_written(n - told, ts_s)
    return n
