"""Idle-floor points: the memory left between requests, one point per floor window.

The floor of a window is, in order of trust (``FloorTracker.last_load`` says which it was):
the least allocated memory while no request was in flight (idle: exact); the least residual
after the KV blocks in use were taken off (``RESIDUAL``: the pool's own figures); without KV
figures, the floor after a request ended at the moment the fewest requests were still in
flight (``RESIDUAL + n``: their memory is estimated, or not taken off at all), or the window's
least when as few requests or fewer were in flight then (a static batch's wave: the moment the
last one ended holds the next one's prefill, a few seconds later only its KV). A minimum, not a
mean: a KV sawtooth or a prefill spike lifts the mean, not the floor. The leak detector
(``vramscope.agent.analysis.leaks``) makes its trend of these points.
"""

from __future__ import annotations

from collections.abc import Iterable

from vramscope.agent.analysis.merge import merged
from vramscope.agent.records import Event, Phase, Sample

FLOOR_WINDOW_S = 60.0  # default of alerts.leak_floor_window_s
RESIDUAL = 1  # FloorTracker.last_load of a floor less the KV blocks in use
_BUSY = frozenset({Phase.PREFILL, Phase.DECODE, Phase.SETUP})


class FloorTracker:
    """Turns samples (and request events) into idle-floor points, one per window.

    Per sample it only keeps three running minima (while idle, right after a request ended,
    any), each a value and its time; the window's point is chosen when the window closes.
    """

    def __init__(self, window_s: float = FLOOR_WINDOW_S) -> None:
        self.window_s = window_s
        self.in_flight = 0
        self._start: float | None = None
        self._end = 0.0  # _start + window_s
        self._idle: int | None = None  # the least value while idle, and when
        self._idle_ts = 0.0
        self._after_end: int | None = None
        self._after_end_ts = 0.0
        self._any: int | None = None
        self._any_ts = 0.0
        self._any_load = 0
        # the window's least while a prefill ran, apart where prefills are not the floor
        # (update's between_prefills): the point only where no other moment was sampled, read
        # with the requests then in flight (their activations: estimated, not taken off)
        self._prefill_any: int | None = None
        self._prefill_any_ts = 0.0
        self._prefill_any_load = 0
        self._uses_allocated = False
        self._ended = False  # a request ended since the last sample
        self._explained = False  # the window's samples had KV bytes taken off (residual)
        self._by_load = False  # no KV figures: the requests in flight tag each moment's floor
        self._after_end_load = 0  # requests still in flight at that moment
        # how the last point was read: 0 idle (exact), RESIDUAL less the KV blocks in use (the
        # pool's figures), RESIDUAL + n after a request with n still in flight and no KV
        # figures (their memory estimated, or not taken off): the lower, the truer
        self.last_load = 0

    def on_event(self, e: Event) -> None:
        if e.name == "request_start":
            self.in_flight += 1
        elif e.name == "request_end":
            self.in_flight = max(0, self.in_flight - 1)
            self._ended = True

    def update(self, s: Sample, explained: int = 0, anytime: bool = True,
               between_prefills: bool = False) -> tuple[float, int] | None:
        """Feed a sample; returns the finished window's floor point ``(ts_s, bytes)``, if any.
        ``explained``: bytes the server's load holds now (KV blocks in use), taken off the
        sample's memory (the residual floor); ``anytime``: it explains the KV of every request,
        so the window's least residual at any moment is its floor (else the floor after a
        request stays the point, less what the requests still in flight hold);
        ``between_prefills``: a prefill's activations are in allocated memory beside the KV
        taken off (a per-request cache, less its tokens), so the window's least is read from
        its samples outside the prefill phase; a window of prefills only (as the load climbs,
        prefills overlap more of the time) gives its least as a floor read with the requests
        then in flight (``last_load`` ``RESIDUAL + n``), whose load the trend fits out."""
        value = s.allocated_bytes
        if value is not None:
            self._uses_allocated = True
        elif self._uses_allocated or (value := s.device_used_bytes) is None:
            return None
        value -= explained
        self._by_load = not anytime
        if explained and anytime:
            self._explained = True
        ts_s, point = s.ts_s, None
        if self._start is None or ts_s >= self._end:
            point = self._next_window(ts_s)
        phase = s.phase
        # setup (a KV pool being allocated and warmed up) is never the floor between requests;
        # nor is a moment a request is still in flight by the request events, whatever the
        # phase says (one thread's request ending while another's runs)
        idle = self.in_flight == 0 and phase not in _BUSY
        if idle and (self._idle is None or value < self._idle):
            self._idle, self._idle_ts = value, ts_s
        if self._ended:
            self._ended = False
            # the floor after a request: at the moment with the fewest requests still in flight
            # (the least estimated), then the least value
            # without KV figures the requests still in flight hold memory no figure shows (an
            # estimate of it taken off, or not): the fewer, the truer; with them, none
            load = RESIDUAL if anytime else RESIDUAL + self.in_flight
            if self._after_end is None or (load, value) < (self._after_end_load,
                                                          self._after_end):
                self._after_end, self._after_end_ts = value, ts_s
                self._after_end_load = load
        if between_prefills and anytime and phase is Phase.PREFILL:
            if self._prefill_any is None or value < self._prefill_any:
                self._prefill_any, self._prefill_any_ts = value, ts_s
                self._prefill_any_load = RESIDUAL + self.in_flight
        elif self._any is None or value < self._any:
            self._any, self._any_ts = value, ts_s
            self._any_load = RESIDUAL if anytime else RESIDUAL + self.in_flight
        return point

    def _next_window(self, ts_s: float) -> tuple[float, int] | None:
        """Open the first window, or close the current one: its point, and the next window."""
        if self._start is None:
            self._start, self._end = ts_s, ts_s + self.window_s
            return None
        point: tuple[float, int] | None
        self.last_load = 0
        if self._any is None and self._prefill_any is not None:  # only prefills were sampled
            self._any, self._any_ts = self._prefill_any, self._prefill_any_ts
            self._any_load = self._prefill_any_load
        if self._idle is not None:
            point = (self._idle_ts, self._idle)
        elif self._after_end is not None and not self._explained and (
                not self._by_load
                or (self._after_end_load, self._after_end) <= (self._any_load, self._any or 0)):
            point = (self._after_end_ts, self._after_end)
            self.last_load = self._after_end_load
        else:  # the residual floor has the KV taken off: its least is the floor, any time;
            # without KV figures, the window's least when as few requests were in flight then
            # as after a request ended (or fewer): a static batch's next wave, its prefill
            # over, holds less than the moment its predecessor ended (its prefill running)
            point = None if self._any is None else (self._any_ts, self._any)
            self.last_load = self._any_load  # without KV figures: less an estimate
        self._idle = self._after_end = self._any = self._prefill_any = None
        self._explained = False
        self._start += self.window_s * ((ts_s - self._start) // self.window_s)
        self._end = self._start + self.window_s
        return point


def idle_floor(samples: Iterable[Sample], events: Iterable[Event] = (),
               device: int | None = None,
               window_s: float = FLOOR_WINDOW_S) -> list[tuple[float, int]]:
    """The idle-floor points ``(ts_s, bytes)`` of one device (the first one seen if ``None``)."""
    tracker, out = FloorTracker(window_s), []
    for rec in merged(samples, events):
        if device is None:
            device = rec.device
        if rec.device != device:
            continue
        if isinstance(rec, Event):
            tracker.on_event(rec)
        else:
            point = tracker.update(rec)
            if point is not None:
                out.append(point)
    return out
