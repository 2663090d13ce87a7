"""The growth model: one rate with its confidence interval, and everything that follows from it.

A floor's rate of growth is estimated by least squares over its points, with a confidence
interval whose width respects the points' autocorrelation (the lag-one correlation ``rho`` of
the residuals: the variance of the slope is scaled by ``(1 + rho) / (1 - rho)``, the effective
count is the points' count divided by that factor, and the quantile is Student's t on the
effective count). From that one interval:

- the **state** (:func:`judge`): ``leak`` once its low end is above the minimum slope, ``no_leak``
  only once its high end is below it, else ``insufficient_data`` (the interval widened to the
  model's error first, :func:`widened`);
- **what is missing** (:func:`more_time_s`): the interval's half-width shrinks as the span to
  the power 3/2 at a steady sampling rate, so the span that tells the rate from the minimum at
  the current noise is ``span x (half-width / |rate - minimum|) ^ (2/3)``: growth far above the
  minimum is told in a minute, one near it needs hours;
- the **time to OOM** (:func:`time_to_oom`): the headroom over the rate, its range the headroom
  over the interval's ends (no latest end where the interval reaches zero).

``fast_growth.FastGrowth`` uses it on a process's newest floor points, warm-up or not, so that
growth that fills the device in minutes is named in about a minute, not after the detector's
durations (a documented warm-up and minimum span, kept for slow leaks).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import islice
from operator import mul
from typing import Any, NamedTuple

from vramscope.agent.analysis.stats import solve, solve3

# a leak's growth figures, by these names in every document that carries them
GROWTH_KEYS = ("rate_low_bytes_per_s", "rate_high_bytes_per_s", "time_to_oom_s",
               "time_to_oom_low_s", "time_to_oom_high_s")
Z_90 = 1.6448536269514722  # a two-sided 90 % interval, as Sen's band on the peaks' trend
RHO_MAX = 0.9  # the lag-one correlation is capped: beyond, the factor says nothing more
MORE_CAP_S = 24 * 3600.0  # "more data" estimates beyond a day read as a day
KNEE_F = 3.84  # a knee's F against the straight line: the 5 % point of chi-squared, 1 d.f.
MODEL_ERROR = 0.15  # a route's leak rate is known within this share of itself at best
STEP_SHARE = 0.5  # one rise between floor points making this share of a stretch's rise: a step


class Rate(NamedTuple):
    """A least-squares rate in bytes per second with its 90 % interval (``low``, ``high``)."""

    slope: float
    low: float
    high: float
    span_s: float
    points: int
    effective_points: float
    noise_bytes: float  # the residuals' standard deviation
    t0: float = 0.0  # the first point's time: the line is intercept + slope x (ts - t0)
    intercept: float = 0.0

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2.0


class Forecast(NamedTuple):
    """Seconds until the headroom is used up: central, soonest (the interval's high rate) and
    latest (its low rate; None where the interval reaches zero growth)."""

    seconds: float
    soonest: float
    latest: float | None


def t_quantile(z: float, dof: float) -> float:
    """Student's t quantile from the normal one (Cornish–Fisher, good to 1 % from 3 d.f.)."""
    if dof <= 0:
        return math.inf
    z3, z5 = z ** 3, z ** 5
    return z + (z3 + z) / (4 * dof) + (5 * z5 + 16 * z3 + 3 * z) / (96 * dof * dof)


def rate_interval(points: Sequence[tuple[float, float]], noise: float = 0.0) -> Rate | None:
    """The least-squares rate of ``(ts_s, bytes)`` points with its autocorrelation-respecting
    interval; None for fewer than 4 points or no span. ``noise``: the least standard deviation
    a point is taken to have (a short stretch of a noisy floor can look clean)."""
    n = len(points)
    if n < 4:
        return None
    t0 = points[0][0]
    xs = [p[0] - t0 for p in points]
    ys = [float(p[1]) for p in points]
    mx, my = sum(xs) / n, sum(ys) / n
    # the deviations once, and the sums over them in C (map): the same terms added in the same
    # order as the generators they replace, so the same figures (the fast route fits a few
    # suffixes per floor point)
    dx = [x - mx for x in xs]
    sxx = sum(map(pow, dx, [2] * n))  # (x - mx) ** 2
    if sxx <= 0:
        return None
    slope = sum(map(mul, dx, [y - my for y in ys])) / sxx
    res = [y - my - slope * d for d, y in zip(dx, ys)]
    return autocorrelated_interval(slope, res, 2, 1.0 / sxx, noise, xs[-1], t0,
                                   my - slope * mx)


def autocorrelated_interval(slope: float, residuals: Sequence[float], coefficients: int,
                            unit_variance: float, noise: float, span_s: float, t0: float,
                            intercept: float) -> Rate:
    """The 90 % interval of a least-squares ``slope`` from its fit's ``residuals`` (time order):
    the lag-one correlation ``rho`` of the residuals scales the slope's variance by
    ``(1 + rho) / (1 - rho)`` and divides the effective count by the same factor; the quantile
    is Student's t on the effective count less the fit's ``coefficients``. ``unit_variance``:
    the slope's variance per unit of the residuals' variance (the rate's diagonal element of
    the inverse normal matrix); ``noise``: the least standard deviation a point is taken to
    have. The one interval of :func:`rate_interval` and :func:`rate_interval_with_load`."""
    n = len(residuals)
    ssr = sum(map(mul, residuals, residuals))
    rho = 0.0
    if ssr > 0:
        rho = max(0.0, min(RHO_MAX, sum(map(mul, residuals, islice(residuals, 1, None))) / ssr))
    factor = (1 + rho) / (1 - rho)
    effective = n / factor
    sigma2 = max(ssr / (n - coefficients), noise * noise)
    se = math.sqrt(sigma2 * unit_variance * factor)
    q = t_quantile(Z_90, effective - coefficients)
    return Rate(slope, slope - q * se, slope + q * se, span_s, n, effective, math.sqrt(sigma2),
                t0, intercept)


def rate_interval_with_load(points: Sequence[tuple[float, float]],
                            loads: Sequence[int]) -> Rate | None:
    """The rate of floors estimated with requests in flight (``loads``: how many at each
    point), fitted together with what each request holds: ``bytes = a + rate x t + c x load``
    by least squares on the points themselves. The rate's interval then carries what is not
    known of ``c`` where the load rose or fell over the points (a load that climbs through a
    stretch moves its floor by ``c``'s error times the climb), which an interval over floors
    corrected by a ``c`` taken as exact leaves out. The interval is :func:`rate_interval`'s
    (:func:`autocorrelated_interval`, less the one more coefficient). :func:`rate_interval`
    where the load did not vary; None for fewer than 5 points or a load that moved with the
    time alone (no rate to tell from it)."""
    n = len(points)
    if len(set(loads)) < 2:
        return rate_interval(points)
    if n < 5 or len(loads) != n:
        return None
    t0 = points[0][0]
    rows = [(1.0, p[0] - t0, float(q)) for p, q in zip(points, loads)]
    ys = [float(p[1]) for p in points]
    xtx = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    xty = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(3)]
    coef = solve3(xtx, xty)
    unit = solve3(xtx, [0.0, 1.0, 0.0])  # the rate's column of the inverse
    if coef is None or unit is None or unit[1] <= 0:
        return None
    res = [y - sum(c * x for c, x in zip(coef, r)) for r, y in zip(rows, ys)]
    return autocorrelated_interval(coef[1], res, 3, unit[1], 0.0, rows[-1][1], t0, coef[0])


def rate_interval_beside(points: Sequence[tuple[float, float]],
                         covariates: Sequence[Sequence[float]]) -> Rate | None:
    """The rate of ``points`` fitted beside other causes of their memory: ``bytes = a + rate x
    t + sum(c_k x covariate_k)`` by least squares, each covariate a sequence with a value per
    point (the requests in flight, their ages). The interval is :func:`rate_interval`'s
    (:func:`autocorrelated_interval`, less the fit's coefficients): where a covariate rose with
    the time alone it carries the rate's doubt, as with :func:`rate_interval_with_load`.
    Covariates that did not vary are left out (:func:`rate_interval` where none did); None for
    fewer points than the fit's coefficients and 2, or a singular fit."""
    n = len(points)
    if any(len(c) != n for c in covariates):
        raise ValueError("a covariate needs one value per point")
    moving = [c for c in covariates if len(set(c)) > 1]
    if not moving:
        return rate_interval(points)
    k = 2 + len(moving)
    if n < k + 2:
        return None
    t0 = points[0][0]
    rows = [[1.0, p[0] - t0, *(float(c[i]) for c in moving)] for i, p in enumerate(points)]
    ys = [float(p[1]) for p in points]
    xtx = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
    xty = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(k)]
    coef = solve(xtx, xty)
    unit = solve(xtx, [1.0 if i == 1 else 0.0 for i in range(k)])
    if coef is None or unit is None or unit[1] <= 0:
        return None
    res = [y - sum(c * x for c, x in zip(coef, r)) for r, y in zip(rows, ys)]
    return autocorrelated_interval(coef[1], res, k, unit[1], 0.0, rows[-1][1], t0, coef[0])


def widened(rate: Rate, slope: float) -> Rate:
    """``rate`` reporting ``slope`` (a rate read by another estimator over the same points),
    its interval stretched to hold it and at least ``MODEL_ERROR`` of it either side: the
    estimators of a leak's rate (least squares since a knee, Theil–Sen, over a floor read
    between requests) differ by that much on the same points, and an interval narrower than
    their disagreement claims a precision the floor does not give."""
    margin = MODEL_ERROR * abs(slope)
    return rate._replace(slope=slope, low=min(rate.low, slope - margin),
                         high=max(rate.high, slope + margin))


def step_margin(points: Sequence[tuple[float, int]], rate: Rate) -> float:
    """How far a rate read over ``points`` (``rate``: their least squares) is from the rate
    they added, where the floor rose in steps: the largest rise between two points beyond
    what the line adds over their gap, over the span, where that step made at least
    ``STEP_SHARE`` of the stretch's rise and no fall between points (about the line) came to
    half of it; 0 otherwise (a floor that falls back as far wanders about a line, and the
    interval holds that already). Over a span of stairs the rate is known to a step only:
    where the span's ends fall between the steps adds one or leaves one out (a staircase whose
    first step came at its onset read 0.757 %/h by least squares over its first 33 minutes,
    where it had added 1.02 %/h)."""
    if len(points) < 2 or rate.span_s <= 0:
        return 0.0
    moves = [b[1] - a[1] - rate.slope * (b[0] - a[0]) for a, b in zip(points, points[1:])]
    step, fall = max(moves), max(0.0, -min(moves))
    if step <= 0 or step < STEP_SHARE * rate.slope * rate.span_s or 2 * fall >= step:
        return 0.0
    return step / rate.span_s


def spread(rate: Rate, margin: float) -> Rate:
    """``rate`` with ``margin`` (bytes per second) more either side of its interval."""
    return rate._replace(low=rate.low - margin, high=rate.high + margin)


def held_too(rate: Rate, other: Rate) -> Rate:
    """``rate``'s interval stretched to hold ``other``'s (another reading of the same rate)."""
    return rate._replace(low=min(rate.low, other.low), high=max(rate.high, other.high))


def judge(rate: Rate, min_slope: float) -> str:
    """``leak``, ``no_leak`` or ``insufficient_data``, by where the interval lies, widened to
    the model's error (:func:`widened`): a floor rising at the minimum slope reads a rate
    that wanders about it by more than its least-squares interval says (a leak at exactly
    the minimum read 179.6 to 209.0 MiB/h against a minimum of 204.8 on the long suite), and
    ``no_leak`` is no answer for it."""
    rate = widened(rate, rate.slope)
    if rate.low > min_slope:
        return "leak"
    if rate.high < min_slope:
        return "no_leak"
    return "insufficient_data"


def more_time_s(rate: Rate, min_slope: float) -> float:
    """About how much more floor (seconds) tells the rate from ``min_slope`` at this noise."""
    gap = abs(rate.slope - min_slope)
    if rate.half_width <= 0:
        return 0.0
    if gap <= 0:
        return MORE_CAP_S
    needed = rate.span_s * float((rate.half_width / gap) ** (2.0 / 3.0))
    return min(MORE_CAP_S, max(0.0, needed - rate.span_s))


def time_to_oom(headroom_bytes: float, rate: Rate) -> Forecast | None:
    """Headroom over the rate, its range over the interval's ends; None where not growing."""
    if rate.slope <= 0:
        return None
    room = max(0.0, headroom_bytes)
    high = rate.high if rate.high > rate.slope else rate.slope
    latest = room / rate.low if rate.low > 0 else None
    return Forecast(room / rate.slope, room / high, latest)


def describe_forecast(f: Forecast | None) -> str:
    """``full in about 2 h 10 min (1 h 40 min – 3 h)`` (``– ?`` for no latest end)."""
    return "not filling" if f is None else "full in " + about_span(f)


def about_span(f: Forecast) -> str:
    """``about 2 h 10 min (1 h 40 min – 3 h)``: a forecast's time with its range."""
    latest = "?" if f.latest is None else span_words(f.latest)
    return f"about {span_words(f.seconds)} ({span_words(f.soonest)} – {latest})"


def span_words(seconds: float) -> str:
    """``45 s``, ``12 min``, ``2 h 10 min``, ``3.5 d``: a duration as an operator reads it."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes = seconds / 60.0
    if minutes < 120:
        return f"{minutes:.0f} min"
    hours = int(minutes // 60)
    if hours < 48:
        rest = int(round(minutes - 60 * hours))
        return f"{hours} h" if rest == 0 else f"{hours} h {rest} min"
    return f"{seconds / 86400.0:.1f} d"


def per_hour(bytes_per_s: float) -> str:
    """A rate as the verdicts say it: in B, KiB, MiB or GiB per hour, whichever reads best."""
    per_h = bytes_per_s * 3600.0
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(per_h) >= 10 * scale or (unit == "MiB" and abs(per_h) >= scale):
            return f"{per_h / scale:.1f} {unit}/h"
    return f"{per_h:.0f} B/h"


def leak_words(leak: Mapping[str, Any]) -> str:
    """A leak's rate, its interval and its time to OOM as every text surface says them, from a
    leak document (``vramscope.analysis/1``'s ``leak``, a verdict's): ``about 749.8 MiB/h
    (700.1 to 801.0 MiB/h), full in about 2 h 10 min (1 h 40 min – 3 h)``."""
    per_s = leak.get("slope_bytes_per_s")
    rate = (per_s * 3600.0 if isinstance(per_s, (int, float))
            else leak.get("slope_bytes_per_h") or 0.0)
    text = ("about " if leak.get("estimated_floor") else "") + per_hour(rate / 3600.0)
    low, high = leak.get("rate_low_bytes_per_s"), leak.get("rate_high_bytes_per_s")
    if low is not None and high is not None:
        text += f" ({per_hour(low)} to {per_hour(high)})"
    tto = leak.get("time_to_oom_s")
    if tto is not None:
        text += ", " + describe_forecast(Forecast(tto, leak.get("time_to_oom_low_s") or tto,
                                                  leak.get("time_to_oom_high_s")))
    return text
