"""The lower envelope of a never-idle process's memory: the least allocated per short window.

A server that never idles gives no exact floor, and its floor estimated with requests in flight
(less an online estimate of what each holds) wanders gigabytes from point to point: growth that
fills the device in minutes also lifts that estimate, which then hides it. The least memory
over each ``ENVELOPE_WINDOW_S`` window rises with such growth point by point, and moves with
the load too: what the requests in flight hold, which grows with their number and, for a
per-request KV cache, with their ages (each request's cache fills as it decodes). So each point
carries the requests in flight at its least moment and the sum of their ages, for the growth
model to fit beside the time (:func:`growth.rate_interval_beside`).

Its points are read only while the process is busy throughout: a window with an idle moment
has an exact floor, which the other routes read, and the requests in flight after it are all
young (their caches grow together for a request's life: a burst's rise, not growth), so the
points before it are dropped (``EnvelopePoint.idle``).
"""

from __future__ import annotations

from typing import NamedTuple

from vramscope.agent.records import Event, Sample

ENVELOPE_WINDOW_S = 15.0  # the fine floor's windows (fast_growth.FAST_FINE_FLOOR_S)


class EnvelopePoint(NamedTuple):
    """One window's least memory, with the requests in flight at that moment."""

    ts_s: float  # the window's end
    value: int  # the least allocated bytes in the window
    in_flight: int  # requests in flight at that moment
    age_s: float  # the sum of their ages then (seconds)
    idle: bool  # the window had a moment with no request in flight


class EnvelopeTracker:
    """Per process: request start times (by id) and the current window's least sample."""

    def __init__(self, window_s: float = ENVELOPE_WINDOW_S) -> None:
        self.window_s = window_s
        self._started: dict[str, float] = {}  # request id -> its start
        self._anonymous = 0  # requests in flight with no id (no age known: counted as 0 s)
        self._window: int | None = None
        self._least: EnvelopePoint | None = None
        self._idle = False

    @property
    def in_flight(self) -> int:
        return len(self._started) + self._anonymous

    def on_event(self, e: Event) -> None:
        rid = e.request_id
        if e.name == "request_start":
            if rid is None:
                self._anonymous += 1
            else:
                self._started[rid] = e.ts_s
        elif e.name == "request_end":
            if rid is not None and rid in self._started:
                del self._started[rid]
            elif self._anonymous:
                self._anonymous -= 1

    def update(self, s: Sample) -> EnvelopePoint | None:
        """Feed a sample with allocated memory; returns the window that closed, if any."""
        value = s.allocated_bytes
        if value is None:
            return None
        ts_s = s.ts_s
        window = int(ts_s // self.window_s)
        done = None
        if window != self._window:
            done = self._close()
            self._window, self._least, self._idle = window, None, False
        n = self.in_flight
        if n == 0:
            self._idle = True
        if self._least is None or value < self._least.value:
            ages = sum(ts_s - t for t in self._started.values())
            self._least = EnvelopePoint(0.0, value, n, ages, False)
        return done

    def _close(self) -> EnvelopePoint | None:
        if self._window is None or self._least is None:
            return None
        return self._least._replace(ts_s=(self._window + 1) * self.window_s, idle=self._idle)

    def clear(self) -> None:
        """A reload: the window under way is not the new model's."""
        self._window, self._least, self._idle = None, None, False
