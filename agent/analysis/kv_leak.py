"""A leak of KV blocks: blocks the pool's bookkeeping check finds orphaned (held by requests the
server no longer runs), how fast they pile up, and when the pool runs out at that rate.

Memory leaked as KV blocks never shows in the idle floor (the pool took its buffer when it was
built; a CPU server has no allocator counters at all), so the verdict reads the pool's own
``kv_orphaned_blocks`` reports: the count is the newest report's (a level, never a sum), the
rate a least-squares line through the counts over ``alerts.leak_horizon_s`` with its 90 %
interval (none before ``MIN_REPORTS``), the time to exhaustion the pool's free and cached
blocks over that rate, and the floor the orphaned bytes at each report (at most
``FLOOR_POINTS``, thinned evenly). docs/analysis.md, "KV pool leaks: orphaned blocks".

Pure and incremental: the live engine and ``analyze`` feed it the same records in the same
order and get the same answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from vramscope.agent.analysis.growth import (
    Forecast,
    about_span,
    leak_words,
    per_hour,
    rate_interval,
    span_words,
    time_to_oom,
)
from vramscope.agent.records import Event, Sample
from vramscope.agent.timefmt import iso_utc

MIN_REPORTS = 4  # reports before a rate (a line's interval needs four points)
KEEP_REPORTS = 256  # reports the rate rests on at most: past it every other one is dropped
FLOOR_POINTS = 120  # floor points a verdict carries at most (thinned the same way)
NAME = "kv_orphaned_blocks"


class KvLeak(NamedTuple):
    """The orphaned blocks of one process's pool at its newest report. Rates per second."""

    blocks: int  # the newest report's count
    reports: int  # reports seen (with a count above zero)
    first_ts_s: float  # the first report's time
    last_ts_s: float  # the newest report's time
    bytes_per_block: int | None  # None: the reports do not say (blocks only)
    blocks_per_s: float | None  # None: fewer than MIN_REPORTS reports
    blocks_per_s_low: float | None
    blocks_per_s_high: float | None
    free_blocks: int | None  # the pool's blocks not in use at its newest KV sample
    exhaustion_s: float | None  # free blocks over the rate; None where the count is not rising
    exhaustion_low_s: float | None  # at the interval's high end
    exhaustion_high_s: float | None  # at its low end (None where the interval reaches zero)
    floor: tuple[tuple[float, int], ...]  # (ts_s, bytes the orphaned blocks hold)
    # the verdict's slope and rate interval are this pool's (the idle floor found no leak of
    # its own): every surface then speaks of the pool's rate
    sets_slope: bool = False

    @property
    def bytes_per_s(self) -> float | None:
        if self.blocks_per_s is None or self.bytes_per_block is None:
            return None
        return self.blocks_per_s * self.bytes_per_block

    def to_json(self) -> dict[str, Any]:
        return {"orphaned_blocks": self.blocks, "reports": self.reports,
                "first_report_ts": self.first_ts_s, "last_report_ts": self.last_ts_s,
                "bytes_per_block": self.bytes_per_block,
                "blocks_per_s": self.blocks_per_s, "blocks_per_s_low": self.blocks_per_s_low,
                "blocks_per_s_high": self.blocks_per_s_high,
                "bytes_per_s": self.bytes_per_s, "free_blocks": self.free_blocks,
                "exhaustion_s": self.exhaustion_s, "exhaustion_low_s": self.exhaustion_low_s,
                "exhaustion_high_s": self.exhaustion_high_s,
                "floor": [[t, b] for t, b in self.floor], "sets_slope": self.sets_slope}


def kv_leak_from_json(doc: Mapping[str, Any] | None) -> KvLeak | None:
    """A :class:`KvLeak` back from :meth:`KvLeak.to_json`; None for none (or a damaged one)."""
    if not isinstance(doc, Mapping):
        return None
    try:
        return KvLeak(int(doc["orphaned_blocks"]), int(doc["reports"]),
                      float(doc["first_report_ts"]), float(doc["last_report_ts"]),
                      doc["bytes_per_block"], doc["blocks_per_s"], doc["blocks_per_s_low"],
                      doc["blocks_per_s_high"], doc["free_blocks"], doc["exhaustion_s"],
                      doc["exhaustion_low_s"], doc["exhaustion_high_s"],
                      tuple((float(t), int(b)) for t, b in doc["floor"]),
                      doc.get("sets_slope") is True)
    except (KeyError, TypeError, ValueError):
        return None


class Thinned:
    """Points of the last ``horizon_s``, at most ``cap``: past it every other one is dropped
    (the newest kept) and each kept point stands for twice as many reports from then on, the
    newest of them (a long leak keeps its whole span, evenly)."""

    def __init__(self, cap: int, horizon_s: float) -> None:
        self.cap, self.horizon_s = cap, horizon_s
        self.points: list[tuple[float, int]] = []
        self._stride = 1  # reports per kept point
        self._skipped = 0  # reports the newest point stands for, beyond its own

    def add(self, ts_s: float, value: int) -> None:
        pts = self.points
        if pts and self._skipped + 1 < self._stride:
            self._skipped += 1
            pts[-1] = (ts_s, value)
            return
        self._skipped = 0
        pts.append((ts_s, value))
        while pts[0][0] < ts_s - self.horizon_s:
            pts.pop(0)
        if len(pts) > self.cap:
            self.points = pts[::-1][::2][::-1]
            self._stride *= 2


class OrphanTrend:
    """One process's orphaned-block reports and its pool's free blocks (see the module)."""

    def __init__(self, horizon_s: float) -> None:
        self._counts = Thinned(KEEP_REPORTS, horizon_s)  # (ts_s, blocks)
        self._floor = Thinned(FLOOR_POINTS, horizon_s)  # (ts_s, bytes they hold)
        self.reports = 0
        self.first_ts_s: float | None = None
        self.blocks = 0
        self.bytes_per_block: int | None = None
        self.free_blocks: int | None = None
        self.version = 0  # moves with every change of the answer: a cached one is stale
        self._leak: KvLeak | None = None

    def observe_sample(self, s: Sample) -> None:
        """A sample with the pool's block counts: the blocks not in use (free or cached)."""
        used, total = s.kv_blocks_used, s.kv_blocks_total
        if used is not None and total:
            free = total - used
            if free < 0:  # max(0, total - used), without the call: read per KV sample
                free = 0
            if free != self.free_blocks:
                self.free_blocks = free
                if self.reports:
                    self.version += 1
                    self._leak = None

    def on_event(self, e: Event, blocks: int) -> bool:
        """A ``kv_orphaned_blocks`` report of ``blocks`` (its current count); True when it was
        taken (a count above zero)."""
        if blocks <= 0:
            return False
        per_block = (e.data or {}).get("bytes_per_block")
        if isinstance(per_block, int) and not isinstance(per_block, bool) and per_block > 0:
            self.bytes_per_block = per_block
        self.reports += 1
        if self.first_ts_s is None:
            self.first_ts_s = e.ts_s
        self.blocks = blocks
        self._counts.add(e.ts_s, blocks)
        if self.bytes_per_block is not None:
            self._floor.add(e.ts_s, blocks * self.bytes_per_block)
        self.version += 1
        self._leak = None
        return True

    def leak(self) -> KvLeak | None:
        """The answer at the newest report (cached until something changes); None before any."""
        if self.first_ts_s is None:
            return None
        if self._leak is not None:
            return self._leak
        points = self._counts.points
        rate = rate_interval(points) if self.reports >= MIN_REPORTS else None
        per_s = low = high = None
        when: tuple[float | None, float | None, float | None] = (None, None, None)
        if rate is not None:
            per_s, low, high = rate.slope, rate.low, rate.high
            f = None if self.free_blocks is None else time_to_oom(self.free_blocks, rate)
            if f is not None:
                when = (f.seconds, f.soonest, f.latest)
        self._leak = KvLeak(self.blocks, self.reports, self.first_ts_s, points[-1][0],
                            self.bytes_per_block, per_s, low, high, self.free_blocks, *when,
                            tuple(self._floor.points))
        return self._leak


def rate_line(k: KvLeak) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """The floor's line at the pool's rate through its newest point, over the floor drawn
    (bytes), for the chart; None without a byte rate or two floor points."""
    per_s = k.bytes_per_s
    if per_s is None or len(k.floor) < 2:
        return None
    (t0, _), (t1, y1) = k.floor[0], k.floor[-1]
    return (t0, y1 - per_s * (t1 - t0)), (t1, float(y1))


def _blocks(per_s: float) -> str:
    return f"{per_s:.3g} blocks/s"


def kv_words(k: KvLeak) -> str:
    """The pool's leak as every text surface says it: ``160 orphaned KV blocks (latest
    check); rising 8 blocks/s (7.9 blocks/s to 8.1 blocks/s, 90 %) = 450.0 MiB/h (444.4 MiB/h
    to 455.6 MiB/h); the pool's 864 free blocks last about 1 min 48 s (1 min 46 s – 1 min
    50 s)``."""
    text = f"{k.blocks} orphaned KV blocks (latest check)"
    low, high = k.blocks_per_s_low, k.blocks_per_s_high
    if k.blocks_per_s is None or low is None or high is None:
        return text + (f"; a rate after {MIN_REPORTS} checks (has {k.reports})")
    text += f"; rising {_blocks(k.blocks_per_s)} ({_blocks(low)} to {_blocks(high)}, 90 %)"
    per_block = k.bytes_per_block
    if per_block is not None:
        text += (f" = {per_hour(k.blocks_per_s * per_block)} ({per_hour(low * per_block)} to "
                 f"{per_hour(high * per_block)})")
    if k.exhaustion_s is not None and k.exhaustion_low_s is not None:
        text += (f"; the pool's {k.free_blocks} free blocks last "
                 + about_span(Forecast(k.exhaustion_s, k.exhaustion_low_s, k.exhaustion_high_s)))
    elif k.free_blocks is not None:
        text += f"; the pool's {k.free_blocks} free blocks are not running out"
    return text


def kv_evidence(k: KvLeak) -> str:
    """The verdict's evidence of the pool's leak (before the floor's own)."""
    return (f"KV pool check: {kv_words(k)}, over {span_words(k.last_ts_s - k.first_ts_s)} of "
            f"{k.reports} checks since {iso_utc(k.first_ts_s)}")


def verdict_words(leak: Mapping[str, Any]) -> str:
    """A leak's rate as the text surfaces say it (``status``, ``analyze``), from a leak
    document (a verdict's, ``vramscope.analysis/1``'s): the floor's (``growth.leak_words``),
    or the KV pool's where its orphaned blocks are the answer, with the pool's beside the
    floor's where both are."""
    k = kv_leak_from_json(leak.get("kv_pool"))
    if k is None:
        return leak_words(leak)
    if k.sets_slope:
        return "KV pool: " + kv_words(k)
    return f"{leak_words(leak)}; KV pool: {kv_words(k)}"


__all__ = ["FLOOR_POINTS", "KEEP_REPORTS", "MIN_REPORTS", "KvLeak", "OrphanTrend",
           "kv_evidence", "kv_leak_from_json", "kv_words", "rate_line", "verdict_words"]
