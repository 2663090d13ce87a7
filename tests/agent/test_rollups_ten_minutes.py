"""The ten-minute groups (``rollups_10m``, 0008): retention keeps them as it rolls minutes up
(again for late minutes, away with old ones), and the migration makes them from the rollups an
older store already has; each group the least minimum, the greatest maximum and its newest
minute's last value, of its device, source and metric. On both backends."""

from __future__ import annotations

from typing import Any

from sqlalchemy import create_engine, inspect, select, text
from vramscope.agent.records import Sample
from vramscope.agent.store import Store, migrate
from vramscope.agent.store.maintenance import (
    delete_rollups_older,
    rollup_window,
    ten_minute_rows,
)
from vramscope.agent.store.schema import rollups_10m

from tests.support.rollup_rows import read_rollups
from tests.support.sql_watch import insert_one_device

T0 = 1_700_000_400.0  # a ten-minute boundary
MINUTES = 35  # three whole groups and a partial one


def _samples(i: int) -> list[Sample]:
    """Second ``i``: torch readings on devices 0 and 1, NVML's on device 0 every 7 s."""
    out = [Sample(T0 + i, d, source="torch", allocated_bytes=1000 * d + (i * 7919) % 500,
                  reserved_bytes=5000 + i) for d in (0, 1)]
    if i % 7 == 0:
        out.append(Sample(T0 + i + 0.5, 0, source="nvml", device_used_bytes=9000 + i % 13))
    return out


def _groups(store: Store) -> list[tuple[Any, ...]]:
    with store.engine.connect() as c:
        return sorted(tuple(r) for r in c.execute(select(
            rollups_10m.c.device_id, rollups_10m.c.bucket_s, rollups_10m.c.source,
            rollups_10m.c.metric, rollups_10m.c.min_value, rollups_10m.c.max_value,
            rollups_10m.c.last_value, rollups_10m.c.last_s)))


def _from_minutes(store: Store) -> list[tuple[Any, ...]]:
    minutes = [(r["device_id"], r["bucket_s"], r["source"], r["metric"], r["min_value"],
                r["max_value"], r["last_value"]) for r in read_rollups(store)]
    return sorted(tuple(r.values()) for r in ten_minute_rows(minutes))


def test_retention_keeps_the_groups_of_the_minutes_it_rolls_up(any_url):
    with Store.open(any_url, host_name="h") as store:
        store.write([s for i in range(MINUTES * 60) for s in _samples(i)])
        for m in range(MINUTES):  # a minute a step, as retention rolls them up
            rollup_window(store, T0 + 60 * m, T0 + 60 * (m + 1))
        groups = _groups(store)
        assert groups == _from_minutes(store)
        # device 0's torch allocated bytes in the first group: its samples' extremes, and
        # the last value of its minute 9
        first = {(g[1] - T0, g[2], g[3]): g[4:] for g in groups if g[0] == 1}
        alloc = [(i * 7919) % 500 for i in range(600)]
        assert first[(0.0, "torch", "allocated_bytes")] == (min(alloc), max(alloc), alloc[-1],
                                                           T0 + 540)
        assert first[(1800.0, "nvml", "device_used_bytes")][3] == T0 + 34 * 60  # partial
        assert len({g[1] for g in groups}) == 4
        # a late sample in minute 3 (below every reserved minimum): its minute rolled up
        # again, and its group with it
        store.write([Sample(T0 + 200.5, 0, source="torch", allocated_bytes=0,
                            reserved_bytes=1)])
        rollup_window(store, T0 + 180, T0 + 240)
        assert _groups(store) == _from_minutes(store)
        assert {(g[1] - T0, g[3]): g[4] for g in _groups(store)
                if g[0] == 1 and g[2] == "torch"}[(0.0, "reserved_bytes")] == 1
        # old rollups: minutes before the cutoff, groups that ended before it
        delete_rollups_older(store, T0 + 1260, max_minutes=100)
        assert sorted({g[1] - T0 for g in _groups(store)}) == [1200.0, 1800.0]


def test_the_migration_makes_the_groups_of_an_older_stores_rollups(any_url):
    engine = create_engine(any_url)
    try:
        migrate.upgrade(engine, "0007")
        minutes = [(1, T0 + 60 * m, source, "allocated_bytes", 10 * m + k, 50 + m + k,
                    20 + 3 * m + k, 1) for m in range(23) for k, source in enumerate(("a", "b"))
                   if not (source == "b" and m % 10 == 9)]  # "b" misses each group's minute 9
        with engine.begin() as c:
            insert_one_device(c)
            c.execute(text("INSERT INTO rollups (device_id, bucket_s, source, metric, min_value, "
                           "max_value, mean_value, last_value, count) VALUES (:d, :b, :s, :m, "
                           ":lo, :hi, 0.0, :la, :n)"),
                      [dict(zip(("d", "b", "s", "m", "lo", "hi", "la", "n"), r)) for r in minutes])
        migrate.upgrade(engine)
        migrate.check(engine)
        with engine.connect() as c:
            got = sorted(tuple(r) for r in c.execute(text(
                "SELECT device_id, bucket_s, source, metric, min_value, max_value, last_value, "
                "last_s FROM rollups_10m")))
        expected = sorted(tuple(r.values()) for r in ten_minute_rows(r[:7] for r in minutes))
        assert got == expected and len(got) == 6  # three groups (the last partial), 2 sources
        # source "b"'s first group: its newest minute is 8 (minute 9 missing)
        assert ("b", T0, 10 * 0 + 1, 50 + 8 + 1, 20 + 3 * 8 + 1, T0 + 480) in [
            (g[2], g[1], g[4], g[5], g[6], g[7]) for g in got]
        migrate.downgrade(engine, "0007")
        tables = inspect(engine).get_table_names()
        assert "rollups_10m" not in tables and "rollups" in tables
        indexes = ("SELECT name FROM sqlite_master WHERE type = 'index'"
                   if engine.dialect.name == "sqlite" else "SELECT indexname FROM pg_indexes")
        with engine.connect() as c:  # an expression index: the inspector leaves it out
            assert "ix_rollups_device_tier" in set(c.execute(text(indexes)).scalars())
    finally:
        engine.dispose()
