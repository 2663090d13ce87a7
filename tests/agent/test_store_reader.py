"""The store's reader: each answer says which tier gave it, on a store retention has aged.

The scripted store (``tests/support/aged_store``) holds a 15-minute window at 10 Hz that
retention has reduced to the per-second tier and the minute rollups (``OLD``), and a second
one at 2 Hz centred on the device's first raw sample (``ACROSS``); each second's minimum is
its first sample, so the tier's minima are exactly what the raw samples held.
"""

from __future__ import annotations

import pytest
from vramscope.agent.records import Event, Phase, Sample
from vramscope.agent.store import Store, reader
from vramscope.agent.store.reader import Span

from tests.support.aged_store import (
    DAY_S,
    GIB,
    HORIZON,
    OLD_S,
    W0,
    floor_at,
    run_retention,
    write_spans,
)

OLD = Span(0, W0, W0 + OLD_S)
ACROSS = Span(0, HORIZON - OLD_S / 2, HORIZON + OLD_S / 2)


@pytest.fixture(scope="module")
def aged(tmp_path_factory):
    store = Store.open(f"sqlite:///{tmp_path_factory.mktemp('reader') / 'a.db'}",
                       host_name="h")
    write_spans(store)
    run_retention(store)
    yield store
    store.close()


def test_a_window_older_than_the_raw_samples_is_read_from_the_per_second_tier(aged):
    read = reader.series(aged, OLD, 300, ("allocated_bytes",))
    assert (read.tier, read.start_s, read.bucket_s, len(read.rows)) == (
        "per-second tier", W0, 3.0, 300)
    # each bucket's minimum is its first second's floor (the tier kept it exactly)
    assert [r["allocated_bytes_min"] for r in read.rows[:2]] == [floor_at(0), floor_at(3)]
    assert read.rows[20]["allocated_bytes_min"] == floor_at(60)  # a minute on: 1 MiB higher


def test_a_window_across_the_horizon_says_both_tiers(aged):
    read = reader.records(aged, ACROSS, ("allocated_bytes", "device_used_bytes"), peaks=False)
    assert (read.tier, read.bucket_s) == ("per-second tier, then raw samples", 1.0)
    tiers = {s.source for s in read.samples if s.ts_s < HORIZON}
    assert tiers == {"torch", "nvml"}  # each second's minima, of each source
    assert min(s.ts_s for s in read.samples if s.ts_s >= HORIZON) == HORIZON


def test_a_day_is_read_from_the_minute_rollups_and_a_week_from_their_ten_minute_groups(aged):
    day = reader.series(aged, Span(0, W0, W0 + DAY_S), 2000, ("allocated_bytes",))
    assert day.tier == "per-minute rollups, then raw samples grouped in SQL"
    assert (day.start_s, day.bucket_s) == (W0, DAY_S / 2000)  # 43.2 s buckets, as asked
    assert len(day.rows) == OLD_S // 60  # the 15 old minutes: one row each
    week = reader.series(aged, Span(0, W0, W0 + 7 * DAY_S), 2000, ("allocated_bytes",))
    assert week.tier == "ten-minute rollups, then raw samples grouped in SQL"
    assert week.bucket_s == 600.0 and week.start_s == W0 // 600 * 600


def test_records_of_a_long_window_are_buckets_of_the_width_ladder(aged):
    read = reader.records(aged, Span(0, W0, W0 + DAY_S), ("allocated_bytes",), peaks=True)
    assert (read.tier, read.bucket_s) == ("per-minute rollups, 60 s buckets", 60.0)
    idle = [s for s in read.samples if s.phase is Phase.IDLE]
    assert [s.allocated_bytes for s in idle] == [floor_at(60 * k) for k in range(15)]
    assert [reader.width_for(s, 100) for s in (3600.0, DAY_S, 7 * DAY_S)] == [
        60.0, 1200.0, 7200.0]
    with pytest.raises(reader.WindowTooLong, match="8640000 s"):
        reader.width_for(101 * DAY_S, 100)


def test_the_two_chart_resolutions(aged):
    day = Span(0, W0, W0 + DAY_S)
    floor = reader.extrema(aged, day, ("allocated_bytes",), 600)  # the ladder: a minute
    assert (floor.bucket_s, floor.tier, len(floor.rows)) == (  # 144 s asked: 4-minute buckets
        240.0, "per-minute rollups, then raw samples grouped in SQL", 5)
    headroom = reader.extrema(aged, day, ("allocated_bytes",), 2000, ladder=False)
    assert (headroom.bucket_s, len(headroom.rows)) == (DAY_S / 2000, 15)
    assert {r["allocated_bytes_last"] for r in headroom.rows} == {None}  # minima, maxima only


def test_peaks_start_on_a_ten_minute_boundary(aged):
    read = reader.peaks(aged, OLD, ("allocated_bytes", "device_total_bytes"))
    assert read.from_s == W0 // 600 * 600
    # the last minute's decode seconds: its floor, 2 GiB above it, and the 10th sample's 9 MiB
    assert read.values == {"allocated_bytes": floor_at(OLD_S - 1) + 2 * GIB + 9 * 2**20,
                           "device_total_bytes": 80 * GIB}


def test_the_request_rate_says_where_it_counted(aged):
    """Retention counted the minutes up to the end of the newest one it rolled up (H + 480 s,
    the 2 Hz span's last); six requests after it are read as raw events."""
    aged.write((), [Event(HORIZON + 900.0 + k, "request_start", 0) for k in range(6)])
    rate = reader.requests(aged, Span(0, HORIZON + 300, HORIZON + 1200), 60.0)
    assert rate.tier == "event counts, then raw events"
    assert rate.per_min == [0.0] * 10 + [6.0] + [0.0] * 4
    assert reader.requests(aged, Span(0, HORIZON, HORIZON + 480), 60.0).tier == "event counts"
    assert rate.document() == {
        "bucket_s": 60.0, "ts": rate.ts, "per_min": rate.per_min}


def test_a_process_is_answered_for_where_raw_samples_keep_it(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 'p.db'}", host_name="h")
    store.write([Sample(100.0 + k, 0, Phase.IDLE, "torch", pid, allocated_bytes=pid * 10 + k,
                        reserved_bytes=GIB) for k in range(10) for pid in (7, 8)])
    both = reader.process_series(store, Span(0, 100.0, 110.0), 10)
    assert ([s.pid for s in both.series], both.tier) == ([7, 8], "raw samples grouped in SQL")
    mine = reader.process_series(store, Span(0, 100.0, 110.0, process=8), 10)
    assert [s.pid for s in mine.series] == [8] and mine.series[0].rows[0][
        "allocated_bytes_min"] == 80
    with pytest.raises(ValueError, match="reader.series: answers for every process of device 0"):
        reader.series(store, Span(0, 100.0, 110.0, process=8), 10, ("allocated_bytes",))
    store.close()
