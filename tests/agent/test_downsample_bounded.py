"""Downsampling bounded by the work, not by the window: where raw rows are still kept but a fine
grid would group too many of them, the per-second tier (up to two hours) or the minute rollups
(beyond) answer, with the minima and maxima the raw rows give."""

from __future__ import annotations

from typing import Any

import pytest
import vramscope.agent.store.downsample as ds
from vramscope.agent.durations import MINUTE_S
from vramscope.agent.records import Phase, Sample
from vramscope.agent.store import Store, maintenance
from vramscope.agent.store.phase_shares import phase_counts

from tests.support.sql_watch import statements_sent

T0 = 1_700_000_040.0  # a minute boundary
COLS = ("allocated_bytes", "reserved_bytes")
HOURS = 3


def _sample(i: int) -> Sample:
    """10 Hz; allocated moves every sample (a sawtooth with a period of 37 samples)."""
    phase = Phase.PREFILL if i % 37 < 3 else Phase.DECODE if i % 37 < 27 else Phase.IDLE
    alloc = 1000 + (i * 7919) % 37 * 10
    return Sample(T0 + i / 10, 0, phase, "torch", 1, allocated_bytes=alloc,
                  reserved_bytes=alloc + 500)


@pytest.fixture
def store(any_url):
    """Three hours of raw samples at 10 Hz, all rolled up but the last ten minutes (as a
    running agent leaves them: retention lags by its grace, raw rows kept a day)."""
    s = Store.open(any_url, host_name="h")
    samples = [_sample(i) for i in range(HOURS * 36_000)]
    for i in range(0, len(samples), 20_000):
        s.write(samples[i:i + 20_000])
    maintenance.rollup_window(s, T0, T0 + HOURS * 3600 - 600)
    yield s
    s.close()


def _minmax(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["ts_s"], *(r[f"{c}_{s}"] for c in COLS for s in ("min", "max"))) for r in rows]


def _raw_only(store: Store, start: float, end: float, grid: tuple[float, float, int]
              ) -> list[dict[str, Any]]:
    g = ds._Grid(*grid, COLS)
    return g.rows(ds._raw(store, ds.device_row_id(store, 0, None), g, start, end, None, True))


def test_an_hour_on_whole_seconds_reads_the_tier_and_the_raw_rows_after_it(store):
    start, end = T0 + 7200, T0 + HOURS * 3600  # the newest hour: its last 10 min not rolled up
    grid = ds.second_grid(start, end, 2000)
    assert grid == (start, 2.0, 1800)
    with statements_sent(store.engine, lambda q: "FROM seconds" in q) as sent:
        rows = ds.downsample(store, 0, start, end, 2000, COLS, None, None, aligned=True)
    assert len(sent) == 2  # the tier's newest minute (one seek), then the hour's 60 rows
    assert _minmax(rows) == _minmax(_raw_only(store, start, end, grid))
    # the first bucket is seconds 0 and 1 of the hour: its last is that of sample 19
    assert rows[0]["allocated_bytes_last"] == _sample(72_019).allocated_bytes


def test_three_hours_of_raw_rows_at_a_fine_grid_read_the_minute_rollups(store, monkeypatch):
    start, end = T0, T0 + HOURS * 3600
    rows = store.timeline(0, start, end, 2000, COLS)  # 5.4 s buckets asked: 108,000 raw rows
    assert ds.raw_rows_over(store, 0, None, start, end)
    # 170 rolled-up minutes, one point each at the bucket of its start; the last ten minutes
    # (not rolled up yet) grouped raw, on the grid asked for
    assert len(rows) == 170 + 600 // 5.4 + 1
    minute = rows[0]
    assert (minute["ts_s"], minute["allocated_bytes_min"], minute["allocated_bytes_max"]) == (
        T0, 1000, 1360)
    monkeypatch.setattr(ds, "RAW_GROUP_LIMIT", 10**9)  # what it was: every raw row grouped
    assert len(store.timeline(0, start, end, 2000, COLS)) == 2000


def test_a_rolled_up_bucket_keeps_the_last_value_of_its_newest_minute(store):
    """Minute buckets of a rolled-up hour: each bucket's last is its minute's last sample (on
    PostgreSQL one primary-key probe per minute, a LATERAL subquery; on SQLite IN lists)."""
    rows = store.timeline(0, T0, T0 + 3600, 60, COLS)
    assert len(rows) == 60
    # the window holds its end: the raw sample at T0 + 3600 is the last bucket's last
    newest = [_sample(600 * m + 599) for m in range(59)] + [_sample(36_000)]
    assert [r["allocated_bytes_last"] for r in rows] == [s.allocated_bytes for s in newest]
    assert [r["reserved_bytes_last"] for r in rows] == [s.reserved_bytes for s in newest]
    # ten-minute buckets: the last of each bucket's newest minute
    rows = store.timeline(0, T0, T0 + 3600, 6, COLS)
    assert [r["allocated_bytes_last"] for r in rows] == [
        *(_sample(6000 * b + 5999).allocated_bytes for b in range(5)),
        _sample(36_000).allocated_bytes]


def test_without_lasts_no_last_value_is_read_and_minima_and_maxima_are_the_same(store):
    """The analysis views read minima and maxima only: ``lasts=False`` skips the query each
    "last" takes (rollups by minute, raw rows by time) and leaves every ``_last`` None."""
    start, end = T0, T0 + HOURS * 3600  # rollups, then the ten raw minutes after them
    with statements_sent(store.engine, lambda q: "last_value" in q or "ts_s IN (" in q) as sent:
        rows = store.timeline(0, start, end, 200, COLS, lasts=False)
    assert sent == []
    assert {r[f"{c}_last"] for r in rows for c in COLS} == {None}
    full = store.timeline(0, start, end, 200, COLS)
    assert _minmax(rows) == _minmax(full) and len(rows) == 182  # 170 minutes, 12 raw buckets
    assert [r["last_ts_s"] for r in rows] == [r["last_ts_s"] for r in full]
    assert full[0]["allocated_bytes_last"] is not None


def test_phase_shares_of_six_hours_count_the_tier_where_raw_rows_are_too_many(store):
    from vramscope.agent.store.reader import SHARE_BUCKETS, Span, _shares_counts

    start, end = T0, T0 + HOURS * 3600
    counts, source = _shares_counts(store, Span(0, start, end))
    assert source == "per-second tier, then samples"
    raw = phase_counts(store, 0, start, end, SHARE_BUCKETS)
    # each second counted in the phase of its last sample: the same totals, a few samples
    # moved at the seconds where the phase changed
    assert sum(sum(b.values()) for b in counts.values()) == HOURS * 36_000
    prefill = sum(b.get("prefill", 0) for b in counts.values())
    assert prefill == pytest.approx(sum(b.get("prefill", 0) for b in raw.values()), rel=0.4)


def _two_sources(i: int) -> list[Sample]:
    """Every second, a torch reading and an NVML one, both with reserved bytes (the NVML one
    higher every seventh second); device used bytes only from NVML, and only in even minutes."""
    ts = T0 + i
    reserved = 2000 + (i * 31) % 17
    nvml = {"reserved_bytes": reserved + (50 if i % 7 == 0 else -50)}
    if (i // 60) % 2 == 0:
        nvml["device_used_bytes"] = 9000 + i % 13
    return [Sample(ts, 0, Phase.DECODE, "torch", 1, allocated_bytes=1000 + i % 11,
                   reserved_bytes=reserved),
            Sample(ts + 0.5, 0, Phase.DECODE, "nvml", None, **nvml)]


@pytest.mark.parametrize("buckets", [40, 27, 13])  # 45, 66.7 and 138 s buckets over 30 minutes
def test_minutes_read_in_key_order_fold_as_the_grouped_sql_does(any_url, monkeypatch, buckets):
    """Buckets under two minutes fold the minute rollups read in key order (no GROUP BY, and
    the last values from the same rows); the grouped SQL with its last-value lookup gives the
    same rows: minima and maxima over minutes and sources, and the last values of the newest
    minute only (the greatest over sources), None where that minute did not measure it."""
    cols = ("allocated_bytes", "reserved_bytes", "device_used_bytes")
    s = Store.open(any_url, host_name="h")
    try:
        s.write([x for i in range(1800) for x in _two_sources(i)])
        maintenance.rollup_window(s, T0, T0 + 1800)
        start, end = T0 + 15.0, T0 + 1785.0
        with statements_sent(s.engine, lambda q: "GROUP BY" in q and "rollups" in q) as sent:
            folded = s.timeline(0, start, end, buckets, cols)
        assert (sent == []) == (1770 / buckets < 2 * MINUTE_S)
        monkeypatch.setattr(ds, "MINUTES_IN_ORDER_BELOW_S", 0.0)
        grouped = s.timeline(0, start, end, buckets, cols)
        assert folded == grouped
        # minute 2 (its own bucket at 45 s): both sources' extremes, the greater last
        if buckets == 40:
            k = int((T0 + 120 - start) / (1770 / buckets))
            row = next(r for r in folded if r["ts_s"] == start + k * 1770 / buckets)
            minute2 = [x for i in range(120, 180) for x in _two_sources(i)]
            assert row["reserved_bytes_max"] == max(x.reserved_bytes for x in minute2)
            assert row["reserved_bytes_min"] == min(x.reserved_bytes for x in minute2)
            assert row["reserved_bytes_last"] == max(x.reserved_bytes for x in _two_sources(179))
            assert row["device_used_bytes_last"] == 9000 + 179 % 13
    finally:
        s.close()
