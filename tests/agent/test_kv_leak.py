"""The KV pool's orphaned blocks as a leak of their own (agent/analysis/kv_leak.py): the newest
count, never a sum; a rate in blocks and bytes per second with its interval; the time until the
pool's free blocks run out; a bounded floor on the reports' own times; and, in the leak
detector's verdict, the pool's rate as the slope where the floor found no leak."""

from __future__ import annotations

import pytest
from vramscope.agent.alerts.verdicts import Verdict, verdict_from_json
from vramscope.agent.analysis.kv_leak import (
    FLOOR_POINTS,
    KEEP_REPORTS,
    MIN_REPORTS,
    OrphanTrend,
    kv_leak_from_json,
    kv_words,
    verdict_words,
)
from vramscope.agent.analysis.leaks import LeakDetector
from vramscope.agent.records import Event, Phase, Sample

T0 = 1_800_000_000.0
PER_BLOCK = 16384


def report(ts: float, blocks: int, per_block: int | None = PER_BLOCK) -> Event:
    data = {"blocks": blocks, "block_ids": [], "owners": [], "problems": []}
    if per_block is not None:
        data["bytes_per_block"] = per_block
    return Event(ts, "kv_orphaned_blocks", 0, 9, data=data)


def pool(ts: float, used: int, total: int = 1024) -> Sample:
    return Sample(ts, 0, Phase.IDLE, "kv", 9, kv_blocks_used=used, kv_blocks_total=total)


def fed(events, samples=()) -> OrphanTrend:
    trend = OrphanTrend(7200.0)
    for s in samples:
        trend.observe_sample(s)
    for e in events:
        trend.on_event(e, e.data["blocks"])
    return trend


def test_a_steady_leak_gives_its_rate_and_the_pools_time_to_run_out():
    # 4 blocks every half second: 8 blocks a second, exactly (a straight line)
    trend = fed([report(T0 + 0.5 * i, 4 * (i + 1)) for i in range(40)], [pool(T0, 160)])
    k = trend.leak()
    assert (k.blocks, k.reports, k.bytes_per_block, k.free_blocks) == (160, 40, PER_BLOCK, 864)
    assert (k.blocks_per_s, k.blocks_per_s_low, k.blocks_per_s_high) == pytest.approx((8, 8, 8))
    assert k.bytes_per_s == pytest.approx(8 * PER_BLOCK)
    assert (k.exhaustion_s, k.exhaustion_low_s, k.exhaustion_high_s) == pytest.approx(
        (108.0, 108.0, 108.0))
    assert kv_words(k) == ("160 orphaned KV blocks (latest check); rising 8 blocks/s (8 "
                           "blocks/s to 8 blocks/s, 90 %) = 450.0 MiB/h (450.0 MiB/h to 450.0 "
                           "MiB/h); the pool's 864 free blocks last about 108 s (108 s – 108 s)")


def test_the_count_is_the_newest_report_never_a_sum():
    # a leak of 12 blocks once, reported at every check after it: the count stays 12
    trend = fed([report(T0 + i, 12) for i in range(200)])
    k = trend.leak()
    assert (k.blocks, k.reports) == (12, 200)
    assert k.blocks_per_s == pytest.approx(0.0, abs=1e-9)
    assert k.exhaustion_s is None  # not rising: the pool does not run out
    assert kv_words(k).startswith("12 orphaned KV blocks (latest check); rising 0 blocks/s")


def test_no_rate_before_four_reports():
    trend = fed([report(T0 + i, 4 * (i + 1)) for i in range(MIN_REPORTS - 1)])
    k = trend.leak()
    assert (k.blocks, k.blocks_per_s, k.exhaustion_s) == (12, None, None)
    assert kv_words(k) == "12 orphaned KV blocks (latest check); a rate after 4 checks (has 3)"


def test_without_bytes_per_block_the_rate_is_in_blocks_only():
    trend = fed([report(T0 + i, 2 * (i + 1), per_block=None) for i in range(10)])
    k = trend.leak()
    assert k.blocks_per_s == pytest.approx(2.0)
    assert (k.bytes_per_s, k.floor) == (None, ())
    assert " = " not in kv_words(k)


def test_a_long_leak_keeps_a_bounded_floor_over_its_whole_span():
    n = 5000
    trend = fed([report(T0 + i, i + 1) for i in range(n)])
    k = trend.leak()
    assert len(k.floor) <= FLOOR_POINTS and len(trend._counts.points) <= KEEP_REPORTS
    assert k.floor[0] == (T0, PER_BLOCK)  # the first report stays: the whole span is drawn
    assert k.floor[-1] == (T0 + n - 1, n * PER_BLOCK)  # and the newest
    steps = [b[0] - a[0] for a, b in zip(k.floor, k.floor[1:])]
    assert max(steps) <= 2 * min(steps[:-1])  # evenly thinned (the newest step may be short)
    assert k.blocks_per_s == pytest.approx(1.0)


def test_the_detector_reports_the_pools_rate_where_there_is_no_floor():
    """A CPU server: KV samples and the pool's checks, no allocated memory. The verdict is a
    leak from the first report; its slope and interval are the pool's bytes per second."""
    d = LeakDetector()
    d.update(pool(T0 - 1, 0))
    first = d.on_event(report(T0, 4))
    assert first is not None and (first.state, first.slope_bytes_per_s) == ("leak", 0.0)
    assert first.first_detected_ts_s == T0
    for i in range(1, 10):
        d.update(pool(T0 + 0.5 * i - 0.1, 4 * (i + 1)))
        d.on_event(report(T0 + 0.5 * i, 4 * (i + 1)))
    r = d.result
    assert (r.state, r.orphaned_blocks, r.kv.sets_slope) == ("leak", 40, True)
    assert r.slope_bytes_per_s == pytest.approx(8 * PER_BLOCK)
    assert (r.rate_low_bytes_per_s, r.rate_high_bytes_per_s) == pytest.approx(
        (8 * PER_BLOCK, 8 * PER_BLOCK))
    assert r.time_to_oom_s is None  # blocks lost in the pool take no memory from the device
    assert (r.start_ts_s, r.first_detected_ts_s, r.span_s) == (T0, T0, 4.5)
    assert r.trend_line == ((T0, pytest.approx(4 * PER_BLOCK)), (T0 + 4.5, 40 * PER_BLOCK))
    assert r.evidence.startswith("KV pool check: 40 orphaned KV blocks (latest check); rising "
                                 "8 blocks/s")
    assert "over 4 s of 10 checks since 2027-01-15T08:00:00.000Z; the idle floor: not enough " \
        "data yet" in r.evidence
    assert r.kv.exhaustion_s == pytest.approx((1024 - 40) / 8)


def test_the_verdict_row_keeps_the_pool_and_every_text_surface_says_it():
    d = LeakDetector()
    d.update(pool(T0 - 1, 0))
    for i in range(8):
        d.on_event(report(T0 + i, 3 * (i + 1)))
    r = d.result
    row = Verdict(T0 + 8, 0, "h", 9, r.state, r.slope_bytes_per_s, r.start_ts_s,
                  r.first_detected_ts_s, r.span_s, r.evidence, "", None, (), None, None, None,
                  None, None, None, leak_trend_line=r.trend_line,
                  leak_rate_low_bytes_per_s=r.rate_low_bytes_per_s,
                  leak_rate_high_bytes_per_s=r.rate_high_bytes_per_s, leak_kv=r.kv)
    doc = row.to_json()
    assert doc["leak"]["orphaned_blocks"] == 24
    assert verdict_from_json(doc) == row
    assert kv_leak_from_json(doc["leak"]["kv_pool"]) == r.kv
    assert verdict_words(doc["leak"]) == "KV pool: " + kv_words(r.kv)
    # without the pool (a row written before it), the floor's words: the bare rate
    assert verdict_words({**doc["leak"], "kv_pool": None}) == (
        "168.8 MiB/h (168.8 MiB/h to 168.8 MiB/h)")


def test_the_pools_rate_is_never_the_processes_memory_growth():
    """On a GPU the pool took its buffer at start: allocated memory stays flat while its blocks
    are lost. The verdict's slope is the pool's, but the OOM-risk model gets no growth (no
    time to OOM from blocks that take no device memory)."""
    from vramscope.agent.alerts.engine import AlertEngine

    gib = 2**30
    engine = AlertEngine.from_config(None)
    records: list[Sample | Event] = []
    for i in range(240):  # 8 minutes, one sample every 2 s: past the warm-up, floor points
        t = T0 + 2 * i
        records.append(Sample(t, 0, Phase.IDLE, "torch", 9, allocated_bytes=20 * gib,
                              reserved_bytes=22 * gib, device_total_bytes=80 * gib))
        records.append(pool(t + 0.5, 2 * i))
        records.append(report(t + 1, 2 * (i + 1)))
    engine.feed(records)
    d = engine.devices[0]
    r = d.leaks[9].result
    assert (r.state, r.kv.sets_slope) == ("leak", True)
    assert r.slope_bytes_per_s == pytest.approx(PER_BLOCK)  # a block a second
    assert d.risks[9].growth is None
