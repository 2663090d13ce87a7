"""Robust trend statistics in pure Python: Theil–Sen slope and a Mann–Kendall test.

Pure Python on purpose: the sidecar does not depend on numpy, and the same arithmetic must run
live in the agent and offline in ``vramscope analyze`` so that both say exactly the same thing.
Series here are short (a few hundred points at most), so the O(n²) pair loops are cheap.

The Mann–Kendall variance is corrected for autocorrelation as in Hamed & Rao (1998), "A modified
Mann-Kendall trend test for autocorrelated data": memory floors are strongly autocorrelated (a
KV sawtooth, batching cycles), and the plain test calls such wiggles a trend far too often.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from itertools import repeat
from operator import gt, lt, sub, truediv
from typing import NamedTuple

Z_90_TWO_SIDED = 1.6448536269514722  # the slope band is a 90 % confidence interval


class Trend(NamedTuple):
    """A Theil–Sen line ``y = slope * x + intercept`` with Sen's 90 % band on the slope."""

    slope: float
    intercept: float
    slope_low: float
    slope_high: float


class TrendTest(NamedTuple):
    """Mann–Kendall: ``s`` statistic, corrected ``z`` and the one-sided p-value of a rise."""

    s: int
    z: float
    p_rising: float
    variance_factor: float  # Hamed–Rao n/n*; 1.0 means no autocorrelation correction


def median(values: Sequence[float]) -> float:
    return median_sorted(sorted(values))


def median_sorted(ordered: Sequence[float]) -> float:
    """The median of values already sorted (a caller that keeps them sorted skips the sort)."""
    n = len(ordered)
    if n == 0:
        raise ValueError("median of an empty sequence")
    mid = n // 2
    return float(ordered[mid]) if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> Trend:
    """The median of pairwise slopes, robust to up to ~29 % outliers; needs two distinct xs."""
    slopes: list[float] = []
    if len(set(xs)) == len(xs):  # distinct xs (floor points, indexes): every pair, in C loops
        for i in range(len(xs) - 1):
            xi, yi = xs[i], ys[i]
            slopes += map(truediv, map(sub, ys[i + 1:], repeat(yi)),
                          map(sub, xs[i + 1:], repeat(xi)))
    else:
        for i in range(len(xs) - 1):
            xi, yi = xs[i], ys[i]
            slopes += [(y - yi) / (x - xi) for x, y in zip(xs[i + 1:], ys[i + 1:]) if x != xi]
    slopes.sort()
    if not slopes:
        raise ValueError("theil_sen needs at least two points with different x")
    slope = median_sorted(slopes)
    intercept = median([y - slope * x for x, y in zip(xs, ys)])
    low, high = _sen_band(slopes, len(xs))
    return Trend(slope, intercept, low, high)


STEADY_RATIO = 0.5  # the recent half rises at least this share of the whole slope


def recent_half(xs: Sequence[float], ys: Sequence[float]) -> Trend:
    """The Theil–Sen fit of the series' recent half (its points from ``len // 2`` on)."""
    half = len(xs) // 2
    return theil_sen(xs[half:], ys[half:])


def still_rising(xs: Sequence[float], ys: Sequence[float], slope: float,
                 recent: Trend | None = None) -> bool:
    """The recent half of the series rises at ``STEADY_RATIO`` of ``slope`` (the whole series'
    Theil–Sen slope) or more: growth that slows down (a warm-up, a cache filling up) does not.
    ``recent``: the half's fit (``recent_half``), where the caller has it already."""
    return (recent or recent_half(xs, ys)).slope >= STEADY_RATIO * slope


def _sen_band(sorted_slopes: list[float], n: int) -> tuple[float, float]:
    """Sen's (1968) distribution-free confidence band from the ranks of the pairwise slopes."""
    count = len(sorted_slopes)
    c = Z_90_TWO_SIDED * math.sqrt(n * (n - 1) * (2 * n + 5) / 18.0)
    lo = max(0, int(math.floor((count - c) / 2.0)))
    hi = min(count - 1, int(math.ceil((count + c) / 2.0)))
    return sorted_slopes[lo], sorted_slopes[hi]


SHORT_LAGS = 4  # the leak detector's rolling window less one (leaks.ROLLING_POINTS - 1)


def mann_kendall(ys: Sequence[float], slope_per_index: float | None = None) -> TrendTest:
    """Mann–Kendall test for a monotonic rise, with the Hamed–Rao autocorrelation correction.

    ``ys`` are equally spaced. ``slope_per_index`` detrends the series before its rank
    autocorrelation is measured (Theil–Sen per index step); ``None`` estimates it here.
    """
    n = len(ys)
    if n < 4:
        return TrendTest(0, 0.0, 0.5, 1.0)
    s = 0
    for i in range(n - 1):  # the sum of sign(y_j - y_i) over pairs, counted in C loops
        yi, tail = ys[i], ys[i + 1:]
        s += sum(map(lt, repeat(yi), tail)) - sum(map(gt, repeat(yi), tail))
    variance = _variance_with_ties(ys)
    if variance <= 0:
        return TrendTest(s, 0.0, 0.5, 1.0)
    if slope_per_index is None:
        slope_per_index = theil_sen(range(n), ys).slope
    factor = _hamed_rao_factor([y - slope_per_index * i for i, y in enumerate(ys)])
    z = _continuity_z(s, variance * factor)
    return TrendTest(s, z, 0.5 * math.erfc(z / math.sqrt(2.0)), factor)


def _variance_with_ties(ys: Sequence[float]) -> float:
    n = len(ys)
    counts: dict[float, int] = {}
    for y in ys:
        counts[y] = counts.get(y, 0) + 1
    ties = sum(t * (t - 1) * (2 * t + 5) for t in counts.values() if t > 1)
    return (n * (n - 1) * (2 * n + 5) - ties) / 18.0


def _continuity_z(s: int, variance: float) -> float:
    if s > 0:
        return (s - 1) / math.sqrt(variance)
    if s < 0:
        return (s + 1) / math.sqrt(variance)
    return 0.0


def _hamed_rao_factor(residuals: Sequence[float]) -> float:
    """n/n*: inflate the variance by the significant rank autocorrelations (never deflate).

    Negative correlation would shrink the variance and make the test bolder; we keep the factor
    at least 1 so that the correction can only make a false alarm less likely.
    """
    n = len(residuals)
    ranks = _ranks(residuals)
    mean = (n + 1) / 2.0
    centred = [r - mean for r in ranks]
    denom = sum(c * c for c in centred)
    if denom == 0:
        return 1.0
    bound = 1.959963984540054 / math.sqrt(n)
    total = short = 0.0
    for k in range(1, n - 2):
        rho = sum(map(operator.mul, centred, centred[k:])) / denom
        if abs(rho) > bound:
            term = (n - k) * (n - k - 1) * (n - k - 2) * rho
            total += term
            if k <= SHORT_LAGS:
                short += term
    scale = 2.0 / (n * (n - 1) * (n - 2))
    # the short lags alone too: a series made of rolling minima is correlated over their
    # window by construction, and chance negative correlations at long lags must not cancel
    # that (the sum over all lags alone came out at 1 on such series)
    return max(1.0, 1.0 + scale * total, 1.0 + scale * short)


def _ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


HUBER_K = 1.345  # Huber's constant: 95 % efficiency on normal noise
LOAD_FIT_ROUNDS = 8


def load_coefficient(ts: Sequence[float], ys: Sequence[float],
                     loads: Sequence[int]) -> float | None:
    """The bytes per unit of load in ``y = a + b x t + c x load``, fitted robustly (Huber
    weights, iteratively reweighted least squares): ``c``, or None when the load does not vary
    enough to tell it from the time trend (a singular fit)."""
    n = len(ys)
    if n < 4 or len(set(loads)) < 2:
        return None
    t0 = ts[0]
    rows = [(1.0, t - t0, float(q)) for t, q in zip(ts, loads)]
    weights = [1.0] * n
    coef = (0.0, 0.0, 0.0)
    for _ in range(LOAD_FIT_ROUNDS):
        solved = _weighted_least_squares(rows, ys, weights)
        if solved is None:
            return None
        coef = solved
        res = [y - sum(c * x for c, x in zip(coef, r)) for r, y in zip(rows, ys)]
        scale = 1.4826 * median([abs(e) for e in res])
        if scale <= 0:
            break
        k = HUBER_K * scale
        weights = [1.0 if abs(e) <= k else k / abs(e) for e in res]
    return coef[2]


def _weighted_least_squares(rows: Sequence[tuple[float, float, float]], ys: Sequence[float],
                            weights: Sequence[float]) -> tuple[float, float, float] | None:
    """The 3-coefficient weighted least-squares solution (normal equations, :func:`solve3`),
    or None when singular."""
    m = [[0.0] * 3 for _ in range(3)]
    b = [0.0] * 3
    for r, y, w in zip(rows, ys, weights):
        for i in range(3):
            wi = w * r[i]
            for j in range(3):
                m[i][j] += wi * r[j]
            b[i] += wi * y
    return solve3(m, b)


def solve3(m: Sequence[Sequence[float]], b: Sequence[float]
           ) -> tuple[float, float, float] | None:
    """The solution of a 3 x 3 linear system (Gaussian elimination, partial pivoting, rows
    scaled), or None when it is singular."""
    a = [list(row) + [v] for row, v in zip(m, b)]
    scale = [max(abs(v) for v in row[:3]) or 1.0 for row in a]
    for col in range(3):
        pivot = max(range(col, 3), key=lambda i: abs(a[i][col]) / scale[i])
        if abs(a[pivot][col]) <= 1e-12 * scale[pivot]:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        scale[col], scale[pivot] = scale[pivot], scale[col]
        for i in range(col + 1, 3):
            f = a[i][col] / a[col][col]
            for j in range(col, 4):
                a[i][j] -= f * a[col][j]
    out = [0.0, 0.0, 0.0]
    for i in (2, 1, 0):
        out[i] = (a[i][3] - sum(a[i][j] * out[j] for j in range(i + 1, 3))) / a[i][i]
    return out[0], out[1], out[2]


def solve(m: Sequence[Sequence[float]], b: Sequence[float]) -> list[float] | None:
    """The solution of an n x n linear system (:func:`solve3`'s elimination, any n), or None
    when it is singular."""
    n = len(b)
    a = [list(row) + [v] for row, v in zip(m, b)]
    scale = [max(abs(v) for v in row[:n]) or 1.0 for row in a]
    for col in range(n):
        pivot = max(range(col, n), key=lambda i: abs(a[i][col]) / scale[i])
        if abs(a[pivot][col]) <= 1e-12 * scale[pivot]:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        scale[col], scale[pivot] = scale[pivot], scale[col]
        for i in range(col + 1, n):
            f = a[i][col] / a[col][col]
            for j in range(col, n + 1):
                a[i][j] -= f * a[col][j]
    out = [0.0] * n
    for i in range(n - 1, -1, -1):
        out[i] = (a[i][n] - sum(a[i][j] * out[j] for j in range(i + 1, n))) / a[i][i]
    return out


class Hinge(NamedTuple):
    """A broken-stick fit ``y = a + slope x max(0, x - knee)`` of least squares."""

    knee: float  # the first x: a straight line
    slope: float  # since the knee
    f: float  # its F statistic against the straight line (one parameter more); 0 for a line


def hinge_fit(xs: Sequence[float], ys: Sequence[float], min_after: int) -> Hinge:
    """The broken-stick fit of least squares, the knee at one of the points (the first: a
    straight line), at least ``min_after`` points after it. When a leak began inside the
    horizon this is its start and its own rate, not the horizon's slope diluted by the flat
    floor before it; ``f`` says whether the knee is more than the noise. O(n) by suffix sums."""
    n = len(xs)
    if n < 2:
        return Hinge((xs[0] if xs else 0.0), 0.0, 0.0)
    sy = sum(ys)
    syy = sum(y * y for y in ys)
    # suffix sums over the points from i on: count, x, x^2, y, x*y
    best = (math.inf, xs[0], 0.0)
    line = math.inf  # the straight line's (the knee at the first point)
    st = stt = sy_ = sty = 0.0
    for i in range(n - 1, -1, -1):
        x, y = xs[i], ys[i]
        st, stt, sy_, sty = st + x, stt + x * x, sy_ + y, sty + x * y
        k = n - i
        if k < max(2, min_after):
            continue
        knee = xs[i]
        sz = st - k * knee
        szz = stt - 2 * knee * st + k * knee * knee
        szy = sty - knee * sy_
        denom = n * szz - sz * sz
        if denom <= 0:
            continue
        slope = (n * szy - sz * sy) / denom
        a = (sy - slope * sz) / n
        sse = max(0.0, syy - 2 * a * sy - 2 * slope * szy + n * a * a + 2 * a * slope * sz
                  + slope * slope * szz)
        if i == 0:
            line = sse
        if sse < best[0]:
            best = (sse, knee, slope)
    sse, knee, slope = best
    if knee == xs[0] or n <= 3 or not math.isfinite(line):
        return Hinge(knee, slope, 0.0)
    f = math.inf if sse <= 0 else (line - sse) / (sse / (n - 3))
    return Hinge(knee, slope, f)
