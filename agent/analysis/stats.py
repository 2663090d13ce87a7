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


def still_rising(xs: Sequence[float], ys: Sequence[float], slope: float) -> bool:
    """The recent half of the series rises at ``STEADY_RATIO`` of ``slope`` (the whole series'
    Theil–Sen slope) or more: growth that slows down (a warm-up, a cache filling up) does not."""
    half = len(xs) // 2
    return theil_sen(xs[half:], ys[half:]).slope >= STEADY_RATIO * slope


def _sen_band(sorted_slopes: list[float], n: int) -> tuple[float, float]:
    """Sen's (1968) distribution-free confidence band from the ranks of the pairwise slopes."""
    count = len(sorted_slopes)
    c = Z_90_TWO_SIDED * math.sqrt(n * (n - 1) * (2 * n + 5) / 18.0)
    lo = max(0, int(math.floor((count - c) / 2.0)))
    hi = min(count - 1, int(math.ceil((count + c) / 2.0)))
    return sorted_slopes[lo], sorted_slopes[hi]


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
    total = 0.0
    for k in range(1, n - 2):
        rho = sum(map(operator.mul, centred, centred[k:])) / denom
        if abs(rho) > bound:
            total += (n - k) * (n - k - 1) * (n - k - 2) * rho
    factor = 1.0 + 2.0 * total / (n * (n - 1) * (n - 2))
    return max(1.0, factor)


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
