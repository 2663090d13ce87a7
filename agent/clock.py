"""Injected time (DESIGN.md rule 4): tests never sleep and never patch ``time``.

``Clock`` is the one-method-per-need seam; ``SystemClock`` is the real one, ``FakeClock`` the
fake that lives beside it.
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
