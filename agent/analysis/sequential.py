"""A sequential test on the floor: a one-sided CUSUM on the floor's increments.

The Mann–Kendall verdict over a two-hour horizon waits for 30 floor points whatever the leak; a
sequential test accumulates evidence point by point, so a fast, clean rise is named after a few
points and a slow one when enough of it has been seen: ``S_i = max(0, S_{i-1} + Δy_i − k)``
with ``k`` half the minimum leak slope per point, firing when ``S_i > h``,
``h = max(H_SIGMA × σ, QUIET_POINTS × 2k)`` (``σ`` the robust noise of one floor point; the
increments of an excursion count as noise only once it falls back to 0 without firing, so a
leak's own rise does not raise its threshold). It is *armed* only once the floor has settled
(``QUIET_POINTS`` points in a row with ``S ≤ h``): a warm-up ramp is not a change. Every
constant and why: docs/analysis.md, "Sequential test". The caller confirms a crossing with the
trend checks on the points since the change point (``leaks.confirm``).
"""

from __future__ import annotations

import math
from collections import deque

from vramscope.agent.analysis.stats import median

H_SIGMA = 8.0
QUIET_POINTS = 8
NOISE_KEEP = 120  # increments the noise is estimated from (the horizon)
MIN_NOISE_STEPS = 4
_Q80 = 1.2815515655446004 * math.sqrt(2.0)  # |Δ| of two N(0, σ²) points: 80 % below this × σ


class Cusum:
    """The CUSUM state of one device's floor (see the module docstring)."""

    def __init__(self, lag: int = 0) -> None:
        # ``lag``: points the tested series trails the raw one by (a least-of-the-last-n floor
        # trails by n - 1): the newest raw moves are not yet in it, so not yet known as noise
        self.lag = lag
        self.s = 0.0
        self.start_ts: float | None = None  # the change point of the current excursion
        self.armed = False
        self.quiet = 0  # consecutive points with S <= h while not armed
        self.h = 0.0  # the threshold at the last point
        self.restarts = 0  # warm-up restarts so far (what was learnt before one is stale)
        self._steps: deque[float] = deque(maxlen=NOISE_KEEP)  # Δ of the raw points
        self._pending: list[float] = []  # Δ of the current excursion (noise once it ends)
        self._last_raw: float | None = None
        self._last_y: float | None = None

    def noise(self) -> float:
        """σ of one floor point from the raw increments (0 before ``MIN_NOISE_STEPS``)."""
        if len(self._steps) < MIN_NOISE_STEPS:
            return 0.0
        mid = median(self._steps)  # a steady rise moves every point: that is not noise
        spread = sorted(abs(d - mid) for d in self._steps)
        return spread[min(len(spread) - 1, int(0.8 * len(spread)))] / _Q80

    def update(self, ts_s: float, y: float, raw: float, k: float) -> bool:
        """Feed a floor point ``y`` (the raw one ``raw`` for the noise) with the drift allowance
        ``k`` per point; True when the armed test crosses its threshold."""
        if self._last_raw is not None:
            self._pending.append(raw - self._last_raw)
        self._last_raw = raw
        prev, self._last_y = self._last_y, y
        self.h = max(H_SIGMA * self.noise(), QUIET_POINTS * 2.0 * k)
        if prev is None:
            self.start_ts = ts_s
            return False
        s = self.s + (y - prev) - k
        if s <= 0:
            self.s, self.start_ts = 0.0, ts_s
            self._settle()  # an excursion that fell back: its moves were noise
        else:
            self.s = s
            if len(self._pending) > NOISE_KEEP + self.lag:  # a long excursion: its oldest moves
                self._steps.append(self._pending.pop(0))
        if self.s <= self.h:
            if not self.armed:
                self.quiet += 1
                self.armed = self.quiet >= QUIET_POINTS and len(self._steps) >= MIN_NOISE_STEPS
            return False
        if not self.armed:  # still warming up: a rise before the floor settled restarts it,
            # and the noise is measured afresh (a warm-up ramp's steps are not the noise)
            self.s, self.start_ts, self.quiet = 0.0, ts_s, 0
            self._steps.clear()
            self._pending.clear()
            self.restarts += 1
            return False
        return True

    def restart(self, ts_s: float) -> None:
        """Start a new excursion (a leak found and then gone: its moves were not noise)."""
        self.s, self.start_ts = 0.0, ts_s
        self._pending.clear()

    def _settle(self) -> None:
        keep = len(self._pending) - self.lag
        if keep > 0:
            self._steps.extend(self._pending[:keep])
            del self._pending[:keep]
