"""The history generator: seeded, closed-form rows, and the tiers retention would have made
(per-second rows and minute rollups), also for the days whose raw rows retention deleted."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select
from vramscope.agent.records import Phase
from vramscope.agent.store import Store, maintenance
from vramscope.agent.store.schema import event_counts, samples, seconds

from tests.support.rollup_rows import read_rollups
from tools.history_generator import GIB, MIB, T_END, History, generate


def test_rows_are_closed_form_and_the_tiers_equal_retentions(any_url):
    h = History(devices=2, hz=1.0, days=600 / 86_400)  # 10 minutes, 1,200 samples
    with Store.open(any_url, host_name="h") as store:
        generate(store, h)
        starts_and_ends = sum((n + 7 * d) % 37 in (0, 27) for d in range(2) for n in range(600))
        assert (store.count("samples"), store.count("events")) == (1200, starts_and_ends)
        first = store.samples(device=1, limit=2)
        assert [s.ts_s for s in first] == [T_END - 600, T_END - 599]
        # device 1, tick 0: cycle place 7 -> decode, 7 busy ticks of 64 MiB
        noise = (1 * 97 + 131) % 1000
        assert first[0].phase is Phase.DECODE and first[0].allocated_bytes == (
            16 * GIB + GIB // 4 + 7 * 64 * MIB + noise * 65536)
        assert store.time_range() == (T_END - 600, T_END - 1)
        generated = _tiers(store)
        _drop_tiers(store)
        maintenance.rollup_window(store, T_END - 600, T_END)
        assert generated == _tiers(store)
        rollups, packed, counts = generated
        assert len(rollups) == 2 * 10 * 13  # devices x minutes x metrics with values
        assert [(r["seconds"], r["source"]) for r in packed] == [(60, "torch")] * 2 * 10
        # the request events' counts per minute: device 0 starts requests at ticks 0 and 37
        # and ends one at 27 in its first minute, then ends at 64 and 101, starts at 74, 111
        assert sum(n for *_, n in counts) == starts_and_ends
        did = counts[0][0]
        assert counts[:4] == [(did, T_END - 600, "request_end", 1),
                              (did, T_END - 600, "request_start", 2),
                              (did, T_END - 540, "request_end", 2),
                              (did, T_END - 540, "request_start", 2)]
        assert maintenance.rollup_watermark(store) == T_END


def test_the_store_it_leaves_holds_no_wal_of_its_bulk_insert(tmp_path):
    """The raw rows go in as one transaction; SQLite keeps its WAL at that size until
    truncated, which would count as disk the agent's own store never holds."""
    path = tmp_path / "week.db"
    with Store.open(f"sqlite:///{path}", host_name="h") as store:
        generate(store, History(devices=2, hz=10.0, days=600 / 86_400))
        assert (store.count("samples"), path.with_name("week.db-wal").stat().st_size) == (
            12_000, 0)
        assert store.size_bytes() == path.stat().st_size


@pytest.mark.parametrize(("hz", "end_s"), [(1.0, T_END), (10.0, T_END + 7.3), (0.3, T_END)])
def test_days_without_raw_rows_have_the_tiers_their_raw_rows_would_have_made(
        any_url, tmp_path, hz, end_s):
    """Raw rows only for the last half hour of two: the tiers of all two hours are what
    retention makes of a store that kept every raw row, and rolling the raw half hour up again
    changes nothing. 10 Hz with an end off the second: ticks at fractional times; 0.3 Hz:
    seconds without samples."""
    shape = {"devices": 2, "hz": hz, "days": 2 / 24, "end_s": end_s}
    h = History(**shape, raw_days=0.5 / 24)
    assert h.raw_start_s == (end_s - 1800) // 60 * 60  # down to a whole minute
    minutes = (h.start_s // 60 * 60, -(-end_s // 60) * 60)
    with Store.open(f"sqlite:///{tmp_path / 'all_raw.db'}", host_name="h") as full:
        generate(full, History(**shape, raw_days=None, rollups=False))
        maintenance.rollup_window(full, *minutes)
        expected_raw = [r for r in _raw(full) if r[1] >= h.raw_start_s]
        expected = _tiers(full)
    with Store.open(any_url, host_name="h") as store:
        generate(store, h)
        assert _raw(store) == expected_raw
        assert store.count("events") == sum(
            (n + 7 * d) % 37 in (0, 27) for d in range(2) for n in range(h.ticks)
            if h.ts(n) >= h.raw_start_s)
        assert _tiers(store) == expected
        _drop_tiers(store, h.raw_start_s)
        maintenance.rollup_window(store, h.raw_start_s, minutes[1])
        assert _tiers(store) == expected
    rollups, packed, counts = expected
    assert sum(n for *_, n in counts) == sum(
        (n + 7 * d) % 37 in (0, 27) for d in range(2) for n in range(h.ticks))
    n_minutes = int((minutes[1] - minutes[0]) // 60)
    assert len(packed) == 2 * n_minutes and len(rollups) == 2 * n_minutes * 13
    assert len(expected_raw) == 2 * (h.ticks - h.tick_at(h.raw_start_s))


def _raw(store: Store) -> list[tuple[Any, ...]]:
    """Every raw sample but its id, in (device, time) order."""
    cols = [c for c in samples.c if c.name != "id"]
    with store.engine.connect() as c:
        return [tuple(r) for r in c.execute(select(*cols).order_by(samples.c.device_id,
                                                                   samples.c.ts_s))]


def _tiers(store: Store) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                  list[tuple[Any, ...]]]:
    """(minute rollups, per-second rows, event counts) in key order."""
    with store.engine.connect() as c:
        packed = [dict(r._mapping) for r in c.execute(select(seconds).order_by(
            seconds.c.device_id, seconds.c.minute_s, seconds.c.source))]
        counts = [tuple(r) for r in c.execute(select(event_counts).order_by(
            event_counts.c.device_id, event_counts.c.minute_s, event_counts.c.name))]
    return read_rollups(store), packed, counts


def _drop_tiers(store: Store, from_s: float = 0.0) -> None:
    with store.engine.begin() as c:
        c.exec_driver_sql(f"DELETE FROM rollups WHERE bucket_s >= {from_s!r}")
        c.exec_driver_sql(f"DELETE FROM seconds WHERE minute_s >= {from_s!r}")
        c.exec_driver_sql(f"DELETE FROM event_counts WHERE minute_s >= {from_s!r}")


def test_bad_shapes_are_refused_with_the_values():
    with pytest.raises(ValueError, match="devices=0, hz=1, days=1, raw_days=1.0"):
        History(devices=0, hz=1, days=1)
    with pytest.raises(ValueError, match="raw_days=-1"):
        History(raw_days=-1)
    with pytest.raises(ValueError, match="raw_days=1.0 < days=7.0: nothing would hold"):
        History(rollups=False)
    assert History(days=2, raw_days=3).raw_start_s == History(days=2).start_s


def test_a_long_timeline_from_rollups_equals_the_one_from_raw_samples(any_url, tmp_path):
    """The rollup read path (grouped and pivoted in SQL) gives each bucket the min, max and
    last the raw samples give, also where only the tiers are left of them (raw rows for the
    last half hour of the two)."""
    cols = ("allocated_bytes", "kv_blocks_used", "device_used_bytes")
    h = History(devices=1, hz=1.0, days=2 / 24, events=False)
    raw_url = f"sqlite:///{tmp_path / 'raw.db'}"
    views = []
    for url, raw_days, rollups in ((any_url, 0.5 / 24, True), (raw_url, None, False)):
        with Store.open(url, host_name="h") as store:
            generate(store, History(**{**h.__dict__, "raw_days": raw_days, "rollups": rollups}))
            rows = store.timeline(0, h.start_s, h.end_s, 24, cols)  # 5-minute buckets
            views.append([{k: v for k, v in r.items() if k != "last_ts_s"} for r in rows])
    from_rollups, from_raw = views
    assert len(from_rollups) == 24 and from_rollups == from_raw
