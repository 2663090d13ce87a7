"""KV block pool: usage and time until its free plus cached blocks run out.

Cached blocks are reclaimable, so the pool is exhausted only when *used* blocks reach the
total. The forecast follows the pool's fill trend (a least-squares line over
``TREND_WINDOW_S``, at least ``MIN_RATE_SPAN_S`` of data), or the change over
``RATE_WINDOW_S`` when that says sooner; ``horizon_s`` is how far ahead it may be trusted (the
history the line rests on). Why a trend and not the recent change: docs/analysis.md, "KV
exhaustion".

A new pool is a new pool: a sample whose ``kv_blocks_total`` differs from the one before starts
one (transformers' ``generate_batch`` sizes a pool per call). The rate starts over, and the
summary's peak, total and ratio always come from one pool, the one whose peak usage ratio was
highest (the later on a tie), never the peak of one over the total of another ("47 used of 45").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

from vramscope.agent.records import Sample

TREND_WINDOW_S = 600.0  # the fill trend: ten minutes of used blocks
RATE_WINDOW_S = 30.0  # the recent rate: a burst to the top is caught before any trend shows
MIN_RATE_SPAN_S = 5.0
REBASE_S = 86400.0  # the running sums start again from the window's first reading daily


class KvPoint(NamedTuple):
    ts_s: float
    device: int
    blocks_used: int
    blocks_total: int
    usage_ratio: float
    exhaustion_s: float | None  # None when used blocks are not rising


class KvTracker:
    """Incremental KV exhaustion forecast for one device.

    ``observe(sample)`` updates the figures below (the live engine's per-sample path);
    ``last`` builds the :class:`KvPoint` of the latest KV sample on demand.
    """

    def __init__(self) -> None:
        self._history: deque[tuple[float, int]] = deque()
        self._recent: deque[tuple[float, int]] = deque()  # the last RATE_WINDOW_S of it
        self._t0 = -1.0  # times are taken from here (a reading of the current pool)
        self._sums = [0.0, 0.0, 0.0, 0.0, 0.0]  # n, Σt, Σu, Σt², Σtu over the history
        self.trend_span_s = 0.0  # how long a history the fill trend rests on
        self.horizon_s = 0.0  # how far ahead the forecast may be trusted (0: no trend within)
        # the summary: the pool with the highest peak usage ratio, all three from that pool
        self.peak_blocks_used: int | None = None
        self.peak_blocks_total: int | None = None
        self.peak_usage_ratio: float | None = None
        self.blocks_total: int | None = None  # of the current pool
        self.pool_peak_blocks_used: int | None = None  # of the current pool
        self.pools = 0  # pools seen (a change of the total starts one)
        self.usage_ratio: float | None = None  # of the latest KV sample
        self.exhaustion_s: float | None = None  # None when used blocks are not rising
        self._latest: tuple[float, int, int] | None = None  # ts_s, device, blocks used
        self._last: KvPoint | None = None

    def update(self, s: Sample) -> KvPoint | None:
        return self.last if self.observe(s) else None

    @property
    def last(self) -> KvPoint | None:
        total, ratio = self.blocks_total, self.usage_ratio  # set with _latest
        if self._last is None and self._latest is not None and total is not None \
                and ratio is not None:
            ts_s, device, used = self._latest
            self._last = KvPoint(ts_s, device, used, total, ratio, self.exhaustion_s)
        return self._last

    def observe(self, s: Sample) -> bool:
        """Absorb a sample; True when it carried the pool's block counts."""
        used, total = s.kv_blocks_used, s.kv_blocks_total
        if used is None or not total:
            return False
        ts_s, history = s.ts_s, self._history
        if total != self.blocks_total:
            self._new_pool(total)
        history.append((ts_s, used))
        self._add(ts_s, used, 1.0)
        oldest = ts_s - TREND_WINDOW_S
        while history[0][0] < oldest:
            old_ts, old_used = history.popleft()
            self._add(old_ts, old_used, -1.0)
        recent = self._recent
        recent.append((ts_s, used))
        oldest = ts_s - RATE_WINDOW_S
        while recent[0][0] < oldest:
            recent.popleft()
        self.usage_ratio = usage = used / total
        if self.pool_peak_blocks_used is None or used > self.pool_peak_blocks_used:
            self.pool_peak_blocks_used = used
        if self.peak_usage_ratio is None or usage >= self.peak_usage_ratio:
            self.peak_blocks_used, self.peak_blocks_total = used, total
            self.peak_usage_ratio = usage
        self.exhaustion_s = self._exhaustion_s(used, total)
        self._latest, self._last = (ts_s, s.device, used), None
        return True

    def _new_pool(self, total: int) -> None:
        self.pools += 1
        self.blocks_total = total
        self.pool_peak_blocks_used = None
        self._history.clear()  # the old pool's used blocks are no trend for this one
        self._recent.clear()
        self._sums = [0.0, 0.0, 0.0, 0.0, 0.0]
        self._t0 = -1.0  # set by the first reading of the pool

    def _add(self, ts_s: float, used: int, sign: float) -> None:
        """Add (sign 1) or take out (-1) one reading of the running least-squares sums."""
        if self._t0 < 0:
            self._t0 = ts_s
        elif sign > 0 and ts_s - self._t0 > REBASE_S:  # keep the sums' numbers small
            self._t0, self._sums = self._history[0][0], [0.0, 0.0, 0.0, 0.0, 0.0]
            for old_ts, old_used in list(self._history)[:-1]:
                self._add(old_ts, old_used, 1.0)
        t = ts_s - self._t0
        sums = self._sums
        sums[0] += sign
        sums[1] += sign * t
        sums[2] += sign * used
        sums[3] += sign * t * t
        sums[4] += sign * t * used

    def _exhaustion_s(self, used: int, total: int) -> float | None:
        """The sooner of two forecasts: the fill trend's and the recent rate's (the change over
        the last ``RATE_WINDOW_S``); 0 with every block used; None when neither is rising.
        ``horizon_s`` becomes the trend's span when the trend's forecast falls within it (it may
        be trusted that far ahead), else 0: the recent rate rests on 30 s and is held to the
        configured look-ahead alone."""
        history = self._history
        self.trend_span_s = span = history[-1][0] - history[0][0]
        self.horizon_s = 0.0
        if used >= total:
            return 0.0
        trend = self._trend_forecast(used, total) if span >= MIN_RATE_SPAN_S else None
        if trend is not None and trend <= span:
            self.horizon_s = span
        # the recent rate's forecast (the change over the last RATE_WINDOW_S), inline:
        # this runs for every KV sample
        recent = self._recent
        t_old, used_old = recent[0]
        rate_span = recent[-1][0] - t_old
        rate = None if rate_span < MIN_RATE_SPAN_S or used <= used_old \
            else (total - used) * rate_span / (used - used_old)
        if trend is None or rate is None:
            return rate if trend is None else trend
        return trend if trend <= rate else rate  # the sooner (min: the trend's on a tie)

    def _trend_forecast(self, used: int, total: int) -> float | None:
        """Room above the fill trend (or the latest reading, when higher) over its slope."""
        n, st, su, stt, stu = self._sums
        sxx = stt - st * st / n
        if self.trend_span_s < MIN_RATE_SPAN_S or sxx <= 0:
            return None
        slope = (stu - st * su / n) / sxx
        if slope <= 0:
            return None
        now = self._history[-1][0] - self._t0
        level = su / n + slope * (now - st / n)
        room = total - (used if used > level else level)  # total - max(level, used)
        return (room if room > 0.0 else 0.0) / slope  # max(0.0, room): per KV sample, no calls


def observe_process(kvs: dict[int | None, KvTracker], shown: KvTracker, s: Sample
                    ) -> tuple[bool, KvTracker]:
    """A KV sample into its process's tracker in ``kvs`` (the first process's is ``shown``,
    the device's own until then): whether it carried the pool's block counts, and the tracker
    a device's KV alert and summary speak for, the fullest at its latest sample. One rule for
    the alert engine and the dashboard's summaries, so that both name the same pool."""
    kv = kvs.get(s.pid)
    if kv is None:
        kv = kvs[s.pid] = shown if not kvs else KvTracker()
    changed = kv.observe(s)
    if len(kvs) > 1:
        shown = max(kvs.values(), key=lambda k: (k.usage_ratio or 0.0))
    return changed, shown


def kv_exhaustion(samples: Iterable[Sample], device: int = 0) -> list[KvPoint]:
    """The KV points of one device, in input order."""
    tracker = KvTracker()
    return [p for s in samples if s.device == device and (p := tracker.update(s)) is not None]
