"""Migration 0004: the (device_id, name, ts_s) events index is added to a store that already
holds events, which stay, and dropped again on downgrade; on SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import create_engine, inspect, text
from vramscope.agent.store import migrate

EVENT = (1, 1, 1_700_000_040.0, "oom", 5, None, None, '{"message": "out of memory"}')


def _events_indexes(engine) -> dict[str, list[str]]:
    return {ix["name"]: ix["column_names"] for ix in inspect(engine).get_indexes("events")}


def _events(engine) -> list[tuple]:
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(text(
            "SELECT id, device_id, ts_s, name, pid, phase, request_id, data FROM events"))]


def test_events_name_index_up_and_down(any_url):
    engine = create_engine(any_url)
    try:
        migrate.upgrade(engine, "0003")
        with engine.begin() as c:
            c.execute(text("INSERT INTO hosts (id, name, first_seen_s, last_seen_s) "
                           "VALUES (1, 'h', 0, 0)"))
            c.execute(text("INSERT INTO devices (id, host_id, device_index) VALUES (1, 1, 0)"))
            c.execute(text("INSERT INTO events (id, device_id, ts_s, name, pid, phase, "
                           "request_id, data) VALUES (:a, :b, :c, :d, :e, :f, :g, :h)"),
                      dict(zip("abcdefgh", EVENT)))
        assert "ix_events_device_name_ts" not in _events_indexes(engine)
        migrate.upgrade(engine)
        assert migrate.current_revision(engine) == "0004"
        assert _events_indexes(engine)["ix_events_device_name_ts"] == ["device_id", "name",
                                                                       "ts_s"]
        assert _events(engine) == [EVENT]
        migrate.check(engine)  # schema.py and the revisions agree
        migrate.downgrade(engine, "0003")
        assert "ix_events_device_name_ts" not in _events_indexes(engine)
        assert _events_indexes(engine)["ix_events_device_ts"] == ["device_id", "ts_s"]
        assert _events(engine) == [EVENT]
    finally:
        engine.dispose()
