"""Query-parameter parsing: every bad value becomes a 400 that names the parameter.

Handlers never call ``float(request.args[...])`` themselves; an unparsable, non-finite or
out-of-range value is the client's mistake and must never surface as a 500.
"""

from __future__ import annotations

import math
from typing import overload

from flask import request
from vramscope.dashboard.errors import BadParameter

MAX_POINTS_LIMIT = 10_000
DEFAULT_MAX_POINTS = 2_000


def _raw(name: str) -> str | None:
    value = request.args.get(name)
    return None if value is None or value == "" else value


@overload
def number(name: str, default: float, *, low: float | None = None,
           high: float | None = None) -> float: ...


@overload
def number(name: str, default: None = None, *, low: float | None = None,
           high: float | None = None) -> float | None: ...


def number(name: str, default: float | None = None, *, low: float | None = None,
           high: float | None = None) -> float | None:
    text = _raw(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise BadParameter(name, f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise BadParameter(name, f"expected a finite number, got {text!r}")
    _check_range(name, value, low, high)
    return value


@overload
def integer(name: str, default: int, *, low: int | None = None,
            high: int | None = None) -> int: ...


@overload
def integer(name: str, default: None = None, *, low: int | None = None,
            high: int | None = None) -> int | None: ...


def integer(name: str, default: int | None = None, *, low: int | None = None,
            high: int | None = None) -> int | None:
    text = _raw(name)
    if text is None:
        return default
    try:
        value = int(text, 10)
    except ValueError:
        raise BadParameter(name, f"expected an integer, got {text!r}") from None
    _check_range(name, value, low, high)
    return value


def boolean(name: str, default: bool = False) -> bool:
    text = _raw(name)
    if text is None:
        return default
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise BadParameter(name, f"expected true or false, got {text!r}")


def text(name: str, default: str | None = None, *, max_len: int = 255) -> str | None:
    value = _raw(name)
    if value is None:
        return default
    if len(value) > max_len or "\x00" in value:
        raise BadParameter(name, f"expected at most {max_len} characters of text")
    return value


def choices(name: str, allowed: tuple[str, ...], default: tuple[str, ...]) -> tuple[str, ...]:
    """A comma-separated subset of ``allowed``."""
    value = _raw(name)
    if value is None:
        return default
    picked = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [v for v in picked if v not in allowed]
    if bad or not picked:
        raise BadParameter(name, f"unknown value(s) {bad or [value]}; allowed: "
                                 f"{', '.join(allowed)}")
    return picked


MAX_SPAN_S = 366 * 86400.0


def time_window(default_span_s: float, latest_s: float | None) -> tuple[float, float]:
    """``start`` and ``end`` (Unix seconds); ``end`` defaults to the newest sample and
    ``start`` to ``end`` minus ``span`` (seconds, default ``default_span_s``)."""
    default_span_s = number("span", default_span_s, low=1, high=MAX_SPAN_S)
    end = number("end", low=0, high=1e11)
    start = number("start", low=0, high=1e11)
    if end is None:
        end = latest_s if latest_s is not None else (start or 0.0) + default_span_s
        if start is not None and end <= start:
            end = start + default_span_s
    if start is None:
        start = end - default_span_s
    if not end > start:
        raise BadParameter("end", f"must be after start ({start:g}), got {end:g}")
    return start, end


def _check_range(name: str, value: float, low: float | None, high: float | None) -> None:
    if low is not None and value < low:
        raise BadParameter(name, f"must be >= {low:g}, got {value:g}")
    if high is not None and value > high:
        raise BadParameter(name, f"must be <= {high:g}, got {value:g}")
