"""Injected time (docs/architecture.md, rule 4): tests never sleep and never patch ``time``.

``Clock`` is the one-method-per-need seam; ``SystemClock`` is the real one, ``FakeClock`` the
fake that lives beside it. :class:`Schedule` is the one drift-free periodic deadline, shared by
the agent's loop and the hooks' sampler (both import this module: it is part of the core).
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def time_s(self) -> float:
        """Wall-clock Unix time in seconds (for timestamps)."""

    def monotonic_s(self) -> float:
        """Monotonic seconds (for intervals and loop scheduling)."""

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds`` (or until woken, for the fake)."""


class SystemClock:
    def time_s(self) -> float:
        return time.time()

    def monotonic_s(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class FakeClock:
    """A clock that only moves when told to. ``sleep`` advances it instead of waiting."""

    def __init__(self, start_s: float = 1_700_000_000.0) -> None:
        self._now_s = start_s
        self._mono_s = 0.0
        self._lock = threading.Lock()

    def time_s(self) -> float:
        with self._lock:
            return self._now_s

    def monotonic_s(self) -> float:
        with self._lock:
            return self._mono_s

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards: {seconds}")
        with self._lock:
            self._now_s += seconds
            self._mono_s += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))


SYSTEM_CLOCK = SystemClock()


_GRID_SLACK = 1e-6


def _check_interval(interval_s: float) -> float:
    if not interval_s > 0:
        raise ValueError(f"interval must be > 0 s, got {interval_s!r}")
    return interval_s


class Schedule:
    """A drift-free periodic deadline on the monotonic clock.

    ``next += interval``, as ``collect_in_background`` in nvitop: a run that starts late does
    not push the later ones back; one late by more than a whole interval skips the deadlines it
    missed (counted in ``missed``) instead of bursting to catch up.

    ``due(now)`` checks and advances in one step. A task that sets its own interval as it runs
    (the hooks' snapshot source backs off) checks ``is_due(now)``, runs, then calls
    ``advance(now, interval_s)`` with the interval it now wants.
    """

    def __init__(self, interval_s: float, start_s: float) -> None:
        self.interval_s = _check_interval(interval_s)
        self.next_s = start_s
        self.missed = 0

    def is_due(self, now_s: float) -> bool:
        return now_s >= self.next_s

    def advance(self, now_s: float, interval_s: float | None = None) -> None:
        """The next deadline: one interval on, past ``now_s`` by whole intervals."""
        if interval_s is not None:
            self.interval_s = _check_interval(interval_s)
        self.next_s += self.interval_s
        # late by more than an interval: skip, don't burst. A deadline within a millionth of an
        # interval of now is now's (sums of float intervals land a hair off the grid).
        behind = (now_s - self.next_s) / self.interval_s + _GRID_SLACK
        if behind >= 0:
            skipped = int(behind) + 1
            self.next_s += skipped * self.interval_s
            self.missed += skipped

    def due(self, now_s: float) -> bool:
        """True (and advanced) when the deadline has passed."""
        if not self.is_due(now_s):
            return False
        self.advance(now_s)
        return True
