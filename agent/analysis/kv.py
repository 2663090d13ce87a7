"""KV block pool: usage and time until its free plus cached blocks run out.

Cached blocks (unreferenced, kept for prefix reuse) are reclaimable, so the pool is exhausted
only when *used* blocks reach the total. The rate is the change of used blocks over the last
``RATE_WINDOW_S`` (at least ``MIN_RATE_SPAN_S`` of data), so one scheduler step does not swing it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

from agent.records import Sample

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
    """Incremental KV exhaustion forecast for one device."""

    def __init__(self) -> None:
        self._history: deque[tuple[float, int]] = deque()
        self.peak_blocks_used: int | None = None
        self.blocks_total: int | None = None
        self.peak_usage_ratio: float | None = None
        self.last: KvPoint | None = None

    def update(self, s: Sample) -> KvPoint | None:
        if s.kv_blocks_used is None or not s.kv_blocks_total:
            return None
        used, total = s.kv_blocks_used, s.kv_blocks_total
        self._history.append((s.ts_s, used))
        while self._history[0][0] < s.ts_s - RATE_WINDOW_S:
            self._history.popleft()
        self.blocks_total = total
        usage = used / total
        if self.peak_blocks_used is None or used > self.peak_blocks_used:
            self.peak_blocks_used = used
        if self.peak_usage_ratio is None or usage > self.peak_usage_ratio:
            self.peak_usage_ratio = usage
        self.last = KvPoint(s.ts_s, s.device, used, total, usage, self._exhaustion_s(used, total))
        return self.last

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
