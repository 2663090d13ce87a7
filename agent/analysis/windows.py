"""Analysis windows chosen from the data: the floor window, the trend window and the warm-up.

A floor point is the least memory of a window that holds at least one trough of the server's
own cycle, a peak the top of at least one cycle; how long a cycle is depends on the server, so
the windows are derived causally from the recording: ``dt`` (the median interval between
allocator samples) and ``cycle`` (the median time between idle entries, else request ends, ends
within ``END_BURST_S`` being one batch's, else prefill entries). ``floor = max(FLOOR_SAMPLES ×
dt, cycle)``, ``trend = max(TREND_SAMPLES × dt, 2 × cycle)``, each clamped to
``[MIN_WINDOW_S, the alerts.* setting]``. The windows only say where a point is read; a verdict's
time scales are durations (docs/analysis.md, "Windows from the data"). The choice is made once
per device, after ``MIN_SAMPLES`` samples and ``MIN_CYCLES`` cycles, or at the latest after
``2 × alerts.leak_floor_window_s`` of records.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from vramscope.agent.analysis.stats import median
from vramscope.agent.analysis.thresholds import Thresholds
from vramscope.agent.records import Event, Phase, Sample

MIN_WINDOW_S = 0.5
FLOOR_SAMPLES = 4
TREND_SAMPLES = 8
MIN_SAMPLES = 16
MIN_CYCLES = 4
MAX_GAPS = 64  # a median over the first gaps is enough; bounded memory
END_BURST_S = 0.05  # request ends closer than this are one batch ending
ENDS_AFTER_S = 30.0  # request ends are a cycle only when this long showed no idle cycle


class Windows(NamedTuple):
    floor_s: float
    trend_s: float
    warmup_s: float
    dt_s: float | None  # the sampling interval seen (None: too few samples)
    cycle_s: float | None  # the cycle seen (None: none)
    cycle_from: str  # "idle entries", "prefill entries" or "none"

    def describe(self) -> str:
        dt = "unknown" if self.dt_s is None else f"{self.dt_s:.3g} s"
        cycle = "no cycle seen" if self.cycle_s is None else \
            f"a cycle of {self.cycle_s:.3g} s ({self.cycle_from})"
        return (f"windows: floor {self.floor_s:.3g} s, trend {self.trend_s:.3g} s, warm-up "
                f"{self.warmup_s:.3g} s (samples every {dt}, {cycle})")

    def to_json(self) -> dict[str, Any]:
        """The documented form (``leak.windows`` of an analysis document and of a verdict)."""
        return {"floor_s": self.floor_s, "trend_s": self.trend_s, "warmup_s": self.warmup_s,
                "sample_interval_s": self.dt_s, "cycle_s": self.cycle_s,
                "cycle_from": self.cycle_from}


def windows_json(w: Windows | None) -> dict[str, Any] | None:
    """:meth:`Windows.to_json`, or None where no windows were chosen (too few records)."""
    return None if w is None else w.to_json()


def windows_from_json(doc: Any) -> Windows | None:
    """:meth:`Windows.to_json` back (as a stored verdict keeps it); None for a row written
    before verdicts kept their windows, or for one that is not a windows object."""
    if not isinstance(doc, dict):
        return None
    try:
        return Windows(float(doc["floor_s"]), float(doc["trend_s"]), float(doc["warmup_s"]),
                       _seconds(doc.get("sample_interval_s")), _seconds(doc.get("cycle_s")),
                       str(doc.get("cycle_from", "none")))
    except (KeyError, TypeError, ValueError):
        return None


def _seconds(value: Any) -> float | None:
    return None if value is None else float(value)


def choose(t: Thresholds, dt_s: float | None, cycle_s: float | None,
           cycle_from: str = "none") -> Windows:
    """The windows for a sampling interval and a cycle (pure; see the module docstring)."""
    def clamp(value: float, top: float) -> float:
        return max(min(MIN_WINDOW_S, top), min(value, top))

    dt = dt_s or 0.0
    floor_top, trend_top = t.leak_floor_window_s, t.trend_window_s
    if cycle_s is None:  # a cycle not seen in the first minutes: it is long, or none
        floor, trend = floor_top, trend_top
    else:
        floor = clamp(max(FLOOR_SAMPLES * dt, cycle_s), floor_top)
        trend = clamp(max(TREND_SAMPLES * dt, 2 * cycle_s), trend_top)
    return Windows(floor, trend, t.leak_warmup_s, dt_s, cycle_s, cycle_from if cycle_s else "none")


class WindowChooser:
    """Watches a device's first records and decides its windows once (causal)."""

    def __init__(self, thresholds: Thresholds) -> None:
        self.t = thresholds
        self.windows: Windows | None = None
        self._first_ts: float | None = None
        self._last_sample_ts: float | None = None
        self._dts: list[float] = []
        self._in_flight = 0
        self._idle_marks: list[float] = []
        self._end_marks: list[float] = []
        self._prefill_marks: list[float] = []
        self._last_phase: Phase | None = None

    @property
    def first_ts(self) -> float | None:
        return self._first_ts

    def on_event(self, e: Event) -> None:
        if self.windows is not None:
            return
        if e.name == "request_start":
            self._in_flight += 1
        elif e.name == "request_end" and self._in_flight > 0:
            self._in_flight -= 1
            if self._in_flight == 0 and len(self._idle_marks) <= MAX_GAPS:
                self._idle_marks.append(e.ts_s)
            # a request's end is a trough of a never-idle server (the floor after a request);
            # requests ending together (one batch) are one trough
            ends = self._end_marks
            if (not ends or e.ts_s - ends[-1] > END_BURST_S) and len(ends) <= MAX_GAPS:
                ends.append(e.ts_s)

    def update(self, s: Sample) -> Windows | None:
        """Feed a sample with memory figures; the windows once decided (then always them)."""
        if self.windows is not None:
            return self.windows
        ts = s.ts_s
        if self._first_ts is None:
            self._first_ts = ts
        if self._last_sample_ts is not None and ts > self._last_sample_ts \
                and len(self._dts) <= MAX_GAPS:
            self._dts.append(ts - self._last_sample_ts)
        self._last_sample_ts = ts
        if s.phase is Phase.PREFILL and self._last_phase is not Phase.PREFILL \
                and len(self._prefill_marks) <= MAX_GAPS:
            self._prefill_marks.append(ts)
        self._last_phase = s.phase
        cycle, source = self._cycle(ts - self._first_ts)
        enough = len(self._dts) >= MIN_SAMPLES and cycle is not None
        if enough or ts - self._first_ts >= 2 * self.t.leak_floor_window_s:
            dt = median(self._dts) if len(self._dts) >= 2 else None
            self.windows = choose(self.t, dt, cycle, source)
        return self.windows

    def _cycle(self, elapsed_s: float | None = None) -> tuple[float | None, str]:
        # Request ends are trusted only after ENDS_AFTER_S without enough idle entries: the
        # requests of one batch end apart from each other, and its idle entry comes later.
        ends_ok = elapsed_s is None or elapsed_s >= min(ENDS_AFTER_S,
                                                        2 * self.t.leak_floor_window_s)
        for marks, name in ((self._idle_marks, "idle entries"),
                            (self._end_marks if ends_ok else [], "request ends"),
                            (self._prefill_marks, "prefill entries")):
            if len(marks) > MIN_CYCLES:
                return median([b - a for a, b in zip(marks, marks[1:])]), name
        return None, "none"

    def decide_now(self) -> Windows:
        """The windows from what has been seen so far (too many records to wait longer)."""
        if self.windows is None:
            cycle, source = self._cycle()
            dt = median(self._dts) if len(self._dts) >= 2 else None
            self.windows = choose(self.t, dt, cycle, source)
        return self.windows
