"""Fast growth: the growth model on a process's newest floor points, warm-up or not.

Growth that fills the device in minutes is named in about a minute, not after the leak
detector's durations (a documented warm-up and minimum span, kept for slow leaks): a stretch of
the newest floor points whose rate (:func:`growth.rate_interval`) would fill the headroom soon,
tested on a point per floor window (``COARSE``) and on finer points (``FINE``, ``FINE_TOKENS``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

from vramscope.agent.analysis.growth import (
    KNEE_F,
    Rate,
    rate_interval,
    rate_interval_beside,
    rate_interval_with_load,
)
from vramscope.agent.analysis.stats import hinge_fit, theil_sen

FAST_FILL_S = 3600.0  # growth that would fill the headroom within this: the fast route's
FAST_MIN_SPAN_S = 60.0  # the least floor a fast verdict rests on
FAST_SPAN_SHARE = 0.05  # ...and at least this share of its time to fill
FAST_MIN_POINTS = 6
# growth that would fill the headroom within FAST_FINE_FILL_S is also sought on floor points of
# FAST_FINE_FLOOR_S windows (one point per floor window is too few to name it in minutes); a
# slower rise on points that fine is a static batch decoding or a lazy warm-up as often as not
FAST_FINE_FLOOR_S = 15.0
FAST_FINE_FILL_S = 600.0
# ...once it has risen FAST_WARMUP_GROWTH of the limit over FAST_WARMUP_SPAN_S at any age: on
# points that fine a cache refilled in a burst after an idle dip reads as such growth for a
# minute
FAST_PRECISION = 0.5  # the interval's low end at least this share of the rate (a 2x range)
STEADY_SHARE = 0.5  # a stretch's recent half rises at this share of its rate or more
FAST_KEEP_S = 3600.0  # floor points kept (the longest suffix tried)
# a stretch of floors mostly read with requests in flight (never idle, no KV figures: what
# they hold is estimated) must span this much: a wave of static batches lifts them for minutes.
# On the fine points, whose stretch must also have risen a tenth of the limit and fill the
# headroom within FAST_FINE_FILL_S, FAST_FINE_ESTIMATED_SPAN_S (a wave lifts them less fast)
FAST_ESTIMATED_SPAN_S = 300.0
FAST_FINE_ESTIMATED_SPAN_S = 180.0
FAST_HOLD_RATIO = 0.5  # a fast verdict holds while the low end stays above this x minimum
FAST_RISE_NOISE = 4.0  # the rise over the stretch, in standard deviations of the floor before
FAST_STEP_SHARE = 0.5  # no one step between points may make this share of the rise
# A rise that began in a process's first FAST_WARMUP_CAP_S may be its warm-up (caches, graph
# pools, workspaces growing lazily: up to ~10 % of the limit over up to 15 minutes, then flat).
# A warm-up grows in steps (each new segment or pool a jump, flat between) and flattens; it is
# judged from the data, not waited out: a rise early in a process is growth once it has gone on
# FAST_WARMUP_SPAN_S unflattened and either rises steadily (at least FAST_WARMUP_RISING_SHARE
# of the steps between its points rise, and no one step makes FAST_WARMUP_STEP_SHARE of the
# rise: growth, not a warm-up's few jumps) or has outgrown the cap (added FAST_WARMUP_GROWTH of
# the limit, filling the headroom within FAST_WARMUP_FILL_S). The cap bounds where a warm-up
# may begin, not how long it may run: a rise that began in it (the knee of a broken-stick fit
# on the floor since the process began serving) is judged so however late the stretch tried
# begins, until it flattens (then it is no growth at all)
FAST_WARMUP_CAP_S = 900.0
FAST_WARMUP_SPAN_S = 120.0
FAST_WARMUP_GROWTH = 0.10
FAST_WARMUP_FILL_S = 1200.0
FAST_WARMUP_RISING_SHARE = 0.8
FAST_WARMUP_STEP_SHARE = 0.15
# On points finer than a warm-up's jumps come (FAST_FINE_FLOOR_S apart; a warm-up's 8-20 jumps
# over 10-20 minutes are 30 s or more apart on average) a warm-up leaves most steps flat, while
# growth read with a per-request floor's lumps rises at nearly every step, by about its mean:
# there a rise is also steady when at least FAST_WARMUP_RISING_SHARE of its steps rise by
# FAST_FINE_LEAST_STEP of the mean step or more and none is over FAST_FINE_MOST_STEP times it
# (a share of the rise that a few points could not reach, which a rise read on few points fails)
FAST_FINE_LEAST_STEP = 0.25
FAST_FINE_MOST_STEP = 2.5


class FastConfig(NamedTuple):
    """What one series of floor points must show to establish fast growth."""

    fill_cap_s: float  # growth slower than this to fill the headroom is not fast
    least_rise_ratio: float  # the least rise of a stretch, a share of the limit
    least_span_s: float  # the least span of a stretch
    estimated_span_s: float  # ...of a stretch of mostly estimated floors
    # points finer than a warm-up's jumps: its steadiness is read step by step as well
    # (rises_step_by_step)
    resolves_jumps: bool = False
    # the fill cap is met within the rate's interval (its high end), not by the rate itself
    cap_on_interval: bool = True
    # points that move with the load (a lower envelope: envelope.py): the rate found must
    # hold fitted beside the requests in flight and their ages (_apart_from_load)
    fits_load: bool = False


# on a point per floor window, and on the fine points (FAST_FINE_FLOOR_S windows)
COARSE = FastConfig(FAST_FILL_S, 0.0, FAST_MIN_SPAN_S, FAST_ESTIMATED_SPAN_S)
FINE = FastConfig(FAST_FINE_FILL_S, FAST_WARMUP_GROWTH, FAST_WARMUP_SPAN_S,
                  FAST_FINE_ESTIMATED_SPAN_S, resolves_jumps=True, cap_on_interval=False)
# the fine points of a per-request KV cache whose server reports the tokens its requests hold
# (kv_tokens_used, once bytes per token are clear): the floor less bytes per token held does not
# rise as the requests in flight age after an idle moment (one less bytes per request does, for
# minutes), so on points that fine growth filling the headroom within FAST_TOKENS_FILL_S is
# sought, once it has risen FAST_TOKENS_GROWTH of the limit (not a tenth: a 30-minute fill takes
# five minutes to add that much, twice what it is allowed to be named in)
FAST_TOKENS_FILL_S = 3600.0
FAST_TOKENS_GROWTH = 0.02
FINE_TOKENS = FINE._replace(fill_cap_s=FAST_TOKENS_FILL_S, least_rise_ratio=FAST_TOKENS_GROWTH,
                            cap_on_interval=True)
# the lower envelope of a never-idle server without KV figures (envelope.py): the least memory
# per fine window, which moves with the requests in flight and their ages, fitted beside them.
# Its stretch spans FAST_ENVELOPE_SPAN_S at least: on the healthy servers of the long suite
# (13.5 simulated days) a shorter one read a load's wave as growth (2 minutes: 10 episodes,
# all on per-request caches whose requests rose and aged together; 2.5 minutes: none)
FAST_ENVELOPE_SPAN_S = 150.0
ENVELOPE = FastConfig(FAST_FILL_S, 0.0, FAST_ENVELOPE_SPAN_S, FAST_ENVELOPE_SPAN_S,
                      resolves_jumps=True, cap_on_interval=True, fits_load=True)


class FastGrowth:
    """The newest floor points of one process (bounded) and the fast-growth test on them.

    A suffix of the points is *established growth* when its interval's low end is above the
    minimum slope and at least ``FAST_PRECISION`` of its rate; its interval's high end would
    fill the headroom within ``FAST_FILL_S``; it rose at least ``FAST_RISE_NOISE`` times the
    floor's wandering before it (``level_noise``, also the least noise its points are taken
    to have; before a stretch of exact floors, read on exact floors: ``_exact_before``);
    no one step made ``FAST_STEP_SHARE`` of that rise; it spans at least
    ``FAST_MIN_SPAN_S`` (of floors mostly estimated, ``FAST_ESTIMATED_SPAN_S``) and
    ``FAST_SPAN_SHARE`` of that time to fill; the requests in flight did not rise or fall with
    it (beside a floor less the tokens held, where they did, the rate is fitted beside them:
    ``_apart_from_work``); and its recent half still rises at half its rate or more (a warm-up
    is a rise that flattens: it fails here, however early or late it comes; one early in a
    process must also rise steadily or add ``FAST_WARMUP_GROWTH`` of the limit and fill it
    within ``FAST_WARMUP_FILL_S``: ``_past_warmup``).
    Suffixes from the newest ``FAST_MIN_POINTS`` points to ``FAST_KEEP_S`` are tried,
    shortest first.
    """

    def __init__(self, config: FastConfig | None = None) -> None:
        self.config = config or COARSE
        self.points: deque[tuple[float, int]] = deque()
        self.loads: deque[tuple[float, int]] = deque()  # requests in flight at each point
        # the requests in flight beside a floor that had their KV taken off by the tokens they
        # hold (not an estimate of them): a floor that still moves with them holds their
        # activations (prefills overlap more as the load climbs), the load's, not growth
        self.work: deque[tuple[float, int]] = deque()
        # the sum of the ages of the requests in flight at each point (seconds; 0 unknown)
        self.ages: deque[float] = deque()

    def add(self, ts_s: float, value: int, load: int = 0, work: int = 0,
            age_s: float = 0.0) -> None:
        pts, loads = self.points, self.loads
        pts.append((ts_s, value))
        loads.append((ts_s, load))
        self.work.append((ts_s, work))
        self.ages.append(age_s)
        while pts[0][0] < ts_s - FAST_KEEP_S:
            pts.popleft()
            loads.popleft()
            self.work.popleft()
            self.ages.popleft()

    def clear(self) -> None:
        self.points.clear()
        self.loads.clear()
        self.work.clear()
        self.ages.clear()

    def established(self, min_slope: float, headroom_bytes: float, started_ts: float,
                    limit_bytes: float) -> Rate | None:
        """The shortest suffix that establishes fast growth (see the class), else None. A
        suffix that begins within ``FAST_WARMUP_CAP_S`` of ``started_ts`` (the process's
        start) needs ``FAST_WARMUP_SPAN_S`` of floor and ``FAST_WARMUP_GROWTH`` of the limit."""
        pts, loads, work = list(self.points), list(self.loads), list(self.work)
        began: bool | None = None  # began_warming over all the points: one fit per call
        n = FAST_MIN_POINTS
        while n <= len(pts):
            part = pts[-n:]
            warming = part[0][0] < started_ts + FAST_WARMUP_CAP_S
            least = max(FAST_WARMUP_SPAN_S if warming else FAST_MIN_SPAN_S,
                        self.config.least_span_s)
            estimated = 2 * sum(1 for _, held in loads[-n:] if held) > n
            if estimated:  # mostly floors estimated with requests in flight
                least = max(least, self.config.estimated_span_s)
            rate = self._check(part, min_slope, headroom_bytes, least, 0.0)
            if rate is not None:  # the wandering before it (costlier) only widens: read last
                first = max(0, len(pts) - n - max(n, _BASELINE_POINTS))
                if warming:  # a process's weights loading may be among them
                    first = since_serving(loads, first, len(pts) - n)
                before = pts[first:-n]
                if not estimated:  # exact floors wander as exact floors do (_exact_before)
                    before = _exact_before(before, loads[first:-n])
                noise = level_noise(before)
                rate = self._check(part, min_slope, headroom_bytes, least, noise)
            if rate is not None and not _load_moving(loads[-n:]):
                rate = _apart_from_work(part, work[-n:], rate, min_slope)
            else:
                rate = None
            if rate is not None and not warming and began is None:
                began = began_warming(pts, loads, started_ts)
            if rate is not None and (
                    not (warming or began)
                    or _past_warmup(part, rate, headroom_bytes, limit_bytes,
                                    self.config.resolves_jumps)) \
                    and rate.slope * rate.span_s >= self.config.least_rise_ratio * limit_bytes:
                found = _since_knee(part, rate, noise)
                if self.config.fits_load and not self._apart_from_load(
                        found, min_slope, headroom_bytes):
                    return None  # the load's: longer stretches hold it as well
                return found
            n = n + max(1, n // 2)
        return None

    def _apart_from_load(self, rate: Rate, min_slope: float, headroom_bytes: float) -> bool:
        """The points since ``rate``'s start still rise fitted beside the requests in flight
        at them and the sum of their ages (:func:`growth.rate_interval_beside`): its low end
        above ``min_slope`` and at least ``FAST_PRECISION`` of it, its high end filling the
        headroom within the fill cap. A load that grew, or requests that aged together (a
        burst after an idle moment, each request's cache filling as it decodes), lift a lower
        envelope as growth does; fitted beside them, only growth is left in the time's rate."""
        first = next((i for i, (ts, _) in enumerate(self.points) if ts >= rate.t0), 0)
        pts = list(self.points)[first:]
        loads = [n for _, n in list(self.loads)[first:]]
        apart = rate_interval_beside(pts, [loads, list(self.ages)[first:]])
        return apart is not None and apart.low > min_slope \
            and apart.low >= FAST_PRECISION * apart.slope \
            and max(0.0, headroom_bytes) / apart.high <= self.config.fill_cap_s

    def holds(self, since_ts: float, min_slope: float) -> Rate | None:
        """The rate since ``since_ts`` while it still rises (low end above
        ``FAST_HOLD_RATIO`` x the minimum slope); None once it no longer does."""
        pts = [p for p in self.points if p[0] >= since_ts]
        rate = rate_interval(pts[-_HOLD_POINTS:])
        return rate if rate is not None and rate.low > FAST_HOLD_RATIO * min_slope else None

    def _check(self, pts: Sequence[tuple[float, int]], min_slope: float,
               headroom_bytes: float, least_span_s: float, noise: float) -> Rate | None:
        rate = rate_interval(pts, noise)
        if rate is None or rate.low <= min_slope or rate.low < FAST_PRECISION * rate.slope:
            return None
        rise = rate.slope * rate.span_s
        if rise < FAST_RISE_NOISE * noise:
            return None  # within how far the floor wandered before it
        if max(b[1] - a[1] for a, b in zip(pts, pts[1:])) > FAST_STEP_SHARE * rise:
            return None  # one step, not growth (a load that came in at once, a model loaded)
        fill = max(0.0, headroom_bytes) / rate.slope
        # fast where the interval holds a fill within the cap (the hour: growth that fills the
        # headroom in an hour reads as 50 to 70 minutes on a short stretch as often as not);
        # the fine points' shorter cap keeps look-alikes out, and is met by the rate itself
        soonest = max(0.0, headroom_bytes) / (rate.high if self.config.cap_on_interval
                                              else rate.slope)
        if soonest > self.config.fill_cap_s \
                or rate.span_s < max(least_span_s, FAST_SPAN_SHARE * fill):
            return None
        if not recent_half_rises(pts, rate):
            return None  # flattening: a warm-up or a cache filling up
        return rate


def recent_half_rises(pts: Sequence[tuple[float, int]], rate: Rate) -> bool:
    """The stretch's recent half (4 points at least) still rises at ``STEADY_SHARE`` of its
    least-squares ``rate`` or more: a rise that flattens (a warm-up, a cache filling up, a
    burst topping out) is no trend to the limit."""
    recent = rate_interval(pts[min(len(pts) // 2, len(pts) - 4):])
    return recent is not None and recent.slope >= STEADY_SHARE * rate.slope


NO_WORK = -1  # a floor point read without the tokens held taken off: its work is not known
_HOLD_POINTS = 240  # the newest points a held fast verdict is re-measured on
_Q80 = 1.2815515655446004  # |x| of a normal point: 80 % below this x sigma
_BASELINE_POINTS = 30  # the floor's wandering is read on the stretch's length before it, or this


def _since_knee(pts: Sequence[tuple[float, int]], rate: Rate, noise: float) -> Rate:
    """The stretch's rate since the knee of a broken-stick fit where the knee is more than the
    noise (a stretch that holds the last flat points before an onset reads a rate diluted by
    them), else ``rate``."""
    t0 = pts[0][0]
    xs, ys = [p[0] - t0 for p in pts], [float(p[1]) for p in pts]
    hinge = hinge_fit(xs, ys, 4)
    if hinge.knee <= 0 or hinge.f < KNEE_F:
        return rate
    since = rate_interval([p for p in pts if p[0] - t0 >= hinge.knee], noise)
    if since is None or since.slope <= rate.slope or since.low < FAST_PRECISION * since.slope:
        return rate  # no steeper rate since a knee, or one too rough to report
    return since


def _past_warmup(pts: Sequence[tuple[float, int]], rate: Rate, headroom_bytes: float,
                 limit_bytes: float, resolves_jumps: bool = False) -> bool:
    """A rise early in a process that no warm-up makes: steady (on points finer than a
    warm-up's jumps, step by step too), or larger and faster than a warm-up's (see
    FAST_WARMUP_*)."""
    # what the stretch added: its line's rise, but no more than its newest point stands above
    # its first (a warm-up that rose, then flattened, reads a line steeper than its rise)
    added = min(rate.slope * rate.span_s, pts[-1][1] - pts[0][1])
    return rises_steadily(pts, rate) or resolves_jumps and rises_step_by_step(pts, rate) or (
        added >= FAST_WARMUP_GROWTH * limit_bytes
        and max(0.0, headroom_bytes) / rate.slope <= FAST_WARMUP_FILL_S)


def rises_steadily(pts: Sequence[tuple[float, int]], rate: Rate) -> bool:
    """At least ``FAST_WARMUP_RISING_SHARE`` of the steps between the points rise and none
    makes ``FAST_WARMUP_STEP_SHARE`` of the stretch's rise (``rate`` over its span): growth
    spread over every point, not a warm-up's few jumps with flat floor between them."""
    steps = [b[1] - a[1] for a, b in zip(pts, pts[1:])]
    rise = rate.slope * rate.span_s
    return bool(steps) and rise > 0 \
        and sum(1 for d in steps if d > 0) >= FAST_WARMUP_RISING_SHARE * len(steps) \
        and max(steps) <= FAST_WARMUP_STEP_SHARE * rise


def rises_step_by_step(pts: Sequence[tuple[float, int]], rate: Rate) -> bool:
    """At least ``FAST_WARMUP_RISING_SHARE`` of the steps between the points rise by
    ``FAST_FINE_LEAST_STEP`` of the mean step (the stretch's rise, ``rate`` over its span, over
    the steps) or more, and none by more than ``FAST_FINE_MOST_STEP`` times it: growth on every
    step about its mean, lumpy as a per-request floor reads it, where a warm-up seen on points
    finer than its jumps is flat between them."""
    steps = [b[1] - a[1] for a, b in zip(pts, pts[1:])]
    mean = rate.slope * rate.span_s / len(steps) if steps else 0.0
    return mean > 0 \
        and sum(1 for d in steps if d >= FAST_FINE_LEAST_STEP * mean) \
        >= FAST_WARMUP_RISING_SHARE * len(steps) \
        and max(steps) <= FAST_FINE_MOST_STEP * mean


def began_warming(pts: Sequence[tuple[float, int]], loads: Sequence[tuple[float, int]],
                  started_ts: float) -> bool:
    """The rise the newest points are on began within ``FAST_WARMUP_CAP_S`` of
    ``started_ts``: the knee of the broken-stick fit (flat, then rising) on the points since
    the process began serving (:func:`since_serving`) lies there. A lazy warm-up that runs past
    the cap is still the rise it began as; growth that began after it has its knee after."""
    warm_end = started_ts + FAST_WARMUP_CAP_S
    if not pts or pts[0][0] >= warm_end:
        return False  # the points kept no longer reach back into the warm-up
    first = since_serving(loads, 0, len(pts))
    if len(pts) - first < FAST_MIN_POINTS:
        return True
    t0 = pts[first][0]
    hinge = hinge_fit([p[0] - t0 for p in pts[first:]], [float(p[1]) for p in pts[first:]],
                      FAST_MIN_POINTS)
    return t0 + hinge.knee < warm_end


def since_serving(loads: Sequence[tuple[float, int]], first: int, end: int) -> int:
    """Where the floor's wandering before a stretch (points ``first`` to ``end``) is read
    from: the first point with requests in flight, else ``first`` (a process's loading, its
    weights coming in before its first request, is a level reached, not wandering about it:
    early in a process it would hide any growth under it). Where that leaves fewer than
    ``FAST_MIN_POINTS`` no wandering is read (:func:`level_noise`): the stretch's own
    residuals are its noise, and a warm-up's tests (:func:`_past_warmup`) still apply."""
    return next((i for i in range(first, end) if loads[i][1]), first)


def _exact_before(points: Sequence[tuple[float, int]],
                  loads: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    """The ``points`` before a stretch of mostly exact floors that were read exact too (no
    request in flight at them, ``loads``): a floor estimated with requests in flight is off by
    what they hold (their KV in it while bytes per token are not yet clear, a burst draining),
    which is no wandering of the exact floor; early in a process a few of them read as
    gigabytes of "noise" that hid the growth of its first minutes."""
    return [p for p, (_, held) in zip(points, loads) if not held]


def level_noise(points: Sequence[tuple[float, int]]) -> float:
    """How far the floor wanders about its own line before a stretch: the 80th percentile of
    the points' distances from their Theil–Sen line, over that of a normal one (1.2816 sigma;
    0 for fewer than ``FAST_MIN_POINTS``). The percentile keeps the step of a model loading
    among them (a few points) out, and a floor that jumps between two levels with its load in.
    A rise within it is the floor's usual wandering (a never-idle floor follows its load)."""
    if len(points) < FAST_MIN_POINTS:
        return 0.0
    t0 = points[0][0]
    xs, ys = [p[0] - t0 for p in points], [float(p[1]) for p in points]
    try:
        line = theil_sen(xs, ys)
    except ValueError:  # one instant only
        return 0.0
    far = sorted(abs(y - line.slope * x - line.intercept) for x, y in zip(xs, ys))
    return far[int(0.8 * (len(far) - 1))] / _Q80


def _apart_from_work(pts: Sequence[tuple[float, int]], work: Sequence[tuple[float, int]],
                     rate: Rate, min_slope: float) -> Rate | None:
    """The stretch's rate apart from the requests in flight beside a floor less the tokens
    they hold (``work``): ``rate`` where they did not rise or fall significantly; where they
    did, the rate fitted beside what each of them holds (:func:`growth.rate_interval_with_load`),
    if its low end is above ``min_slope`` and at least ``FAST_PRECISION`` of it (a load that
    rose and fell while the floor kept rising tells the two apart; one that rose with the time
    alone does not, and its interval says so); else None. Not fitted where some points had no
    tokens taken off (``NO_WORK``: the floor changed its reading within the stretch)."""
    if not _load_moving([(ts, max(0, n)) for ts, n in work]):
        return rate
    if any(n < 0 for _, n in work):
        return None
    apart = rate_interval_with_load(pts, [n for _, n in work])
    if apart is None or apart.low <= min_slope or apart.low < FAST_PRECISION * apart.slope:
        return None
    return apart


def _load_moving(loads: Sequence[tuple[float, int]]) -> bool:
    """The requests in flight at the points (floors read with requests running: never idle,
    no KV figures) rise or fall significantly: a floor that moves with them may be the load or
    what is estimated of it (a burst draining), which the peaks' trend names, not growth."""
    if not any(n for _, n in loads):
        return False
    rate = rate_interval(loads)
    return rate is not None and (rate.low > 0 or rate.high < 0)
