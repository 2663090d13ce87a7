"""The progress line of the commands that can take minutes: ``import``, ``analyze FILE``,
``export``, ``replay`` and ``db upgrade``.

One line on stderr, redrawn at most every ``REDRAW_S`` (done of total, rate, time left), then one
line of what was done. Only on a terminal: piped, with ``--json``, or when the command's own
output goes to the terminal, nothing is written.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import IO

from vramscope.agent.clock import SYSTEM_CLOCK, Clock

BYTES = "bytes"  # the unit of a file read: shown as B, KiB, MiB, GiB
REDRAW_S = 0.25  # at most four redraws a second: the line stays readable and costs nothing
RATE_AFTER_S = 1.0  # a rate (and the time left) from less than a second of work is noise
DEFAULT_COLUMNS = 80  # a terminal that does not say its width (a fresh pseudo-terminal)


class Progress:
    """Counts work done (``advance``) and, when given a terminal ``stream``, shows it.

    ``unit`` is :data:`BYTES` or a plural noun (``"records"``, ``"migrations"``); ``total`` in
    that unit when known; ``verb`` says what was done in the closing line (``read``,
    ``written``, ``sent``, ``run``). Without a stream it only counts (:func:`shown` gives one
    when the line must stay quiet), so the commands call it the same way in both cases.

    A ``with`` block draws the first line on entry and, on leaving, the closing line, or, when
    the block raised, erases the line so that the error is printed on a clean one."""

    def __init__(self, label: str, unit: str, total: float | None = None, *, verb: str,
                 stream: IO[str] | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        self.label = label
        self.unit = unit
        self.total = total
        self.verb = verb
        self.done = 0.0
        self.fraction: float | None = None  # how far, when not done / total (export: by time)
        self.busy = ""  # what the command does now that the count cannot show
        self._stream = stream
        self._clock = clock
        self._start_s = clock.monotonic_s()
        self._next_draw_s = self._start_s
        self._shown = 0  # characters of the line now on the terminal
        self._columns = _columns(stream)

    def __enter__(self) -> Progress:
        self._draw(self._clock.monotonic_s())
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.clear()

    def advance(self, amount: float, *, fraction: float | None = None) -> None:
        """``amount`` more done (and, for work measured otherwise than by its count, how far
        it is as a ``fraction`` of the whole); redraws when the last draw is ``REDRAW_S``
        old."""
        self.done += amount
        if fraction is not None:
            self.fraction = fraction
        if self._stream is not None:
            now_s = self._clock.monotonic_s()
            if now_s >= self._next_draw_s:
                self._draw(now_s)

    def stage(self, busy: str) -> None:
        """Say what the command is doing past what is counted (``storing verdicts and
        alerts`` once a file is read; the migration now running), drawn at once."""
        self.busy = busy
        if self._stream is not None:
            self._draw(self._clock.monotonic_s())

    def clear(self) -> None:
        """Erase the line (before another message on stderr, or an error); the next
        ``advance`` draws it again."""
        if self._stream is not None and self._shown:
            self._write("\r" + " " * self._shown + "\r")
            self._shown = 0

    def finish(self) -> None:
        """Replace the line by the closing one: what was done, in how long, how fast."""
        if self._stream is None:
            return
        self._put(closing_line(self, self._clock.monotonic_s() - self._start_s))
        self._write("\n")
        self._shown = 0

    def _draw(self, now_s: float) -> None:
        if self._stream is None:
            return
        self._next_draw_s = now_s + REDRAW_S
        self._put(progress_line(self, now_s - self._start_s))

    def _put(self, line: str) -> None:
        line = line[:self._columns - 1]  # a wrapped line cannot be redrawn by a carriage return
        self._write("\r" + line + " " * max(0, self._shown - len(line)))
        self._shown = len(line)

    def _write(self, text: str) -> None:
        assert self._stream is not None
        self._stream.write(text)
        self._stream.flush()


def shown(label: str, unit: str, total: float | None = None, *, verb: str,
          quiet: bool = False, output: IO[str] | None = None, stream: IO[str] | None = None,
          clock: Clock = SYSTEM_CLOCK) -> Progress:
    """A :class:`Progress` that draws on ``stream`` (stderr) when it is a terminal, unless
    ``quiet`` (``--json``) or the command writes its ``output`` to a terminal too; else one that
    only counts."""
    stream = sys.stderr if stream is None else stream
    visible = (not quiet and _is_terminal(stream)
               and not (output is not None and _is_terminal(output)))
    return Progress(label, unit, total, verb=verb, stream=stream if visible else None,
                    clock=clock)


def file_sizes(paths: Iterable[str]) -> int | None:
    """The bytes of the files together (a gzip file's compressed size: what is read), or None
    when one cannot be measured: the reader reports that file, with its own message."""
    try:
        return sum(os.path.getsize(p) for p in paths)
    except OSError:
        return None


def progress_line(p: Progress, elapsed_s: float) -> str:
    """``import: 120.0 MiB of 252.0 MiB (47%), 1.4 MiB/s, 1m34s left``."""
    fraction = p.fraction
    if fraction is None and p.total:
        fraction = p.done / p.total
    if p.total is None:
        text = f"{p.label}: {amount(p.done, p.unit)}"
    elif p.unit == BYTES:
        text = f"{p.label}: {amount(p.done, p.unit)} of {amount(p.total, p.unit)}"
    else:
        text = f"{p.label}: {p.done:,.0f} of {amount(p.total, p.unit)}"
    if fraction is not None:
        fraction = min(1.0, max(0.0, fraction))
        text += f" ({int(fraction * 100)}%)"
    if elapsed_s >= RATE_AFTER_S:
        text += f", {rate(p.done / elapsed_s, p.unit)}"
        if fraction is not None and 0 < fraction < 1:  # nothing yet, or all: none to say
            text += f", {duration(elapsed_s * (1 - fraction) / fraction)} left"
    if p.busy:
        text += f"; {p.busy}"
    return text


def closing_line(p: Progress, elapsed_s: float) -> str:
    """``import: 252.0 MiB read in 3m02s, 1.4 MiB/s``."""
    text = f"{p.label}: {amount(p.done, p.unit)} {p.verb} in {duration(elapsed_s)}"
    if elapsed_s > 0:
        text += f", {rate(p.done / elapsed_s, p.unit)}"
    return text


def amount(n: float, unit: str) -> str:
    """``512 B``, ``48.3 KiB``, ``252.0 MiB``; ``1,234,567 records``."""
    if unit != BYTES:
        return f"{n:,.0f} {unit[:-1] if n == 1 else unit}"  # 1 record, 2 records
    if n < 1024:
        return f"{n:.0f} B"
    value, prefix = n / 1024, "KiB"
    for bigger in ("MiB", "GiB"):
        if value < 1024:
            break
        value, prefix = value / 1024, bigger
    return f"{value:.1f} {prefix}"


def rate(per_s: float, unit: str) -> str:
    """``1.4 MiB/s``; ``98,765 records/s``, ``0.5 migrations/s``."""
    if unit == BYTES:
        return f"{amount(per_s, unit)}/s"
    return f"{per_s:,.1f} {unit}/s" if per_s < 10 else f"{per_s:,.0f} {unit}/s"


def duration(s: float) -> str:
    """``0.4s``, ``42s``, ``3m02s``, ``1h05m``."""
    if s < 10:
        return f"{s:.1f}s"
    whole = round(s)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole // 60 % 60:02d}m"


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False


def _columns(stream: IO[str] | None) -> int:
    try:
        columns = os.get_terminal_size(stream.fileno()).columns if stream else 0
    except (AttributeError, ValueError, OSError):
        columns = 0
    return columns or DEFAULT_COLUMNS
