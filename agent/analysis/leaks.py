"""Leak detection on the idle floor: is the memory left over between requests still rising?

The *idle floor* is one point per floor window (one cycle of the server, at most
``alerts.leak_floor_window_s``; ``vramscope.agent.analysis.windows``): the least allocated
memory seen in that window while no request was in flight (phase ``idle``, or no request open by
the request events); where the server is never idle, the least of the first samples after a
request ended (the floor after each request); without request events either, the least of the
window. A minimum, not a mean: a KV sawtooth or a prefill spike lifts the mean but not the floor.

Verdicts speak on durations, not on counts of cycles (a fast cycle gives more floor points, never
an earlier verdict):

- the first ``alerts.leak_warmup_s`` of a process (and after a model reload: memory falling
  below ``RELOAD_RATIO`` of the settled floor) are its warm-up, never its floor; the answer
  becomes the new warm-up's once the reload is confirmed (memory back to that share, or
  ``RELOAD_CONFIRM_S`` of samples after the fall): a server shutting down frees its memory too,
  and its last answer stays the one from before;
- the trend is fitted on *trend points*, one per ``alerts.leak_horizon_s / HORIZON_POINTS``
  (a minute by default): the least floor point of that bin, then the least of the last
  ``ROLLING_POINTS`` bins, so that a sawtooth slower than one bin still shows its trough in every
  point (the Mann–Kendall correction accounts for the autocorrelation this adds);
- until ``alerts.leak_min_span_s`` of trend points exist after the warm-up the answer is
  ``insufficient_data``, with what is missing ("12.0 more min of idle floor"), never "no leak"
  and never an alert;
- where the server idled in the last ``IDLE_RECENT_S``, its idle floors are the trend; where
  they are too few for a verdict (a server that idles too rarely), every floor point of the
  horizon is, idle or after a request, as on a server that is never idle (``_busy_floor``).

The detector is causal and incremental (the live agent and ``analyze`` run the same code). Every
``EVAL_EVERY_POINTS`` new trend points past the minimum span it fits the points of the last
horizon (two hours by default) and calls it a leak only when all of these hold:

1. a Mann–Kendall test, corrected for autocorrelation (Hamed–Rao), finds a rise with
   p < ``P_LEAK`` over the whole horizon;
2. the Theil–Sen slope is at least ``alerts.leak_min_slope_ratio_per_h`` of the limit per hour;
3. the rise goes on in the most recent third of the horizon (p < ``P_RECENT``, slope at least
   the minimum), and the recent half rises at half the whole slope or more
   (``stats.still_rising``) — a warm-up step followed by a plateau, or a lazy warm-up that
   slows down, fails here;
4. the growth over the horizon is at least ``MIN_GROWTH_NOISE`` times the floor's own noise
   (scaled median absolute deviation of the residuals).

Two refinements make it fast and load-aware:

- the floor is the *residual* floor where the server reports its KV pool: allocated memory less
  the bytes the KV blocks in use hold (``vramscope.agent.analysis.load_floor``: bytes per block
  estimated online), so that a never-idle server whose KV cache follows the day's load has a
  flat floor, and a preallocated pool (no bytes per block) changes nothing; a per-request
  cache that reports the tokens its requests hold (``kv_tokens_used``, no blocks) likewise, less
  bytes per token held once that estimate is clear; without KV
  figures, the floor after a request with the requests still in flight: what they hold is
  fitted over the horizon at each verdict (``trend_points``: ``stats.load_coefficient``, the
  bytes per request beside the time trend), the online estimate (the same estimator, fed the
  request events) only where the load never varied;
- a sequential test (``vramscope.agent.analysis.sequential``: a one-sided CUSUM on the floor's
  increments, armed once the floor settled after the warm-up) names a clean rise sooner than
  the horizon's test, once the minimum span is there; its crossing is confirmed by the same
  trend checks on the points since the change point (``confirm``: Mann–Kendall
  p < ``P_CONFIRM`` over at least ``MIN_CONFIRM_S`` of floor,
  Theil–Sen slope at least the minimum over them and over their second half, growth at least
  ``MIN_GROWTH_NOISE`` times the noise). The Mann–Kendall verdict above stays, for what rose
  before the floor ever settled and for slow leaks.

A leak found stays found until its trend is gone (hysteresis, on either route).

The rate a leak verdict reports (either route) is not the test's Theil–Sen slope but
``leak_rate``: the least-squares slope since the knee of a broken-stick fit where the knee is
more than the noise (F test, ``F_KNEE``, on the autocorrelated points' effective count), else
over the span, kept inside Sen's band of the Theil–Sen slope over the same points. The flat
floor before a leak that began inside the span dilutes the whole span's slope; a knee the
noise made would read a steep stretch of noise as the rate; and the median pair slope of a
leak in steps or only under load reads the flat stretches between its rises.

Independently, a ``kv_orphaned_blocks`` event from the KV pool (blocks no request references
that were never returned; ``blocks`` is the current count) is a leak signal of its own
(``vramscope.agent.analysis.kv_leak``): the verdict is a leak from the first report, and
carries the pool's latest count, its rate in blocks and bytes per second with its interval,
the time until the pool's free blocks run out and the floor the orphaned blocks make
(``LeakResult.kv``, ``with_orphans``). Where the idle floor found no leak of its own (a
preallocated pool keeps allocated memory flat; a CPU server has no allocator counters), the
verdict's slope and interval are the pool's bytes per second.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from vramscope.agent.analysis.envelope import EnvelopeTracker
from vramscope.agent.analysis.fast_growth import (
    ENVELOPE,
    FAST_FINE_FLOOR_S,
    FAST_WARMUP_CAP_S,
    FINE,
    FINE_TOKENS,
    NO_WORK,
    FastGrowth,
    began_warming,
    level_noise,
)
from vramscope.agent.analysis.floor import RESIDUAL, FloorTracker, idle_floor
from vramscope.agent.analysis.growth import (
    Z_90,
    Forecast,
    Rate,
    describe_forecast,
    held_too,
    judge,
    more_time_s,
    per_hour,
    rate_interval,
    rate_interval_with_load,
    span_words,
    spread,
    step_margin,
    time_to_oom,
    widened,
)
from vramscope.agent.analysis.kv_leak import KvLeak, OrphanTrend, kv_evidence, rate_line
from vramscope.agent.analysis.load_floor import BlockBytes
from vramscope.agent.analysis.merge import merged
from vramscope.agent.analysis.sequential import H_SIGMA, Cusum
from vramscope.agent.analysis.stats import (
    TrendTest,
    hinge_fit,
    load_coefficient,
    mann_kendall,
    median,
    still_rising,
    theil_sen,
)
from vramscope.agent.analysis.thresholds import Thresholds
from vramscope.agent.analysis.windows import WindowChooser, Windows
from vramscope.agent.durations import MINUTE_S
from vramscope.agent.records import Event, Sample
from vramscope.agent.timefmt import iso_utc

HORIZON_POINTS = 120  # trend points over alerts.leak_horizon_s (a minute each by default)
ROLLING_POINTS = 5
NO_LEAK_FRESH_WINDOWS = 2.0  # no_leak needs a floor read within this many floor windows
# no_leak waits while the floor holds over HELD_SHARE of what a leak added, for at most
# HELD_CAP_S after the leak was last seen growing (a leak that grows only under load rests
# through quiet hours; one that stopped for good is answered no_leak after the cap)
HELD_SHARE = 0.5
HELD_CAP_S = 6 * 3600.0
RISE_NOISE = 3.0  # a newest floor this many noise deviations above the trend's line is a rise
MIN_FIT_POINTS = 6  # fewer trend points than this are never a fit, whatever their span
# the most reads floor_line fits (evenly taken, the newest kept): floor windows fitted to a
# short cycle put thousands in the horizon's last third, and a Theil–Sen line is quadratic
LINE_POINTS = 60
EVAL_EVERY_POINTS = 2
P_LEAK = 1e-3
P_RECENT = 0.05
MIN_GROWTH_NOISE = 2.0
ESTIMATED_SPAN = 4.0  # a floor mostly estimated (no idle moment, no KV figures): x the
#                       minimum span
ESTIMATED_RISE = 0.04  # the rise (share of the limit) that shortens ESTIMATED_SPAN's need
HORIZON_REACH = 0.9  # the most of the horizon a span requirement may ask for (its points
#                      reach one bin short of it)
RECENT_FLOOR_POINTS = 2048
IDLE_RECENT_S = 7200.0  # an idle floor this recent: estimated floors are left out of the trend
#                         (unless the horizon's idle floors are too few: _busy_floor)
MIN_CONFIRM_S = 600.0  # floor since the change point before a sequential verdict
P_CONFIRM = 0.01
F_KNEE = 3.84  # a knee's F against the straight line: the 5 % point of chi-squared, 1 d.f.
RELOAD_RATIO = 0.5  # allocated memory below this share of the settled floor: a model reload
RELOAD_CONFIRM_S = 120.0  # ...once memory comes back to that share, or samples go on this long
MAX_PENDING = 50_000  # records held while the windows are being chosen (then replayed)
INSUFFICIENT = "insufficient_data"
ESTIMATED_WORDS = ("an estimated floor (rarely or never idle, no KV figures: most points are "
                   "read with requests in flight), so the rate is rough; KV figures make the "
                   "floor exact")
# the server reports KV figures, but the memory does not (yet) move with them clearly enough
# to take them off: the floor is estimated as without them
ESTIMATED_UNEXPLAINED_WORDS = ("an estimated floor (rarely or never idle, and the KV figures "
                               "reported do not yet explain the memory: most points are read "
                               "with requests in flight), so the rate is rough")


# a lazy warm-up adds a few % of the limit within FAST_WARMUP_CAP_S: a rise that adds less than
# this share of it over that time (10 %/h) is no warm-up (_warmup_rise holds it not)
WARMUP_LEAST_SHARE = 0.025


class LeakResult(NamedTuple):
    """The latest verdict. Slopes in bytes per second; the trend line is ``(ts_s, bytes)`` pairs.

    ``state`` tells the three answers apart: ``leak``, ``no_leak`` (the trend was tested over at
    least ``alerts.leak_min_span_s`` of floor after the warm-up) and ``insufficient_data``
    (not yet: the evidence says what is missing). ``detected`` is ``state == "leak"``.
    """

    detected: bool  # a leak is present at the latest evaluation
    slope_bytes_per_s: float
    growth_bytes: int  # along the fitted line over the evaluated horizon
    start_ts_s: float | None  # when the rise began (estimated; kept from the first detection)
    first_detected_ts_s: float | None  # the first time it was ever detected (causal)
    evidence: str
    p_value: float | None
    trend_line: tuple[tuple[float, float], tuple[float, float]] | None
    orphaned_blocks: int = 0
    enough_data: bool = True  # the trend was tested over the minimum span
    span_s: float = 0.0  # the floor's span after the warm-up that the verdict rests on
    # a leak found on a floor mostly estimated (rarely or never idle, no KV figures: most
    # points read with requests in flight): its rate is rough (docs/analysis.md, "Limits")
    estimated_floor: bool = False
    # the growth model (analysis.growth): the rate's 90 % interval, and the time until the
    # headroom is used up at the rate (soonest at the interval's high end, latest at its low
    # end; None where it reaches zero), on every leak verdict with a rate
    rate_low_bytes_per_s: float | None = None
    rate_high_bytes_per_s: float | None = None
    time_to_oom_s: float | None = None
    time_to_oom_low_s: float | None = None
    time_to_oom_high_s: float | None = None
    # the KV pool's orphaned blocks, their rate and the pool's time to exhaustion, where its
    # check found any (analysis.kv_leak; ``orphaned_blocks`` is its count)
    kv: KvLeak | None = None

    @property
    def state(self) -> str:
        return "leak" if self.detected else "no_leak" if self.enough_data else INSUFFICIENT


NO_VERDICT = LeakResult(False, 0.0, 0, None, None,
                        "not enough data yet: no idle-floor point after the warm-up", None, None,
                        enough_data=False)


def insufficient(t: Thresholds, span_s: float | None, points: int | None = None) -> LeakResult:
    """The ``insufficient_data`` answer, saying what is missing: ``span_s`` is the floor seen
    after the warm-up so far (``None``: still warming up); ``points``: the trend points of the
    horizon, when the span is there but they are too few (a server idle too rarely)."""
    need = t.leak_min_span_s
    if span_s is None and t.leak_warmup_s <= 0:
        span_s = 0.0
    if span_s is not None and span_s >= need and points is not None:
        text = (f"not enough data yet: {points} idle-floor point(s) in the last "
                f"{t.leak_horizon_s / 3600:.3g} h, a verdict needs {MIN_FIT_POINTS} (the server "
                "is idle too rarely to read its floor; its floors after each request give one "
                f"once they span {busy_span_need(t) / 60:.3g} min)")
    elif span_s is None:
        text = (f"not enough data yet: warming up (the first {t.leak_warmup_s / 60:.3g} min of "
                f"a process are not its floor), then {need / 60:.3g} min of idle floor")
    else:
        text = (f"not enough data yet: {max(0.0, need - span_s) / 60:.1f} more min of idle floor "
                f"(has {span_s / 60:.1f} of the {need / 60:.3g} min a verdict rests on, after "
                f"the {t.leak_warmup_s / 60:.3g} min warm-up)")
    return NO_VERDICT._replace(evidence=text, span_s=span_s or 0.0)


def busy_span_need(t: Thresholds) -> float:
    """The span a verdict on floors read with requests in flight needs: ``ESTIMATED_SPAN``
    times the minimum span, but never more than the horizon can hold."""
    return min(t.leak_min_span_s * ESTIMATED_SPAN, HORIZON_REACH * t.leak_horizon_s)


def estimated_span_need(t: Thresholds, points: Sequence[tuple[float, int]],
                        limit_bytes: int, settled_ts: float) -> float:
    """The span a verdict on mostly estimated floors needs, from the rise their slope makes:
    the load moves such a floor systematically (by about what a 0.5–1 %/h leak adds in two
    hours), so a rise must outgrow that wander, ``ESTIMATED_RISE`` of the limit, before its
    span may be shorter than ``busy_span_need``: a floor filling the device in hours is told
    from the load in a quarter of an hour, one near the minimum slope still needs the hour.
    Never less than ``alerts.leak_min_span_s``, counted from ``settled_ts`` (the end of the
    longest lazy warm-up, ``FAST_WARMUP_CAP_S`` into the process: a warm-up adds more than
    the load's wander, and flattens only later)."""
    full = busy_span_need(t)
    if len(points) < MIN_FIT_POINTS or points[-1][0] <= points[0][0]:
        return full
    t0 = points[0][0]
    slope = theil_sen([p[0] - t0 for p in points], [float(p[1]) for p in points]).slope
    if slope <= 0:
        return full
    short = max(t.leak_min_span_s, ESTIMATED_RISE * limit_bytes / slope)
    return min(full, short + max(0.0, settled_ts - t0))


def orphaned_count(e: Event) -> int:
    """Blocks a ``kv_orphaned_blocks`` event reports: the pool check's current orphan count
    (``blocks``; ``count`` is accepted too), a level rather than an increment."""
    data = e.data or {}
    value = data.get("blocks", data.get("count", 1))
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class FloorLine(NamedTuple):
    """The Theil–Sen line of some floor reads (``_floor_lines``) and how far above it a newer
    read may lie: its reads' own wandering, and what the minimum slope adds over the minimum
    span."""

    t0: float
    intercept: float
    slope: float
    allowed: float

    def above(self, read: tuple[float, int]) -> float | None:
        """How far ``read`` lies above the line where beyond ``allowed``; None otherwise (or
        where the read is older than the line's reads)."""
        if read[0] <= self.t0:
            return None
        above = read[1] - (self.intercept + self.slope * (read[0] - self.t0))
        return above if above > self.allowed else None


def floor_line(reads: Sequence[tuple[float, int]], t: Thresholds,
               min_slope: float) -> FloorLine | None:
    """The line of ``reads`` (oldest first) of the horizon's last third, or of all of them
    where the last third has fewer than ``MIN_FIT_POINTS``; at most ``LINE_POINTS`` of them
    fitted (evenly taken, the newest kept). None with too few."""
    if len(reads) < MIN_FIT_POINTS:
        return None
    recent = [p for p in reads if p[0] >= reads[-1][0] - t.leak_horizon_s / 3]
    if len(recent) < MIN_FIT_POINTS:
        recent = list(reads)
    step = -(-len(recent) // LINE_POINTS)
    recent = recent[::-1][::step][::-1]
    t0 = recent[0][0]
    try:
        line = theil_sen([p[0] - t0 for p in recent], [float(p[1]) for p in recent])
    except ValueError:  # one instant only
        return None
    allowed = max(RISE_NOISE * level_noise(recent), min_slope * t.leak_min_span_s)
    return FloorLine(t0, line.intercept, line.slope, allowed)


class LeakDetector:
    """Incremental, causal leak verdicts over the idle floor of one device (or process)."""

    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.t = thresholds or Thresholds()
        # The windows come from the data (vramscope.agent.analysis.windows): until they are
        # chosen the records wait in ``_pending`` and are then replayed, so the first floor
        # points are the same as if the windows had been known from the start.
        self.chooser = WindowChooser(self.t)
        # the KV pool's orphaned-block reports (analysis.kv_leak): ``result`` carries them
        self.orphans = OrphanTrend(self.t.leak_horizon_s)
        self._shown: tuple[LeakResult, int, LeakResult] | None = None
        self.windows: Windows | None = None
        self.floor = FloorTracker(self.t.leak_floor_window_s)
        self.fine_floor = FloorTracker(min(FAST_FINE_FLOOR_S, self.t.leak_floor_window_s))
        self._pending: list[Sample | Event] = []
        # the trend points of the last horizon (bounded: live agents run for months): each the
        # least floor point of its bin of alerts.leak_horizon_s / HORIZON_POINTS, then the least
        # of the last ROLLING_POINTS bins (a sawtooth slower than one bin still shows its trough
        # in every point)
        self.points: deque[tuple[float, int]] = deque(maxlen=HORIZON_POINTS + 1)
        # beside ``points``: the requests in flight whose memory each point's value estimates
        # (0: an idle floor, or one with the KV blocks in use taken off)
        self._in_flight: deque[int] = deque(maxlen=HORIZON_POINTS + 1)
        # (ts, load, value) of the trend points of the last ROLLING_POINTS bins' time (an old
        # point of a server that idles rarely does not linger); the rolled point is the one of
        # the lowest load (FloorTracker.last_load: idle first), then the least value
        self._recent: deque[tuple[float, int, int]] = deque(maxlen=ROLLING_POINTS)
        # every binned floor point of the last horizon, (ts, load, value), idle or not: the
        # trend of a server that idles too rarely for its idle floors alone (_busy_floor)
        self._bins: deque[tuple[float, int, int]] = deque()
        self._since_busy_eval = 0
        self._count = 0  # trend points so far (the CUSUM waits for a full rolling window)
        self._bin_s = self.t.leak_horizon_s / HORIZON_POINTS
        self._bin: tuple[int, float, int, int] | None = None  # index, ts, load, value
        self._trend_from: float | None = None  # the first trend point: the span starts here
        self._idle_ts: float | None = None  # the latest trend point from an idle moment
        self.result = insufficient(self.t, None)
        self._route = self.result  # the routes' latest answer (the fast one aside)
        self.limit_bytes: int | None = None
        self._first_ts: float | None = None
        self._since_eval = 0
        self._max_seen = 0
        self._uses_allocated = False
        self.reloads = 0  # model reloads seen (each a new warm-up)
        # a fall not yet confirmed as a reload: (when, the floor it fell from, the answer to
        # publish once it is). A server shutting down frees its memory too, and its last
        # answer is the one from before; a reload is known when the weights come back (or
        # the samples go on), and only then does the answer become the new warm-up's
        self._unconfirmed: tuple[float, int, LeakResult] | None = None
        self.load = BlockBytes()  # what the KV blocks in use explain (the residual floor)
        self.per_request = BlockBytes()  # without KV figures: bytes per request in flight
        # a token floor's estimate of the bytes a token holds, and the tokens held, a minute
        # apart over the horizon: the estimate's own drift moves the residual floor (_drifted)
        self._per_token: deque[tuple[float, float, int]] = deque()
        self.cusum = Cusum(ROLLING_POINTS - 1)  # the sequential test, on the rolled floor
        self._seq: LeakResult | None = None  # the sequential verdict while it holds a leak
        self._seq_start: float | None = None  # its change point
        # every floor point the verdicts were made on, when asked for (the dashboard draws
        # them: where KV or requests explain part of the memory, these are residuals)
        self.floor_points: list[tuple[float, int]] | None = None
        # the latest floor points, warm-up or not (bounded): what the floor did under the peaks
        # when the OOM-risk trend fires (growth or load), not a leak verdict
        self.recent_floor: deque[tuple[float, int]] = deque(maxlen=RECENT_FLOOR_POINTS)
        # the growth model's fast route (analysis.growth): every floor point, warm-up or not
        self.fast = FastGrowth()
        # ...and on the fine floor's points
        self.fast_fine = FastGrowth(FINE)
        # ...and on the lower envelope of a never-idle server without KV figures (envelope.py)
        self.envelope = EnvelopeTracker()
        self.fast_envelope = FastGrowth(ENVELOPE)
        self._fast: LeakResult | None = None  # the fast verdict while it holds
        self._fast_on: FastGrowth | None = None  # the series it was established on
        # the routes' no_leak held back (_doubt_no_leak): the reason and the answer shown
        self._doubted: tuple[str, LeakResult] | None = None  # (its kind, the answer shown)
        # _no_leak_doubt's reads, made once per new floor point: the line of the exact reads
        # (per coarse point), the newest read of the truest kind (per fine point), and a read
        # above that line (when, how far) until the trend has the minimum span after it
        self._line_key: tuple[float, int] | None = None
        # one line per kind of read, each read tested against its own kind's: (the idle
        # reads' line, the exact reads' line)
        self._lines: tuple[FloorLine | None, FloorLine | None] = (None, None)
        # the idle reads (no request in flight at all: not even a residual less the KV), the
        # floor windows' of the horizon and the newest fine one: a residual read holds a
        # request's activations, above an idle line without any rise
        self._idle_reads: deque[tuple[float, int]] = deque()
        self._idle_fine: tuple[float, int] | None = None
        # where no KV is taken off (a preallocated pool: no bytes per block), the busy reads
        # (the least of a busy window, KV figures and all): their own line, their own newest
        self._busy_reads: deque[tuple[float, int]] = deque()
        self._busy_fine: tuple[float, int] | None = None
        self._exact_fine: tuple[float, int] | None = None  # the newest, idle or KV taken off
        self._idle_enough = False  # the horizon holds enough idle trend points for a verdict
        self._read_key: tuple[float, int] | None = None
        self._newest_read: float | None = None
        self._rise: tuple[float, float] | None = None
        # what the leak answers so far added: the floor where the first began and the highest
        # it reached, each with what its line's points had taken off put back (a Gain), and
        # when a leak was last answered
        self._gain: tuple[Gain, Gain, float] | None = None
        # what the points of the newest verdict had taken off for their requests in flight,
        # (bytes per request, mean requests in flight): a line's height is read with it, and
        # two lines read with different bytes per request compare only once put back
        self._taken_off: tuple[float, float] = (0.0, 0.0)
        self._route_taken_off: tuple[float, float] = (0.0, 0.0)  # the routes' answer's
        self.peak = RecentPeak()  # the newest peaks of allocated memory: the headroom

    @property
    def result(self) -> LeakResult:
        """The latest verdict: the floor's (the routes'), with the KV pool's orphaned blocks
        on top where its check found any (:func:`with_orphans`; made once per change)."""
        r, orphans = self._result, self.orphans
        if not orphans.reports:
            return r
        shown = self._shown
        if shown is None or shown[0] is not r or shown[1] != orphans.version:
            shown = self._shown = (r, orphans.version, with_orphans(r, orphans.leak()))
        return shown[2]

    @result.setter
    def result(self, value: LeakResult) -> None:
        self._result = value

    @property
    def started_ts_s(self) -> float | None:
        """The process's first sample (a model reload starts it over); None before any."""
        return self._first_ts

    def on_event(self, e: Event) -> LeakResult | None:
        if self.windows is None:
            self.chooser.on_event(e)
            if e.name in ("request_start", "request_end"):
                self._pending.append(e)
        else:
            self.floor.on_event(e)
            self.fine_floor.on_event(e)
            self.envelope.on_event(e)
        if e.name != "kv_orphaned_blocks" or not self.orphans.on_event(e, orphaned_count(e)):
            return None
        return self.result

    def update(self, s: Sample) -> LeakResult | None:
        """Feed a sample; returns a new verdict when one was evaluated."""
        if s.kv_blocks_used is not None:
            self.orphans.observe_sample(s)
        if self.windows is not None:
            return self._step(s)
        if s.allocated_bytes is not None:
            self._uses_allocated = True
        memory = s.allocated_bytes is not None or (
            not self._uses_allocated and s.device_used_bytes is not None)
        windows = self.chooser.update(s) if memory else None
        self._pending.append(s)
        if windows is None and len(self._pending) < MAX_PENDING:
            return None
        return self._start(windows or self.chooser.decide_now())

    def _start(self, windows: Windows) -> LeakResult | None:
        """The windows are known: replay the records that waited for them."""
        self.windows = windows
        self.floor = FloorTracker(windows.floor_s)
        self.fine_floor = FloorTracker(min(FAST_FINE_FLOOR_S, windows.floor_s))
        self._bin_s = max(windows.floor_s, self.t.leak_horizon_s / HORIZON_POINTS)
        pending, self._pending = self._pending, []
        out = None
        for rec in pending:
            if isinstance(rec, Event):
                self.floor.on_event(rec)
                self.fine_floor.on_event(rec)
                self.envelope.on_event(rec)
            else:
                out = self._step(rec) or out
        return out

    def _step(self, s: Sample) -> LeakResult | None:
        # every sample of a process comes here: its attributes are read once, into locals
        ts_s = s.ts_s
        if self._first_ts is None:
            self._first_ts = ts_s
        allocated, total = s.allocated_bytes, s.device_total_bytes
        if total and (allocated is not None or self.limit_bytes is None):
            self.limit_bytes = total  # an allocator sample's limit wins
        if allocated is not None and self._unconfirmed is not None:
            at, before, _ = self._unconfirmed
            if allocated >= RELOAD_RATIO * before or ts_s - at >= RELOAD_CONFIRM_S:
                self._reload_confirmed()
        if allocated is not None and self.points \
                and allocated < RELOAD_RATIO * self.points[-1][1]:
            self._reload(ts_s, allocated)
        load = self.load
        load.observe_kv_figures(s.kv_blocks_used, s.kv_tokens_used)
        if allocated is not None:
            load.observe(allocated)
            self._note_per_token(ts_s)
            self.peak.observe(ts_s, allocated)
            if allocated > self._max_seen:
                self._max_seen = allocated
        by_token = load.unit == "token"
        anytime = self._kv_explains()
        tokens = anytime and by_token
        self.fast_fine.config = FINE_TOKENS if tokens else FINE
        if not anytime or by_token:
            # what the requests in flight hold: the floor's estimate without KV figures, and
            # with tokens only until bytes per token are clear
            self.per_request.observe_kv(self.floor.in_flight)
            if allocated is not None:
                self.per_request.observe(allocated)
        explained = load.explained() if anytime else self.per_request.explained()
        fine_floor = self.fine_floor
        fine = fine_floor.update(s, explained, anytime, tokens)
        if fine is not None:
            fine_load = fine_floor.last_load
            if fine_load == 0:
                self._idle_fine = fine
            if fine_load <= RESIDUAL:
                self._exact_fine = fine
                if fine_load == RESIDUAL:
                    self._busy_fine = fine
        fast = None if fine is None else self._fast_growth(
            self.fast_fine, fine, fine_floor.last_load, ts_s)
        if not anytime:
            fast = self._envelope_growth(s) or fast
        point = self.floor.update(s, explained, anytime, tokens)
        if point is None:
            return fast or self._doubt_no_leak(ts_s)
        self.recent_floor.append(point)
        if self.floor.last_load == 0:
            self._keep_read(self._idle_reads, point)
        elif self.floor.last_load == RESIDUAL:
            self._keep_read(self._busy_reads, point)
        if self.floor_points is not None:
            self.floor_points.append(point)
        fast = self._fast_growth(self.fast, point, self.floor.last_load, s.ts_s) or fast
        if point[0] < self._first_ts + self.t.leak_warmup_s:
            return fast
        in_flight = self.floor.last_load - RESIDUAL
        if in_flight > 0 and tokens:
            # a window of prefills only, less the tokens held: the activations of a load that
            # keeps a prefill running at every sample are in it; no floor for the trend
            return self._doubt_no_leak(s.ts_s) or fast
        if in_flight > 0 and not self._kv_explains():
            # the trend gets the floor as measured, with the requests in flight: what they
            # hold is fitted over the horizon (trend_points), not taken from this moment's
            # online estimate, whose drift over an hour would read as a trend of its own
            point = (point[0], point[1] + int(self.per_request.bytes_per_block * in_flight))
        binned = self._binned(point, self.floor.last_load)
        out = None if binned is None else self._trend_point(*binned, s.ts_s)
        return self._doubt_no_leak(s.ts_s) or out or fast

    def _kv_explains(self) -> bool:
        """The KV figures explain the floor at any moment: a pool's blocks (its memory moves
        with them, or is preallocated and stays put), or the tokens held once bytes per token
        are clear (until then a per-request cache's KV is in the floor, and the requests in
        flight estimate it, as without KV figures)."""
        load = self.load
        return load.kv_used is not None and (load.unit == "block" or load.bytes_per_block > 0)

    def _note_gain(self, v: LeakResult, now_s: float, taken_off: tuple[float, float]) -> None:
        """A leak answer's line adds to what the leaks added (``_held_gain``); ``taken_off``:
        what its points had taken off for their requests in flight."""
        if not v.detected or v.trend_line is None:
            return
        if v.start_ts_s is not None and self._first_ts is not None \
                and v.start_ts_s < self._first_ts + FAST_WARMUP_CAP_S:
            return  # a rise from the process's first minutes that flattens is its warm-up
        (_, start), (_, end) = v.trend_line
        per_request, load = taken_off
        base, top = Gain.of(start, per_request, load), Gain.of(end, per_request, load)
        gain = self._gain
        if gain is not None:
            base = gain[0]
            if gain[1].height(per_request) > top.height(per_request):
                top = gain[1]
        self._gain = (base, top, now_s)

    def _keep_read(self, reads: deque[tuple[float, int]], point: tuple[float, int]) -> None:
        """``point`` joins ``reads``, which keep the horizon's."""
        reads.append(point)
        while reads[0][0] < point[0] - self.t.leak_horizon_s:
            reads.popleft()

    def _floor_lines(self, min_slope: float) -> tuple[FloorLine | None, FloorLine | None]:
        """The lines a newer floor read is tested against, one per kind of read: that of the
        reads with no request in flight, and that of the exact reads (idle, or with their KV
        blocks taken off: a residual read holds a request's activations, so it is compared
        with reads of its own kind, whose wandering that is; where no KV was taken off, only
        where the idle reads are too few for a line, as their stand-in). Each is fitted on its
        kind's
        reads of the horizon's last third, or of all those kept where the last third has too
        few (a server that idles rarely: a newer read is still judged against the reads
        before it); None with too few reads."""
        idle = floor_line(list(self._idle_reads), self.t, min_slope)
        if idle is not None and self.load.bytes_per_block <= 0:
            # where no KV was taken off (no KV figures, or a preallocated pool whose memory
            # does not move with its blocks) a read of no known load is the least of a busy
            # window, activations and all, not a residual: beside the idle line, such reads
            # are judged against their own kind's line alone (a step seen first in a busy
            # read is a rise too)
            return idle, floor_line(list(self._busy_reads), self.t, min_slope)
        exact = [p for p, (_, n) in zip(self.fast.points, self.fast.loads) if not n]
        return idle, floor_line(exact, self.t, min_slope)

    def _doubt_no_leak(self, now_s: float) -> LeakResult | None:
        """``no_leak`` is a claim about now. The routes' ``no_leak`` stands only while
        :meth:`_no_leak_doubt` finds nothing against it; otherwise the answer is "not enough
        data yet" with the reason, and the routes' answer comes back once the doubt is gone (a
        fresh floor read within the wandering). The new answer, or None where it is unchanged."""
        route, shown, doubted = self._route, self._result, self._doubted
        held_back = doubted is not None and shown is doubted[1]
        # (route.state != "no_leak", without the property: this runs for every sample)
        if (shown is not route and not held_back) or route.detected or not route.enough_data:
            return None  # another answer is shown (the fast route's, a reload's, an OOM's)
        doubt = self._no_leak_doubt(now_s, doubted[0] if held_back and doubted else None)
        if doubt is None:
            if not held_back:
                return None
            self._doubted = None
            self.result = route
            return self.result
        if held_back and doubted is not None and doubted[0] == doubt[0]:  # shown already
            return None
        self.result = route._replace(enough_data=False, evidence=(
            f"not enough data yet: {doubt[1]}; the last answer: {route.evidence}"))
        self._doubted = (doubt[0], self._result)
        return self.result

    def _no_leak_doubt(self, now_s: float, shown: str | None = None) -> tuple[str, str] | None:
        """Why the floor read so far cannot stand for now, its kind and words (None when it
        can; a new kind is a new answer, new figures of one kind are not: the words of the
        kind ``shown`` already are left empty, not made again for every sample). Read on the
        fine floor's points (a floor window's point is up to a window old when it comes):

        - the newest floor read of the kind the verdict rests on (with no request in flight,
          or with its KV blocks taken off, where the horizon has enough such reads for a
          verdict; else any) is older than ``NO_LEAK_FRESH_WINDOWS`` floor windows: a leak
          begun since could hold more than a slow one adds in hours;
        - a newest read with no request in flight, or one with its KV taken off, lay above the
          line of the reads of its kind before it (``_floor_lines``): a rise, held until the
          trend has had the minimum span of points after it (its own tests judge it then);
        - the trend has had no new point for the minimum span (busy without a break)."""
        coarse = self.fast.points[-1] if self.fast.points else None
        if coarse != self._line_key:
            self._line_key = coarse
            self._lines = self._floor_lines(self._min_slope())
            # the truest kind the verdict rests on: the idle floors where they are enough
            # for one (as _busy_floor decides), else every floor read
            self._idle_enough = self._idle_enough_at(now_s)
        fine = self.fast_fine.points[-1] if self.fast_fine.points else None
        if fine != self._read_key:  # a new fine floor point: read once, not per sample
            self._read_key = fine
            exact = self._exact_fine
            truest = exact if self._idle_enough else fine
            idle_line, exact_line = self._lines
            busy_kind = idle_line is not None and self.load.bytes_per_block <= 0
            if busy_kind and exact_line is None:
                # the idle line alone judges (_floor_lines): only an idle read is tested, so
                # only one keeps the floor fresh (a busy read of a preallocated pool holds a
                # burst's activations, and a step under it goes unseen until the next idle)
                truest = self._idle_fine
            self._newest_read = (truest or fine or (None,))[0]
            second = self._busy_fine if busy_kind else exact
            for line, read in zip(self._lines, (self._idle_fine, second)):
                if self._rise is None and line is not None and read is not None:
                    above = line.above(read)
                    if above is not None:
                        self._rise = (read[0], above)
        fresh_s = NO_LEAK_FRESH_WINDOWS * self.floor.window_s
        if self._newest_read is not None and now_s - self._newest_read > fresh_s:
            return "stale", "" if shown == "stale" else (
                f"no floor read for over {span_words(fresh_s)} (busy since)")
        rise = self._rise
        if rise is not None:
            if not self.points or self.points[-1][0] < rise[0] + self.t.leak_min_span_s:
                return "above", "" if shown == "above" else (
                    f"a floor read {rise[1] / 2**20:.1f} MiB above the line of those before "
                    f"it, a rise too recent to test")
            self._rise = None  # the trend has the minimum span after it: its tests judge it
        if self.points and now_s - self.points[-1][0] >= self.t.leak_min_span_s:
            return "unseen", "" if shown == "unseen" else (
                f"no new floor point for over {span_words(self.t.leak_min_span_s)} (busy "
                f"without a break)")
        return self._held_gain(now_s, shown)

    def _held_gain(self, now_s: float, shown: str | None = None) -> tuple[str, str] | None:
        """The floor still holds over ``HELD_SHARE`` of what the leak answers added, within
        ``HELD_CAP_S`` of the last: a leak that grows only under load is flat in quiet hours,
        not gone (the "held" doubt of :meth:`_no_leak_doubt`)."""
        gain, line = self._gain, self._route.trend_line
        if gain is None or line is None or now_s - gain[2] > HELD_CAP_S:
            return None
        # every height read with the bytes per request of the routes' answer now (a load's
        # fit moves by tens of MiB per request over an hour: times a batch, more than a slow
        # leak adds)
        per_request = self._route_taken_off[0]
        base, top, last = (gain[0].height(per_request), gain[1].height(per_request), gain[2])
        held = line[1][1] - base
        if top <= base or held < HELD_SHARE * (top - base):
            return None
        if shown == "held":
            return "held", ""  # shown already (_no_leak_doubt)
        return "held", (f"the floor still holds {held / 2**20:.1f} MiB of the "
                        f"{(top - base) / 2**20:.1f} MiB the leak added (a leak answered "
                        f"{span_words(now_s - last)} ago): a leak that grows only under load "
                        f"rests when the load does")

    def _binned(self, point: tuple[float, int],
                load: int) -> tuple[float, int, int] | None:
        """Each bin's floor point of the fewest requests in flight, then the least, once the
        bin is over (a floor point per bin when the floor window is a bin or longer)."""
        ts, value = point
        if self._bin_s <= self.floor.window_s:
            return ts, load, value
        index = int(ts // self._bin_s)
        held = self._bin
        if held is None or index != held[0]:
            self._bin = (index, ts, load, value)
            return None if held is None else held[1:]
        if (load, value) < held[2:]:
            self._bin = (index, ts, load, value)
        return None

    def _trend_point(self, ts: float, load: int, raw: int,
                     now_s: float) -> LeakResult | None:
        """A trend point after the warm-up: the sequential test, then, past the minimum span,
        the verdict over the horizon (every ``EVAL_EVERY_POINTS`` points)."""
        bins = self._bins
        bins.append((ts, load, raw))
        while bins[0][0] < ts - self.t.leak_horizon_s:
            bins.popleft()
        if load == 0:
            if self._idle_ts is None and any(self._in_flight):
                self._drop_estimated()  # the first idle floor: the estimates before it go
            self._idle_ts = ts
        elif self._idle_ts is not None and ts - self._idle_ts < IDLE_RECENT_S:
            # a server that idles now and then: its idle floors are the trend, unless too
            # few of them for a verdict (then every floor point is, as on a busy server)
            busy = self._busy_floor(ts)
            return None if busy is None else self._rarely_idle(busy, now_s)
        if self._trend_from is None:
            self._trend_from = ts
        recent = self._recent
        while recent and recent[0][0] <= ts - ROLLING_POINTS * self._bin_s:
            recent.popleft()
        recent.append((ts, load, raw))
        self._count += 1
        rolled = min((p[1], p[2]) for p in recent)
        self.points.append((ts, rolled[1]))
        self._in_flight.append(max(0, rolled[0] - RESIDUAL))
        while self.points[0][0] < ts - self.t.leak_horizon_s:
            self.points.popleft()
            self._in_flight.popleft()
        self._since_eval += 1
        verdict = self._sequential(raw)
        # the span the verdict rests on: the points of the horizon (after a stretch without
        # trend points, a server idle only now and then, the first ones are long gone)
        span = ts - max(self._trend_from, self.points[0][0])
        # a floor estimated from the load (never idle, no KV figures) needs ESTIMATED_SPAN
        # times the span: a load that wanders over half an hour is not a leak's steady rise
        need = self.t.leak_min_span_s
        if self._mostly_estimated():
            need = max(need, estimated_span_need(self.t, self.trend_points(), self._limit(),
                                                  self._settled_ts()))
        if span < need or len(self.points) < MIN_FIT_POINTS:
            busy = self._busy_floor(ts)
            if busy is not None:  # too few idle floors: every floor point answers
                return self._rarely_idle(busy, now_s)
            t = self.t._replace(leak_min_span_s=need)
            self.result = self._publish(insufficient(t, span, len(self.points)), now_s)
            return self.result
        if self._since_eval >= EVAL_EVERY_POINTS or self._route.p_value is None:
            self._since_eval = 0
            prev = self._result  # the floor's own (orphaned KV blocks aside)
            mk = evaluate_floor(self.trend_points(), self._limit(), self.t,
                                prev.detected and prev.p_value is not None)
            # a sequential leak is reported over its own span (since its change point): its
            # slope is the leak's, not diluted by the flat floor before it
            verdict = mk if self._seq is None else self._seq
        if verdict is None:
            return None
        if verdict is self._seq:  # its line is on the floor as measured, nothing taken off
            start = self._seq_start if self._seq_start is not None else ts
            self._taken_off = (0.0, mean_load(
                [n for p, n in zip(self.points, self._in_flight) if p[0] >= start]))
        held = self._warmup_rise(verdict, ts)
        if held is not None:
            self.result = self._publish(held, now_s)
            return self.result
        self.result = self._publish(verdict._replace(span_s=span, enough_data=True), now_s)
        return self.result

    def _warmup_rise(self, verdict: LeakResult, ts: float,
                     points: Sequence[tuple[float, int]] | None = None) -> LeakResult | None:
        """A new leak verdict on a rise that began in the process's first
        ``FAST_WARMUP_CAP_S`` (its line's start there, or the knee of the floor since the
        process began serving: ``began_warming``) rests on the floor after that cap alone: a
        lazy warm-up may run past the cap, and its rise is the warm-up's until the floor after
        it shows a trend of its own (a warm-up flattens, growth goes on). That verdict over
        ``points`` (the trend's, by default) since the cap, ``insufficient_data`` until they
        span ``alerts.leak_min_span_s``; None where the verdict stands (no leak, a rise slower
        than a warm-up's, ``WARMUP_LEAST_SHARE``, a leak already
        found, a rise that began after the cap, or one the floor after the cap confirms)."""
        settled = self._settled_ts()
        prev = self._result
        if not verdict.detected or (prev.detected and prev.p_value is not None):
            return None
        if self.t.leak_warmup_s <= 0:
            return None  # configured without a warm-up: none is waited for
        if verdict.slope_bytes_per_s * FAST_WARMUP_CAP_S < WARMUP_LEAST_SHARE * self._limit():
            return None  # slower than any lazy warm-up grows: a slow leak from the start
        start = verdict.start_ts_s
        if (start is None or start >= settled) and not began_warming(
                list(self.fast.points), list(self.fast.loads), self._first_ts or 0.0):
            return None
        pts = [p for p in (self.trend_points() if points is None else points)
               if p[0] >= settled]
        after = evaluate_floor(pts, self._limit(), self.t)
        span = pts[-1][0] - pts[0][0] if pts else 0.0
        if after.detected:
            return None  # the floor after the cap rises too: the route's verdict stands
        if after.enough_data:
            return after._replace(span_s=span)
        return NO_VERDICT._replace(evidence=(
            f"not enough data yet: the floor rose from the first {FAST_WARMUP_CAP_S / 60:.3g} "
            f"min of the process, where a lazy warm-up grows; "
            f"{max(0.0, self.t.leak_min_span_s - span) / 60:.1f} more min of floor after them "
            f"tell a warm-up that flattens from growth that goes on"), span_s=span)

    def _idle_enough_at(self, ts: float) -> bool:
        """The horizon up to ``ts`` holds enough idle (exact) trend points for a verdict."""
        horizon = self.t.leak_horizon_s
        return sum(1 for p, n in zip(self.points, self._in_flight)
                   if not n and p[0] >= ts - horizon) >= MIN_FIT_POINTS

    def _busy_floor(self, ts: float) -> list[tuple[float, int, int]] | None:
        """Every floor point of the horizon, rolled as the trend rolls its own (``(ts, load,
        value)``), where the server idles too rarely for its idle floors to make a verdict
        and these span ``ESTIMATED_SPAN`` times the minimum span, as a server never idle
        needs; None otherwise (its idle floors answer, or nothing does yet)."""
        if self._idle_enough_at(ts):
            return None
        rolled = _rolled(list(self._bins), ROLLING_POINTS * self._bin_s)
        if len(rolled) < MIN_FIT_POINTS:
            return None
        points = load_corrected([(t, v) for t, _, v in rolled],
                                [max(0, load - RESIDUAL) for _, load, _ in rolled],
                                self.per_request.bytes_per_block)
        if rolled[-1][0] - rolled[0][0] < estimated_span_need(self.t, points, self._limit(),
                                                                   self._settled_ts()):
            return None
        return rolled

    def _rarely_idle(self, rolled: list[tuple[float, int, int]],
                     now_s: float) -> LeakResult | None:
        """The verdict over ``_busy_floor``'s points (what the requests in flight hold fitted
        out), every ``EVAL_EVERY_POINTS`` of them; None between (the answer stands)."""
        self._since_busy_eval += 1
        if self._since_busy_eval < EVAL_EVERY_POINTS and self._route.p_value is not None:
            return None
        self._since_busy_eval = 0
        loads = [max(0, load - RESIDUAL) for _, load, _ in rolled]
        raw = [(t, v) for t, _, v in rolled]
        per_request = load_correction(raw, loads, self.per_request.bytes_per_block)
        self._taken_off = (per_request, mean_load(loads))
        points = corrected(raw, loads, per_request)
        prev = self._result  # the floor's own (orphaned KV blocks aside)
        was = prev.detected and prev.p_value is not None
        v = evaluate_floor(points, self._limit(), self.t, was)
        span = rolled[-1][0] - rolled[0][0]
        v = self._warmup_rise(v, rolled[-1][0], points) or v
        self.result = self._publish(v._replace(span_s=span, enough_data=True), now_s,
                                    estimated=any(loads), points=points, loads=loads)
        return self.result

    def _drop_estimated(self) -> None:
        """The server idled for the first time: its idle floors are the trend from now on
        (estimated floors are left out within ``IDLE_RECENT_S`` of one), and so are the
        estimated points already in the horizon, from before it: an estimate beside an exact
        floor is a step that no leak made (a rise start read there, a slope diluted by it)."""
        kept = [(p, n) for p, n in zip(self.points, self._in_flight) if not n]
        self.points.clear()
        self._in_flight.clear()
        self.points.extend(p for p, _ in kept)
        self._in_flight.extend(n for _, n in kept)
        self._recent = deque((p for p in self._recent if p[1] == 0), maxlen=ROLLING_POINTS)
        self._trend_from = self.points[0][0] if self.points else None

    def trend_points(self) -> list[tuple[float, int]]:
        """The horizon's points, those estimated from the requests in flight corrected by the
        bytes per request that the horizon itself shows (``stats.load_coefficient``: a robust
        fit of value = a + slope x time + bytes x requests): the online estimate taken off at
        each point is a median of steps, biased where requests differ in size, and a bias
        times a load that follows the time of day reads as a trend."""
        points, loads = list(self.points), list(self._in_flight)
        per_request = load_correction(points, loads, self.per_request.bytes_per_block)
        self._taken_off = (per_request, mean_load(loads))
        return corrected(points, loads, per_request)

    def load_free_points(self) -> list[tuple[float, int]]:
        """The horizon's trend points with what the requests in flight hold fitted out, where
        some were read with requests in flight (none otherwise: the floor itself is free of
        the load)."""
        return self.trend_points() if any(self._in_flight) else []

    def _mostly_estimated(self) -> bool:
        """Most trend points of the horizon are floors after a request less what the requests
        still in flight were estimated to hold (no idle moment, no KV figures)."""
        return 2 * sum(1 for n in self._in_flight if n) > len(self._in_flight)

    def _reload(self, ts_s: float, allocated: int) -> None:
        """Memory fell below half the settled floor: the model was unloaded (a reload or a
        restart in the same process). What follows is a new warm-up, not the old floor."""
        self.reloads += 1
        before = self.points[-1][1]
        in_flight = self.floor.in_flight
        self.floor = FloorTracker(self.floor.window_s)
        self.floor.in_flight = in_flight
        self.fine_floor = FloorTracker(self.fine_floor.window_s)
        self.fine_floor.in_flight = in_flight
        self.fast_fine.clear()
        self.envelope.clear()
        self.fast_envelope.clear()
        self.points.clear()
        self._in_flight.clear()
        self._recent.clear()
        self._bins.clear()
        self._count = 0
        self._bin = self._trend_from = self._idle_ts = self._seq = self._seq_start = None
        self._first_ts, self._since_eval = ts_s, 0
        self.cusum = Cusum(ROLLING_POINTS - 1)
        self.load.restart()
        self.per_request.restart()
        self.fast.clear()
        self._fast = self._fast_on = self._rise = self._gain = self._idle_fine = None
        self._lines = (None, None)
        self._exact_fine, self._idle_enough = None, False
        self._idle_reads.clear()
        self._busy_reads.clear()
        self._busy_fine = None
        waiting = insufficient(self.t, None)
        self._unconfirmed = (ts_s, before, waiting._replace(
            evidence=f"model reloaded at {ts_s:.3f} (allocated fell to "
                     f"{allocated / 2**20:.1f} MiB): " + waiting.evidence))

    def _reload_confirmed(self) -> None:
        """The fall was a reload: its answer (the new warm-up's) is the answer from now."""
        assert self._unconfirmed is not None
        self.result, self._unconfirmed = self._unconfirmed[2], None
        self._route, self._doubted = self._result, None

    def _limit(self) -> int:
        return self.limit_bytes or self._max_seen or 1

    def end_growth(self, ts_s: float) -> None:
        """An OOM at ``ts_s`` ended the process's episode: the fast route's growth is history
        (the floor it rose on was freed, or the process died). Its leak verdict stays the
        answer, marked as ended, until the routes give their next one (a process that lives
        on); a process the OOM killed keeps it: the leak that killed it, not "no leak"."""
        self.fast.clear()
        self.fast_fine.clear()
        self.fast_envelope.clear()
        fast = self._fast
        if fast is not None:
            # the forecast came true: no "full in about 0 s" stays on a verdict that is history
            # (fast_verdict wrote its words from these same fields: with_rate sets them together)
            evidence, tto, soonest = fast.evidence, fast.time_to_oom_s, fast.time_to_oom_low_s
            if tto is not None and soonest is not None:
                said = describe_forecast(Forecast(tto, soonest, fast.time_to_oom_high_s))
                evidence = evidence.replace("; " + said, "", 1)
            self.result = fast._replace(
                evidence=f"{evidence}; the growth ended with the OOM at {iso_utc(ts_s)}",
                first_detected_ts_s=self.result.first_detected_ts_s or fast.first_detected_ts_s,
                time_to_oom_s=None, time_to_oom_low_s=None, time_to_oom_high_s=None)
            self._fast = self._fast_on = None

    def _settled_ts(self) -> float:
        """When the longest lazy warm-up is over (``FAST_WARMUP_CAP_S`` into the process)."""
        return (self._first_ts or 0.0) + FAST_WARMUP_CAP_S

    def _min_slope(self) -> float:
        return self.t.leak_min_slope_ratio_per_h * self._limit() / 3600.0

    def _fast_growth(self, series: FastGrowth, point: tuple[float, int], load: int,
                     now_s: float, age_s: float = 0.0) -> LeakResult | None:
        """The growth model's fast route on the newest point of one floor series: a verdict
        when fast growth is established (or, established on this series, still holds: its
        rate re-measured), None otherwise; once it no longer holds the routes' latest answer
        is the answer again."""
        work = self.floor.in_flight if self.load.unit == "token" and self._kv_explains() \
            else NO_WORK
        series.add(*point, max(0, load - RESIDUAL), work, age_s)
        min_slope = self._min_slope()
        headroom = self._limit() - self.peak.value()
        held = self._fast
        if held is not None:
            if self._fast_on is not series:
                return None
            rate = series.holds(held.start_ts_s or point[0], min_slope)
            if rate is None:
                self._fast = self._fast_on = None
                self.result = self._route
                return self.result
        else:
            if self.result.detected and self.result.p_value is not None:
                return None  # a leak the routes found: its answer stands
            rate = series.established(min_slope, headroom, self._first_ts or 0.0,
                                      self._limit())
            if rate is None:
                return None
            self._fast_on = series
        self._fast = fast_verdict(rate, headroom, self._limit(), min_slope)
        # the series' points had the online estimate of what their requests hold taken off
        per_request = self.per_request.bytes_per_block if not self._kv_explains() else 0.0
        self._taken_off = (per_request, mean_load(
            [n for ts, n in series.loads if ts >= rate.t0]))
        # the envelope's points are read with requests in flight, no KV figures: a rough rate
        self.result = self._publish(self._fast, now_s,
                                    True if series is self.fast_envelope else None)
        return self.result

    def _envelope_growth(self, s: Sample) -> LeakResult | None:
        """The fast route on the lower envelope (``ENVELOPE``) of a server without KV figures
        that explain its floor: a window with an idle moment drops the points before it (an
        exact floor is read there, and the requests after it are all young)."""
        point = self.envelope.update(s)
        if point is None:
            return None
        if point.idle:
            self.fast_envelope.clear()
            return None
        return self._fast_growth(self.fast_envelope, (point.ts_s, point.value),
                                 RESIDUAL + point.in_flight, s.ts_s, point.age_s)

    def _with_growth(self, r: LeakResult, points: Sequence[tuple[float, int]] | None,
                     loads: Sequence[int] | None = None) -> LeakResult:
        """The growth model on a route's verdict: a leak gets its rate's interval and its time
        to OOM; ``no_leak`` stands only where the interval's top is below the minimum slope,
        else it is ``insufficient_data`` with what is missing."""
        if r.p_value is None or r.rate_low_bytes_per_s is not None:
            return r  # no test was made (not enough floor yet), or it carries its own rate
        if r.detected:
            r = self._drifted(r)
        pts = list(self.trend_points() if points is None else points)
        # the requests in flight at each point: what an estimated floor's point had taken off
        held = list(self._in_flight if points is None else loads or [0] * len(pts))
        horizon, horizon_held = pts, held
        if r.detected and r.start_ts_s is not None:
            first = next((i for i, p in enumerate(pts) if p[0] >= r.start_ts_s), len(pts))
            if len(pts) - first >= MIN_FIT_POINTS:
                pts, held = pts[first:], held[first:]
        rate = _fitted(pts, held, r.detected)
        if r.detected and rate is not None:
            if r.estimated_floor:  # where it began is within the estimate's wandering
                horizon, horizon_held = pts, held
            return with_forecast(r, self._misfit(rate, r.slope_bytes_per_s, pts, horizon,
                                                 horizon_held),
                                 self._limit() - self.peak.value())
        if rate is None and r.detected and r.slope_bytes_per_s > 0:
            # too few points for an interval of their own: the slope's, with the model's error
            rate = Rate(r.slope_bytes_per_s, r.slope_bytes_per_s, r.slope_bytes_per_s, r.span_s,
                        len(pts), float(len(pts)), 0.0)
        if rate is None:
            return r
        min_slope = self._min_slope()
        if r.detected:
            return with_forecast(r, widened(rate, r.slope_bytes_per_s),
                                 self._limit() - self.peak.value())
        r = r._replace(rate_low_bytes_per_s=rate.low, rate_high_bytes_per_s=rate.high)
        scope = ""
        if judge(rate, min_slope) == "no_leak":  # the interval's top under the minimum
            # ...over the horizon, and over every recent stretch down to the minimum span:
            # a leak begun lately is diluted in the horizon's flat hours, not ruled out by them
            recent = rising_recently(pts, min_slope, self.t.leak_min_span_s, held)
            if recent is None:
                return r  # _doubt_no_leak holds it back while the newest reads doubt it
            recent_s, rate = recent
            scope = f" over the last {span_words(recent_s)}"
        figures = (f"the floor's rate{scope} {per_hour(rate.slope)} ({per_hour(rate.low)} to "
                   f"{per_hour(rate.high)}, 90 %)")
        if judge(rate, min_slope) == "leak":  # a rise the leak tests have not confirmed yet
            missing = (f"{figures} is above the minimum {per_hour(min_slope)}: a rise too "
                       f"recent for the leak tests")
        else:
            missing = (f"{figures} is not yet below the minimum {per_hour(min_slope)}; about "
                       f"{span_words(more_time_s(rate, min_slope))} more of floor at this noise")
        return r._replace(enough_data=False, evidence=(
            f"not enough data yet: {missing} (the test so far: {r.evidence})"))

    def _note_per_token(self, ts_s: float) -> None:
        """Keep the token floor's estimate and the tokens held, a minute apart (horizon)."""
        load = self.load
        if load.unit != "token" or load.kv_used is None or load.bytes_per_block <= 0:
            return
        kept = self._per_token
        if kept and ts_s - kept[-1][0] < MINUTE_S:
            return
        kept.append((ts_s, load.bytes_per_block, load.kv_used))
        while kept[0][0] < ts_s - self.t.leak_horizon_s:
            kept.popleft()

    def _drifted(self, r: LeakResult) -> LeakResult:
        """A route's leak on a token floor, unless the estimate of the bytes a token holds
        moved enough over the rise to make it: each residual point took off the estimate of
        its moment, so a drift of the estimate by d bytes a token moves the floor by d x the
        tokens held, as a leak would (the estimate settles over a process's first quarter
        hour). The rise must be twice what that drift explains; until then, not enough data."""
        if self.load.unit != "token" or not self._kv_explains() or not self._per_token:
            return r
        # over the floor the test rests on (its span), or since the rise began if earlier
        start = self._per_token[-1][0] - r.span_s
        if r.start_ts_s is not None:
            start = min(start, r.start_ts_s)
        since = [(b, n) for ts, b, n in self._per_token if ts >= start]
        if len(since) < 2:
            return r
        now = self.load.bytes_per_block
        drift = max(abs(now - b) for b, _ in since) * sum(n for _, n in since) / len(since)
        if r.growth_bytes > 2 * drift:
            return r
        return r._replace(detected=False, enough_data=False, evidence=(
            f"not enough data yet: the floor rose {r.growth_bytes / 2**20:.4g} MiB, but the "
            f"estimate of the bytes a KV token holds moved by up to "
            f"{max(abs(now - b) for b, _ in since):.4g} over that time, which with the tokens "
            f"held explains {drift / 2**20:.4g} MiB of it; a leak must rise past twice that "
            f"(the test so far: {r.evidence})"))

    def _misfit(self, rate: Rate, slope: float, pts: Sequence[tuple[float, int]],
                horizon: Sequence[tuple[float, int]], horizon_held: Sequence[int]) -> Rate:
        """A leak's interval, ``rate`` (over ``pts``, the floor since the rise began) reporting
        ``slope``, widened where the floor is no straight line: to the model's error
        (:func:`growth.widened`); by a step either side where it rose in steps
        (:func:`growth.step_margin`); and to hold the rate since the floor left its starting
        level in ``horizon`` too, where it rose before ``pts`` by more than the minimum slope
        adds over ``alerts.leak_min_span_s`` (a leak that grows under load only, or in bursts:
        the rate of its latest rise and its average since it began are both its rate, and the
        time to OOM lies between them). A floor estimated with requests in flight wanders by
        more than that: its caller passes ``pts`` as the horizon."""
        out = spread(widened(rate, slope), step_margin(pts, rate))
        began = rise_start(horizon, self._min_slope() * self.t.leak_min_span_s)
        if pts and began < pts[0][0]:
            first = next(i for i, p in enumerate(horizon) if p[0] >= began)
            since = _fitted(horizon[first:], horizon_held[first:], True)
            if since is not None:
                out = held_too(out, since)
        return out

    def _sequential(self, raw: int) -> LeakResult | None:
        """Feed the newest floor point to the CUSUM; a verdict when it found a leak, holds one,
        or lets one go (None otherwise)."""
        ts, y = self.points[-1]
        limit = self._limit()
        k = 0.5 * self.t.leak_min_slope_ratio_per_h * limit / 3600.0 * self._bin_s
        if self._count < ROLLING_POINTS:
            return None  # the first points' least-of-five repeats the first one: not a settle
        restarts = self.cusum.restarts
        fired = self.cusum.update(ts, y, raw, k)
        if self.cusum.restarts != restarts:
            self.load.restart(warming=True)  # still warming up: bytes per block learnt so far
            # are stale (load_floor: tokens are kept)
            self.per_request.restart()
        if self._seq is None:
            if not fired or self.cusum.start_ts is None or self._mostly_estimated():
                return None  # an estimated floor's moves are the estimate's: the horizon's
            start = self.cusum.start_ts
            v = confirm([p for p in self.points if p[0] >= start], limit, self.t,
                        self.cusum.noise(), self.cusum.s, self.cusum.h)
            if not v.detected:
                return None
            self._seq, self._seq_start = v, start
            return v
        start = self._seq_start if self._seq_start is not None else ts
        v = confirm([p for p in self.points if p[0] >= start], limit, self.t,
                    self.cusum.noise(), self.cusum.s, self.cusum.h, was_detected=True)
        if v.detected:
            self._seq = v
            return v
        self._seq = self._seq_start = None  # its trend is gone: a new excursion from here
        self.cusum.restart(ts)
        return v

    def _publish(self, verdict: LeakResult, now_s: float, estimated: bool | None = None,
                 points: Sequence[tuple[float, int]] | None = None,
                 loads: Sequence[int] | None = None) -> LeakResult:
        """The verdict with what carries over: the first detection, the windows (the KV
        pool's orphaned blocks go on top of it, in ``result``)."""
        if self._unconfirmed is not None:  # a verdict on the new floor: the reload is past
            self._reload_confirmed()
        prev = self._result
        was = prev.detected and prev.p_value is not None
        first = prev.first_detected_ts_s
        if verdict.detected and first is None:
            first = now_s
        evidence = verdict.evidence
        if self.load.bytes_per_block > 0:
            per = "KV block in use" if self.load.unit == "block" else "KV token held"
            evidence += (f"; residual floor: less {self.load.bytes_per_block / 2**20:.3g} MiB "
                         f"per {per}")
        elif not self._kv_explains() and self.per_request.bytes_per_block > 0:
            evidence += (f"; residual floor: less "
                         f"{self.per_request.bytes_per_block / 2**20:.3g} MiB per request "
                         "in flight")
        estimated = verdict.detected and (self._mostly_estimated() if estimated is None
                                          else estimated)
        if estimated:
            evidence += "; " + (ESTIMATED_WORDS if self.load.kv_used is None
                                else ESTIMATED_UNEXPLAINED_WORDS)
        if self.windows is not None:
            evidence += "; " + self.windows.describe()
        start = verdict.start_ts_s
        if was and prev.start_ts_s is not None and start is not None:
            start = min(start, prev.start_ts_s)  # an old leak began before the horizon
        out = verdict._replace(first_detected_ts_s=first, evidence=evidence, start_ts_s=start,
                               estimated_floor=estimated)
        taken_off = self._taken_off
        if verdict is self._fast:
            self._note_gain(out, now_s, taken_off)
            return out
        self._route = out = self._with_growth(out, points, loads)
        self._route_taken_off = taken_off
        self._note_gain(out, now_s, taken_off)
        held = self._fast
        if held is not None and not out.detected:  # the fast route's leak holds
            return held._replace(first_detected_ts_s=first)
        return out


PEAK_BIN_S = 10.0
PEAK_BINS = 12  # the headroom is under the most allocated of the last two minutes


class RecentPeak:
    """The most allocated memory of the last ``PEAK_BINS`` bins of ``PEAK_BIN_S``: what the
    floor's growth has left to fill is the limit less the peaks above it, not less the floor."""

    def __init__(self) -> None:
        self.bins: deque[tuple[int, int]] = deque()

    def observe(self, ts_s: float, allocated: int) -> None:
        index, bins = int(ts_s // PEAK_BIN_S), self.bins
        if bins and bins[-1][0] == index:
            if allocated > bins[-1][1]:
                bins[-1] = (index, allocated)
            return
        bins.append((index, allocated))
        while bins[0][0] <= index - PEAK_BINS:
            bins.popleft()

    def value(self) -> int:
        return max(b[1] for b in self.bins) if self.bins else 0


def with_orphans(r: LeakResult, k: KvLeak | None) -> LeakResult:
    """The floor's verdict ``r`` with the KV pool's orphaned blocks ``k`` on top: a leak, with
    the pool's count, rate and time to exhaustion in ``kv`` and its words first in the
    evidence. Where the floor found no leak of its own, the slope, its interval, the span, the
    start and the trend line are the pool's (in bytes, where its reports give the bytes per
    block; no time to OOM: blocks lost inside a pool take no memory from the device)."""
    if k is None:
        return r
    first = min(t for t in (r.first_detected_ts_s, k.first_ts_s) if t is not None)
    if r.detected:
        return r._replace(first_detected_ts_s=first, orphaned_blocks=k.blocks, kv=k,
                          evidence=f"{kv_evidence(k)}; and the idle floor: {r.evidence}")
    k = k._replace(sets_slope=True)
    per_block, low, high = k.bytes_per_block, None, None
    if per_block and k.blocks_per_s_low is not None and k.blocks_per_s_high is not None:
        low, high = k.blocks_per_s_low * per_block, k.blocks_per_s_high * per_block
    return r._replace(
        detected=True, slope_bytes_per_s=k.bytes_per_s or 0.0, start_ts_s=k.first_ts_s,
        first_detected_ts_s=first, trend_line=rate_line(k), orphaned_blocks=k.blocks, kv=k,
        span_s=k.last_ts_s - k.first_ts_s, estimated_floor=False, rate_low_bytes_per_s=low,
        rate_high_bytes_per_s=high, time_to_oom_s=None, time_to_oom_low_s=None,
        time_to_oom_high_s=None, growth_bytes=int((k.bytes_per_s or 0.0) * (
            k.last_ts_s - k.first_ts_s)),
        evidence=f"{kv_evidence(k)}; the idle floor: {r.evidence}")


def _fitted(points: Sequence[tuple[float, int]], loads: Sequence[int],
            detected: bool) -> Rate | None:
    """The rate of floor ``points`` with its interval; for a leak on floors estimated with
    requests in flight (``loads``), stretched to hold the rate fitted together with the bytes
    per request too (``growth.rate_interval_with_load``): the floors as corrected and the
    bytes per request fitted beside the rate read it differently (narrower than their
    disagreement, the interval claims a precision the estimate does not give, as
    ``growth.widened`` says of a route's estimators)."""
    rate = rate_interval(points)
    joint = rate_interval_with_load(points, loads) if detected and any(loads) else None
    return held_too(rate, joint) if rate is not None and joint is not None else rate


def with_rate(r: LeakResult, rate: Rate, headroom_bytes: float) -> LeakResult:
    """``r`` with the interval and the time-to-OOM fields of ``rate``."""
    f = time_to_oom(headroom_bytes, rate)
    return r._replace(rate_low_bytes_per_s=rate.low, rate_high_bytes_per_s=rate.high,
                      time_to_oom_s=None if f is None else f.seconds,
                      time_to_oom_low_s=None if f is None else f.soonest,
                      time_to_oom_high_s=None if f is None else f.latest)


def with_forecast(r: LeakResult, rate: Rate, headroom_bytes: float) -> LeakResult:
    """A route's leak verdict with its rate's interval and time to OOM, in fields and words."""
    words = describe_forecast(time_to_oom(headroom_bytes, rate))
    return with_rate(r._replace(evidence=(f"{r.evidence}; rate {per_hour(rate.low)} to "
                                          f"{per_hour(rate.high)} (90 %), {words}")),
                     rate, headroom_bytes)


def fast_verdict(rate: Rate, headroom_bytes: float, limit_bytes: int,
                 min_slope: float) -> LeakResult:
    """The fast route's leak verdict: fast growth established on the newest floor points. Its
    interval is widened as a route's is: a floor read between requests wanders with their
    timing (on the H100 run by about 1 % over a minute), more than a short stretch's least
    squares sees."""
    rate = widened(rate, rate.slope)
    end = rate.t0 + rate.span_s
    line = ((rate.t0, rate.intercept), (end, rate.intercept + rate.slope * rate.span_s))
    se = (rate.slope - rate.low) / Z_90
    p = 0.5 * math.erfc((rate.slope - min_slope) / se / math.sqrt(2.0)) if se > 0 else 0.0
    pct = 100.0 * rate.slope * 3600.0 / limit_bytes
    words = describe_forecast(time_to_oom(headroom_bytes, rate))
    evidence = (f"leak (growth): the floor rises {per_hour(rate.slope)} ({per_hour(rate.low)} "
                f"to {per_hour(rate.high)}, 90 %), {pct:+.2f} %/h of the limit, over its last "
                f"{span_words(rate.span_s)} ({rate.points} points); {words}")
    return with_rate(LeakResult(True, rate.slope, int(rate.slope * rate.span_s), rate.t0, None,
                                evidence, p, line, span_s=rate.span_s), rate, headroom_bytes)


class Gain(NamedTuple):
    """A height a leak answer's line reached, with what its points had taken off for their
    requests in flight put back: ``raw`` bytes at ``load`` requests in flight on average."""

    raw: float
    load: float

    def height(self, per_request: float) -> float:
        """The height read as a line whose points had ``per_request`` bytes taken off for
        each request in flight reads it."""
        return self.raw - per_request * self.load

    @classmethod
    def of(cls, height: float, per_request: float, load: float) -> Gain:
        return cls(height + per_request * load, load)


def mean_load(loads: Sequence[int]) -> float:
    return sum(loads) / len(loads) if loads else 0.0


def load_correction(points: Sequence[tuple[float, int]], loads: Sequence[int],
                    online: float) -> float:
    """The bytes per request in flight taken off ``points`` (0 where none had any): what the
    points themselves show (``stats.load_coefficient``), else the ``online`` estimate."""
    if not any(loads):
        return 0.0
    fitted = load_coefficient([p[0] for p in points], [float(p[1]) for p in points], loads)
    return online if fitted is None else fitted


def corrected(points: Sequence[tuple[float, int]], loads: Sequence[int],
              per_request: float) -> list[tuple[float, int]]:
    """``points`` less ``per_request`` bytes for each of their requests in flight."""
    if not any(loads):
        return list(points)
    return [(t, int(y - per_request * n)) for (t, y), n in zip(points, loads)]


def load_corrected(points: Sequence[tuple[float, int]], loads: Sequence[int],
                   online: float) -> list[tuple[float, int]]:
    """``points`` less what their requests in flight (``loads``) hold: the bytes per request
    the points themselves show (``stats.load_coefficient``), else the ``online`` estimate."""
    return corrected(points, loads, load_correction(points, loads, online))


def _rolled(bins: Sequence[tuple[float, int, int]],
            width_s: float) -> list[tuple[float, int, int]]:
    """Each bin's point as the trend rolls it: of the bins of the last ``width_s``, the one of
    the lowest load (idle first), then the least value."""
    out = []
    for i, (ts, _, _) in enumerate(bins):
        window = [b for b in bins[max(0, i - ROLLING_POINTS + 1):i + 1] if b[0] > ts - width_s]
        load, value = min((b[1], b[2]) for b in window)
        out.append((ts, load, value))
    return out


def confirm(points: Sequence[tuple[float, int]], limit_bytes: int, t: Thresholds,
            noise: float, cusum: float, h: float, was_detected: bool = False) -> LeakResult:
    """The sequential test's verdict over the floor points since its change point. Pure.

    A crossing is a leak when, over at least ``MIN_CONFIRM_S`` of floor, Mann–Kendall finds a rise
    with p < ``P_CONFIRM``, the Theil–Sen slope is at least the minimum over them and over their
    second half (a step followed by a plateau fails here), and the growth is at least
    ``MIN_GROWTH_NOISE`` times the noise. ``was_detected``: it holds while the points still rise
    (p < ``P_RECENT``) at half the minimum slope or more.
    """
    n = len(points)
    span = points[-1][0] - points[0][0] if points else 0.0
    if n < 4 or (not was_detected and span < MIN_CONFIRM_S):
        return NO_VERDICT._replace(evidence=f"sequential test: {span / 60:.1f} min of floor "
                                   "since the change point, too little to confirm")
    t0 = points[0][0]
    xs = [p[0] - t0 for p in points]
    ys = [float(p[1]) for p in points]
    trend = theil_sen(xs, ys)
    test = mann_kendall(ys, trend.slope * (xs[-1] / max(1, n - 1)))
    r_trend = theil_sen(xs[n // 2:], ys[n // 2:])
    min_slope = t.leak_min_slope_ratio_per_h * limit_bytes / 3600.0
    growth = trend.slope * xs[-1]
    if was_detected:
        checks = (test.p_rising < P_RECENT, trend.slope >= min_slope / 2, True, True)
    else:
        checks = (test.p_rising < P_CONFIRM, trend.slope >= min_slope,
                  r_trend.slope >= min_slope, growth >= MIN_GROWTH_NOISE * noise)
    pct_h = 100.0 * trend.slope * 3600.0 / limit_bytes
    verdict = _verdict_word(checks)
    evidence = (f"{verdict} (sequential test): CUSUM {cusum / 2**20:.3g} MiB over a threshold "
                f"of {h / 2**20:.3g} MiB ({H_SIGMA:g} x the floor noise {noise / 2**20:.3g} MiB, "
                f"or the minimum slope's rise); since the change point at {t0:.3f} the floor "
                f"moved {growth / 2**20:+.1f} MiB over {n} points ({pct_h:+.3f} %/h of the "
                f"limit, Theil-Sen); Mann-Kendall p={test.p_rising:.2g}")
    line = ((t0, trend.intercept), (points[-1][0], trend.intercept + growth))
    slope, start = trend.slope, t0
    if all(checks):
        slope, knee = leak_rate(xs, ys, slope, test.variance_factor)
        if knee is not None:
            start = t0 + knee
        evidence += _rate_words(slope, None if knee is None else start, limit_bytes)
    return LeakResult(all(checks), slope, int(growth), start, None, evidence,
                      test.p_rising, line)


def evaluate_floor(points: Sequence[tuple[float, int]], limit_bytes: int, t: Thresholds,
                   was_detected: bool = False) -> LeakResult:
    """One verdict over floor points (already past warm-up). Pure; see the module docstring.

    ``was_detected``: the previous verdict was a leak; it then stays one while the whole
    horizon still rises (p < ``P_RECENT``) at half the minimum slope or more.
    """
    span = points[-1][0] - points[0][0] if points else 0.0
    if len(points) < MIN_FIT_POINTS or span < t.leak_min_span_s:
        return insufficient(t, span)
    t0 = points[0][0]
    xs = [p[0] - t0 for p in points]
    ys = [float(p[1]) for p in points]
    trend = theil_sen(xs, ys)
    test = mann_kendall(ys, trend.slope * (xs[-1] / max(1, len(xs) - 1)))
    recent = len(points) - len(points) // 3
    r_trend = theil_sen(xs[recent:], ys[recent:])
    r_test = mann_kendall(ys[recent:])
    steady = still_rising(xs, ys, trend.slope)
    min_slope = t.leak_min_slope_ratio_per_h * limit_bytes / 3600.0
    growth = trend.slope * span
    noise = 1.4826 * median([abs(y - (trend.slope * x + trend.intercept)) for x, y in zip(xs, ys)])
    if was_detected:  # hysteresis: a leak found stays found until its trend is gone
        checks = (test.p_rising < P_RECENT, trend.slope >= min_slope / 2, True, True)
    else:
        checks = (test.p_rising < P_LEAK, trend.slope >= min_slope,
                  r_test.p_rising < P_RECENT and r_trend.slope >= min_slope and steady,
                  growth >= MIN_GROWTH_NOISE * noise)
    line = ((t0, trend.intercept), (points[-1][0], trend.intercept + growth))
    evidence = _evidence(points, trend.slope, growth, test, r_test, limit_bytes, checks)
    start, slope = rise_start(points), trend.slope
    if all(checks):
        slope, knee = leak_rate(xs, ys, slope, test.variance_factor)
        if knee is not None:
            start = max(start, t0 + knee)
        evidence += _rate_words(slope, None if knee is None else t0 + knee, limit_bytes)
    return LeakResult(all(checks), slope, int(growth), start, None, evidence,
                      test.p_rising, line)


def leak_rate(xs: Sequence[float], ys: Sequence[float], slope: float,
              variance_factor: float) -> tuple[float, float | None]:
    """The leak's own rate and where its rise began (None: the whole span).

    Since the knee of a broken-stick fit (``stats.hinge_fit``) where the knee is more than the
    noise (its F over the autocorrelation's ``variance_factor`` at least ``F_KNEE``), else over
    the span: the least-squares slope there, where it lies in the Theil–Sen slope's confidence
    band over the same points, else the Theil–Sen slope. Least squares reads a leak's average
    rate, where the median pair slope of a leak in steps or only under load reads the flat
    stretches between its rises; the band keeps it from a stretch of floor that is off (a
    residual floor read while the bytes per KV block were still being learnt). ``slope``, the
    detection test's Theil–Sen slope, where neither gives a rise."""
    hinge = hinge_fit(xs, ys, MIN_FIT_POINTS)
    knee = hinge.knee if hinge.f >= F_KNEE * max(1.0, variance_factor) else None
    part = [(x, y) for x, y in zip(xs, ys) if knee is None or x >= knee]
    px, py = [p[0] for p in part], [p[1] for p in part]
    squares = hinge_fit(px, py, len(px)).slope  # one knee, the first: the straight line
    robust = theil_sen(px, py)
    rate = squares if robust.slope_low <= squares <= robust.slope_high else robust.slope
    return (rate, knee) if rate > 0 else (slope, None)


def _rate_words(rate: float, knee_ts: float | None, limit_bytes: int) -> str:
    where = "over the span" if knee_ts is None else f"since the rise began at {knee_ts:.3f}"
    return f"; its rate {100.0 * rate * 3600.0 / limit_bytes:+.3f} %/h of the limit {where}"


def rise_start(points: Sequence[tuple[float, int]], least_rise: float = 0.0) -> float:
    """When the floor left its starting level: the last point no higher than the median of
    the first five plus twice the step-to-step noise, or ``least_rise`` where that is more
    (the horizon's start for a steady rise)."""
    ys = [p[1] for p in points]
    base = median(ys[:5])
    diffs = [b - a for a, b in zip(ys, ys[1:])]
    mid = median(diffs)
    noise = 1.4826 * median([abs(d - mid) for d in diffs]) / 2 ** 0.5
    last = max((i for i, y in enumerate(ys) if y <= base + max(2 * noise, least_rise)),
               default=0)
    return points[last][0]


def rising_recently(points: Sequence[tuple[float, int]], min_slope: float,
                    shortest_s: float, loads: Sequence[int] = ()) -> tuple[float, Rate] | None:
    """The newest stretch of ``points`` (the last ``shortest_s``, doubled up to all of them) whose
    rate interval does not lie below ``min_slope``, with that interval; None when every stretch
    rules such a rise out. ``no_leak`` is a claim about now: a stretch too short to tell is a
    reason to wait, not a flat floor. ``loads``: the requests in flight at each point, where
    the points are floors estimated less what those hold: a stretch's rate is then fitted
    together with the bytes per request (``growth.rate_interval_with_load``), so that a load
    climbing through a short stretch, and the error of what was taken off for it, cannot rule
    a rise out."""
    span_s = shortest_s
    while points:
        first = next(i for i, p in enumerate(points) if p[0] >= points[-1][0] - span_s)
        part = points[first:]
        rate = None
        if len(part) >= MIN_FIT_POINTS:
            rate = rate_interval_with_load(part, loads[first:]) if any(loads[first:]) \
                else rate_interval(part)
        if rate is not None and judge(rate, min_slope) != "no_leak":
            return span_s, rate
        if len(part) == len(points):
            return None
        span_s *= 2  # too few points to tell yet: a longer stretch
    return None


CHECK_NAMES = ("not significant", "too slow", "not rising recently", "within noise")


def _verdict_word(checks: tuple[bool, bool, bool, bool]) -> str:
    """"leak", or "no leak (...)" naming the checks that failed (both tests' four, in order)."""
    failed = [name for name, ok in zip(CHECK_NAMES, checks) if not ok]
    return "leak" if not failed else "no leak (" + ", ".join(failed) + ")"


def _evidence(points: Sequence[tuple[float, int]], slope: float, growth: float,
              test: TrendTest, r_test: TrendTest, limit_bytes: int,
              checks: tuple[bool, bool, bool, bool]) -> str:
    hours = (points[-1][0] - points[0][0]) / 3600.0
    pct_h = 100.0 * slope * 3600.0 / limit_bytes
    return (f"{_verdict_word(checks)}: idle floor moved {growth / 2**20:+.1f} MiB over "
            f"{hours:.2f} h "
            f"({pct_h:+.3f} %/h of the limit, Theil-Sen); Mann-Kendall p={test.p_rising:.2g} "
            f"(variance x{test.variance_factor:.1f} for autocorrelation), "
            f"last third p={r_test.p_rising:.2g}")


def detect_leak(samples: Iterable[Sample], events: Iterable[Event] = (),
                config: Mapping[str, Any] | None = None,
                device: int | None = None,
                floor: list[tuple[float, int]] | None = None) -> LeakResult:
    """Run the causal detector over a whole recording of one device; the final verdict, with
    ``first_detected_ts_s`` the first time it would have fired live. ``floor``: a list that
    receives the floor points the detector made (residual where the load explains part of the
    memory: the coordinates of the verdict's trend line)."""
    detector = LeakDetector(Thresholds.from_config(config))
    detector.floor_points = floor
    ever = None
    for rec in merged(samples, events):
        if device is None:
            device = rec.device
        if rec.device != device:
            continue
        r = detector.on_event(rec) if isinstance(rec, Event) else detector.update(rec)
        if r is not None and r.detected and ever is None:
            ever = r
    final = detector.result
    if ever is not None and not final.detected:
        return ever._replace(evidence=f"leak seen earlier, gone at the end: {final.evidence}")
    return final


# idle_floor lives in analysis.floor now; it stays importable from here (a public API)
__all__ = ["INSUFFICIENT", "NO_VERDICT", "FloorTracker", "LeakDetector", "LeakResult", "confirm",
           "detect_leak", "evaluate_floor", "idle_floor", "insufficient", "orphaned_count",
           "rise_start", "with_orphans"]
