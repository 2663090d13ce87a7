"""The peaks' fast rise: a load ramp's rate with its interval, on evidence that scales with it.

The OOM trend of :mod:`vramscope.agent.analysis.risk` fits a minute's peaks over ten minutes
and more: right for a load that creeps up over hours, minutes too late for one that fills the
device in five. This keeps the peaks of short windows (``FINE_PEAK_S``) and asks of their newest
stretch what the floor's growth model asks of the floor: a least-squares rate whose 90 %
interval (autocorrelation respected) says it rises, known within 2x, and a time to the limit
within ``reach`` times the stretch it rests on.

A stretch (shortest first, from ``MIN_POINTS`` peaks on) **establishes** a rise when its
interval's low end is above zero and at least ``PRECISION`` of its rate; it spans
``MIN_SPAN_S`` and rose ``RISE_NOISE`` times the peaks' earlier noise and ``SWING_FACTOR``
times their largest earlier swing over as many windows (``BASELINE_POINTS``: a burst no larger
than the bursts before it is one of them); its newest peak is above every peak since the
process began or its last OOM; its recent half still rises at half its rate and no peak fell by
``FALL_SHARE`` of its rise (static batches' teeth are no ramp); and the limit is within
``reach`` times its span and within ``horizon_s``. Once established it **holds** while the
peaks since its start still rise, and ends when they stop, or with the episode (``clear``).
docs/analysis.md, "OOM risk" (the fast route).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from vramscope.agent.analysis.fast_growth import recent_half_rises
from vramscope.agent.analysis.growth import Rate, rate_interval

FINE_PEAK_S = 15.0  # the fast route's peak window (or the server's trend window, when longer)
KEEP_S = 1800.0  # fine peaks kept: the longest stretch tried
MIN_POINTS = 6
MIN_SPAN_S = 60.0
PRECISION = 0.5  # the interval's low end at least this share of the rate (the forecast to 2x)
RISE_NOISE = 4.0  # the rise, in standard deviations of the peaks before the stretch
BASELINE_POINTS = 120  # the peaks before a stretch its noise is read on (30 min of 15-s peaks)
# the rise, in multiples of the most the peaks before moved over as many windows: tested at every
# window for hours, a wandering series makes a swing beyond its own past now and then
SWING_FACTOR = 2.0
FALL_SHARE = 0.25  # no fall from one peak to the next of this share of the stretch's rise


class PeakRise:
    """Fine peaks of one process's demand and the fast-rise test on them (see the module)."""

    def __init__(self, window_s: float = FINE_PEAK_S) -> None:
        self.window_s = window_s
        self.points: deque[tuple[float, int]] = deque()  # (window start, its peak)
        self._start: float | None = None
        self._end = 0.0
        self._peak = 0
        self.high = 0  # the highest peak that fell out of ``points`` (since the last clear)
        self.rate: Rate | None = None  # the established rise, None while there is none
        self._since: float | None = None  # where the established stretch began

    def add(self, ts_s: float, demand: int) -> bool:
        """One reading; True when it closed a window (a new peak to test)."""
        if self._start is not None and ts_s < self._end:
            if demand > self._peak:
                self._peak = demand
            return False
        closed = self._start is not None
        if closed:
            assert self._start is not None
            self.points.append((self._start, self._peak))
            while self.points[0][0] < self._start - KEEP_S:
                old = self.points.popleft()[1]
                if old > self.high:
                    self.high = old
            step = self.window_s
            self._start += step * ((ts_s - self._start) // step)
        else:
            self._start = ts_s
        self._end, self._peak = self._start + self.window_s, demand
        return closed

    def clear(self) -> None:
        """The episode ended (an OOM): the peaks before it say nothing of the next."""
        self.points.clear()
        self._start, self.rate, self._since, self.high = None, None, None, 0

    def update(self, limit_bytes: float, demand: float, reach: float,
               horizon_s: float) -> Rate | None:
        """Test the newest stretches (a window just closed): the rise established, the one
        held, or None."""
        pts = list(self.points)
        rate = establish(pts, limit_bytes, demand, reach, horizon_s, self.high)
        if rate is None and self._since is not None:
            since = [p for p in pts if p[0] >= self._since]
            held = rate_interval(since)
            rate = held if held is not None and held.low > 0 and recent_half_rises(since, held) \
                else None
        self.rate = rate
        self._since = None if rate is None else rate.t0 if self._since is None \
            else min(self._since, rate.t0)
        return rate


def room_at(rate: Rate, ts_s: float, limit_bytes: float, demand: float) -> float:
    """The bytes left under the limit above the rise's line now (or the demand, if above it)."""
    level = rate.intercept + rate.slope * (ts_s - rate.t0)
    room = limit_bytes - (level if level > demand else demand)
    return room if room > 0.0 else 0.0


def establish(pts: Sequence[tuple[float, int]], limit_bytes: float, demand: float,
              reach: float, horizon_s: float, high: int = 0) -> Rate | None:
    """The shortest newest stretch of ``pts`` that establishes a rise (the module's rules);
    ``high``: the highest peak before ``pts``."""
    for n in _lengths(len(pts)):
        part = pts[-n:]
        if part[-1][1] <= max(high, max((p[1] for p in pts[:-n]), default=0)):
            return None  # no higher than the peaks have been: a load the server has taken
        before = pts[max(0, len(pts) - n - max(n, BASELINE_POINTS)):-n]
        base = rate_interval(before)
        noise = base.noise_bytes if base is not None else 0.0
        rate = rate_interval(part, noise)
        if rate is not None and _rises(part, rate, noise, limit_bytes, demand, reach,
                                       horizon_s) \
                and rate.slope * rate.span_s > SWING_FACTOR * _swing(before, n):
            return rate
    return None


def _swing(before: Sequence[tuple[float, int]], n: int) -> int:
    """The most the peaks before a stretch of ``n`` moved (up or down) over ``n`` peaks: a
    bursty load's bursts rise as fast as a ramp for a minute or two, and a rise no larger than
    they make is one of them."""
    lag = n - 1
    return max((abs(b[1] - a[1]) for a, b in zip(before, before[lag:])), default=0)


def _lengths(count: int) -> list[int]:
    """The stretch lengths tried, shortest first: ``MIN_POINTS``, then half as many more each
    time, and all ``count`` points last."""
    out, n = [], MIN_POINTS
    while n < count:
        out.append(n)
        n += n // 2
    return out + [count] if count >= MIN_POINTS else out


def _rises(part: Sequence[tuple[float, int]], rate: Rate, noise: float, limit_bytes: float,
           demand: float, reach: float, horizon_s: float) -> bool:
    if rate.low <= 0 or rate.low < PRECISION * rate.slope or rate.span_s < MIN_SPAN_S:
        return False
    rise = rate.slope * rate.span_s
    if rise < RISE_NOISE * noise:
        return False  # within how far the peaks wandered before it
    if max(a[1] - b[1] for a, b in zip(part, part[1:])) > FALL_SHARE * rise:
        return False  # a sawtooth (static batches that end, bursts that drain), not a ramp
    fill = room_at(rate, part[-1][0], limit_bytes, demand) / rate.slope
    if fill > reach * rate.span_s or fill > horizon_s:
        return False  # further than its evidence reaches, or the slow trend's business
    return recent_half_rises(part, rate)
