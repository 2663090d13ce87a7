"""KV block pool: usage and time until its free plus cached blocks run out.

Cached blocks (unreferenced, kept for prefix reuse) are reclaimable, so the pool is exhausted
only when *used* blocks reach the total. The rate is the change of used blocks over the last
``RATE_WINDOW_S`` (at least ``MIN_RATE_SPAN_S`` of data), so one scheduler step does not swing it.

A new pool is a new pool: a sample whose ``kv_blocks_total`` differs from the one before starts
one (transformers' ``generate_batch`` sizes a pool per call from the memory left). Its used
blocks say nothing about the old pool's, so the rate starts over, and the summary's peak, total
and ratio always come from one pool: the one whose peak usage ratio was highest (the later one
on a tie), never the peak of one pool over the total of another ("47 used of 45").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

from vramscope.agent.records import Sample

RATE_WINDOW_S = 30.0
MIN_RATE_SPAN_S = 5.0


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
        while history[0][0] < ts_s - RATE_WINDOW_S:
            history.popleft()
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
        self._history.clear()  # the old pool's used blocks are no rate for this one

    def _exhaustion_s(self, used: int, total: int) -> float | None:
        t_old, used_old = self._history[0]
        span = self._history[-1][0] - t_old
        if span < MIN_RATE_SPAN_S or used <= used_old:
            return None
        rate = (used - used_old) / span
        return max(0, total - used) / rate


def kv_exhaustion(samples: Iterable[Sample], device: int = 0) -> list[KvPoint]:
    """The KV points of one device, in input order."""
    tracker = KvTracker()
    return [p for s in samples if s.device == device and (p := tracker.update(s)) is not None]
