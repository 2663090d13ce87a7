"""The trend of the risk model's peaks: a Theil–Sen line, kept only while it still rises.

Apart from the model (``agent/analysis/risk_model.py``) because it is a pure function of the
peaks: which rise is a trend toward the limit, and when a recent acceleration takes over from
the whole span's line. The model forecasts from what this returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from vramscope.agent.analysis.stats import recent_half, still_rising, theil_sen


class Trend(NamedTuple):
    """A line through the peaks with its 90 % slope band, from ``t0``."""

    t0: float
    slope: float
    intercept: float
    slope_low: float
    slope_high: float
    span_s: float  # the span of peaks it was fitted on: the forecast's reach is a multiple
    # an accelerating rise (this trend: the span's recent half) keeps the whole span's trend,
    # the forecast where the recent half's own evidence falls short of the limit
    steady: Trend | None = None


def fit_peaks(peaks: Sequence[tuple[float, float]], span_s: float) -> Trend | None:
    """The peaks' trend, when it rises significantly and still rises in its recent half;
    the recent half's own, carrying the whole span's, when that half rises faster."""
    t0 = peaks[0][0]
    xs, ys = [p[0] - t0 for p in peaks], [p[1] for p in peaks]
    tr = theil_sen(xs, ys)
    if tr.slope_low <= 0:
        return None
    recent = recent_half(xs, ys)
    if not still_rising(xs, ys, tr.slope, recent):
        return None  # flattening: a warm-up or a cache filling up, not a trend to the limit
    steady = Trend(t0, tr.slope, tr.intercept, tr.slope_low, tr.slope_high, span_s)
    if recent.slope_low <= tr.slope:
        return steady
    half = len(xs) // 2
    # accelerating: even the recent half's shallowest slope is steeper than the span's
    # line. A load ramp that began inside the span rises at the recent half's rate, which
    # the whole span's line dilutes with the flat peaks before it (an OOM it foresees only
    # seconds ahead); the model's _time_to_oom holds this forecast to its half span's evidence.
    start = t0 + xs[half]
    return Trend(start, recent.slope, recent.intercept + recent.slope * xs[half],
                 recent.slope_low, recent.slope_high, span_s - xs[half], steady)
