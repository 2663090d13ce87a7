"""Trace format v1 (JSON Lines), a public contract (DESIGN.md, "Trace format v1").

One JSON object per line. A line with an ``"event"`` key is an event; any other is a sample.
Unknown keys are ignored (never an error). Strict by default: the first malformed line raises
:class:`TraceError` with ``FILE:LINE: what is wrong``; ``skip_invalid=True`` keeps the good lines
and counts the bad ones.

Pure functions over text; the CLI and the store do the I/O around them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from typing import IO, Any, NamedTuple

from vramscope.agent.errors import TraceError
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS, Event, Phase, Sample

FORMAT_VERSION = 1
_MAX_INT64 = 2**63 - 1  # the store's BigInteger columns
_EVENT_FIELDS = {"ts", "event", "device", "pid", "phase", "request_id", "host"}


class Trace(NamedTuple):
    samples: list[Sample]
    events: list[Event]
    skipped: list[TraceError]  # empty unless skip_invalid


def read_trace(path: str, *, skip_invalid: bool = False) -> Trace:
    """Read a whole trace file; strict unless ``skip_invalid``."""
    try:
        with open(path, encoding="utf-8") as fh:
            return parse_lines(fh, path, skip_invalid=skip_invalid)
    except OSError as exc:
        raise TraceError(path, 0, f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(path, 0, f"not UTF-8: {exc.reason}") from None


def parse_lines(lines: Iterable[str], name: str = "<trace>", *,
                skip_invalid: bool = False) -> Trace:
    samples: list[Sample] = []
    events: list[Event] = []
    skipped: list[TraceError] = []
    for _lineno, record in _records(lines, name, skip_invalid, skipped):
        (events if isinstance(record, Event) else samples).append(record)
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
    try:
        obj = json.loads(line, parse_constant=_reject_constant)
    except ValueError as exc:
        raise TraceError(name, lineno, f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise TraceError(name, lineno, f"expected a JSON object, got {type(obj).__name__}")
    try:
        return record_from_json(obj)
    except ValueError as exc:
        raise TraceError(name, lineno, str(exc)) from None


def _reject_constant(token: str) -> Any:
    raise ValueError(f"{token} is not allowed (JSON has no NaN or Infinity)")


def record_from_json(obj: dict[str, Any]) -> Sample | Event:
    """Validate a decoded trace object; ``ValueError`` names the key and the bad value."""
    if "ts" not in obj or obj["ts"] is None:
        raise ValueError("missing required key 'ts'")
    ts = _number(obj["ts"], "ts")
    device = _int(obj.get("device"), "device", default=0)
    pid = _int(obj.get("pid"), "pid", default=None)
    host = _str(obj.get("host"), "host")
    if "event" in obj:
        name = obj["event"]
        if not isinstance(name, str) or not name:
            raise ValueError(f"'event' must be a non-empty string, got {name!r}")
        phase = _phase(obj.get("phase")) if obj.get("phase") is not None else None
        rid = obj.get("request_id")
        if rid is not None and not isinstance(rid, (str, int)):
            raise ValueError(f"'request_id' must be a string, got {rid!r}")
        data = {k: v for k, v in obj.items() if k not in _EVENT_FIELDS}
        return Event(ts, name, device, pid, phase, None if rid is None else str(rid),
                     data or None, host)
    counters = [_int(obj.get(k), k, default=None, bytes_like=True) for k in SAMPLE_COUNTER_FIELDS]
    phase = _phase(obj.get("phase", "unknown"))
    return Sample(ts, device, phase, _str(obj.get("source"), "source"), pid, *counters, host=host)


def _number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"'{key}' must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"'{key}' must be finite, got {value!r}")
    return float(value)


def _int(value: Any, key: str, default: Any, bytes_like: bool = False) -> Any:
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer() and not bytes_like:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "a non-negative integer" if bytes_like else "an integer"
        raise ValueError(f"'{key}' must be {kind}, got {value!r}")
    if value < 0:
        raise ValueError(f"'{key}' must be >= 0, got {value!r}")
    if value > _MAX_INT64:
        raise ValueError(f"'{key}' is too large (> 2**63 - 1), got {value!r}")
    return value


def _str(value: Any, key: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ValueError(f"'{key}' must be a string, got {value!r}")


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
    return out


def event_to_json(e: Event) -> dict[str, Any]:
    out: dict[str, Any] = dict(e.data or {})
    out.update({"ts": e.ts_s, "event": e.name, "device": e.device})
    for key, value in (("pid", e.pid), ("request_id", e.request_id), ("host", e.host)):
        if value is not None:
            out[key] = value
    if e.phase is not None:
        out["phase"] = e.phase.value
    return out


def write_trace(out: IO[str], samples: Iterable[Sample], events: Iterable[Event]) -> int:
    """Write samples and events merged in time order; returns lines written."""
    tagged = [(s.ts_s, 0, sample_to_json(s)) for s in samples]
    tagged += [(e.ts_s, 1, event_to_json(e)) for e in events]
    tagged.sort(key=lambda t: (t[0], t[1]))
    for _, _, obj in tagged:
        out.write(json.dumps(obj, separators=(",", ":")) + "\n")
    return len(tagged)
