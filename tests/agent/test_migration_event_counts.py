"""Migration 0009: ``event_counts`` made from the events a store still has, on SQLite and a real
PostgreSQL; the same counts retention makes of them, and the table gone again on downgrade."""

from __future__ import annotations

from sqlalchemy import create_engine, inspect, text
from vramscope.agent.store import Store, maintenance, migrate

from tests.support.sql_watch import insert_one_device

T0 = 1_700_000_040.0  # a minute boundary
EVENTS = [(1.0, "request_start"), (2.5, "kv_alloc"), (59.9, "request_start"),
          (60.0, "request_end"), (61.0, "oom"), (125.0, "phase"), (126.0, "phase")]


def _counts(engine) -> list[tuple]:
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(text(
            "SELECT device_id, minute_s, name, count FROM event_counts "
            "ORDER BY device_id, minute_s, name"))]


def test_event_counts_are_backfilled_as_retention_counts_and_dropped_on_downgrade(any_url):
    engine = create_engine(any_url)
    try:
        migrate.upgrade(engine, "0008")
        with engine.begin() as c:
            insert_one_device(c)
            for i, (t, name) in enumerate(EVENTS):
                c.execute(text("INSERT INTO events (id, device_id, ts_s, name) "
                               "VALUES (:i, 1, :t, :n)"), {"i": i + 1, "t": T0 + t, "n": name})
        migrate.upgrade(engine)
        expected = [(1, T0, "kv_alloc", 1), (1, T0, "request_start", 2),
                    (1, T0 + 60, "request_end", 1), (1, T0 + 120, "phase", 2)]  # no oom
        assert _counts(engine) == expected
        migrate.check(engine)  # schema.py and the revisions agree
        with Store.open(any_url) as store:  # retention's counts of the same minutes
            with store.engine.begin() as c:
                c.execute(text("DELETE FROM event_counts"))
                maintenance.count_events(c, [1], T0, T0 + 180)
        assert _counts(engine) == expected
        migrate.downgrade(engine, "0008")
        assert "event_counts" not in inspect(engine).get_table_names()
        with engine.connect() as c:
            assert c.execute(text("SELECT count(*) FROM events")).scalar() == len(EVENTS)
    finally:
        engine.dispose()
