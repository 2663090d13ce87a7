"""Migrations 0004 and 0007: the (device_id, name, ts_s) events index and the rollups' ten- and
two-minute expression indexes are added to a store that already holds events and rollups,
which stay, and dropped again on downgrade; on SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import create_engine, inspect, text
from vramscope.agent.store import migrate

from tests.support.sql_watch import insert_one_device

EVENT = (1, 1, 1_700_000_040.0, "oom", 5, None, None, '{"message": "out of memory"}')
ROLLUP = (1, 1_700_000_040.0, "torch", "allocated_bytes", 5, 9, 7.0, 8, 3)
TIER = "CAST(bucket_s / 600.0 AS INTEGER)"


def _events_indexes(engine) -> dict[str, list[str]]:
    return {ix["name"]: ix["column_names"] for ix in inspect(engine).get_indexes("events")}


def _rollups_index(engine, name: str = "ix_rollups_device_tier") -> str | None:
    """A tier index's definition as the database keeps it (SQLAlchemy does not reflect
    expression indexes on SQLite), or None."""
    q = (f"SELECT sql FROM sqlite_master WHERE name = '{name}'"
         if engine.dialect.name == "sqlite" else
         f"SELECT indexdef FROM pg_indexes WHERE indexname = '{name}'")
    with engine.connect() as c:
        return c.execute(text(q)).scalar()


def _rollups(engine) -> list[tuple]:
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(text(
            "SELECT device_id, bucket_s, source, metric, min_value, max_value, mean_value, "
            "last_value, count FROM rollups"))]


def _events(engine) -> list[tuple]:
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(text(
            "SELECT id, device_id, ts_s, name, pid, phase, request_id, data FROM events"))]


def test_events_name_index_up_and_down(any_url):
    engine = create_engine(any_url)
    try:
        migrate.upgrade(engine, "0003")
        with engine.begin() as c:
            insert_one_device(c)
            c.execute(text("INSERT INTO events (id, device_id, ts_s, name, pid, phase, "
                           "request_id, data) VALUES (:a, :b, :c, :d, :e, :f, :g, :h)"),
                      dict(zip("abcdefgh", EVENT)))
            c.execute(text("INSERT INTO rollups VALUES (:a, :b, :c, :d, :e, :f, :g, :h, :i)"),
                      dict(zip("abcdefghi", ROLLUP)))
        assert "ix_events_device_name_ts" not in _events_indexes(engine)
        assert _rollups_index(engine) is None
        migrate.upgrade(engine, "0004")
        assert migrate.current_revision(engine) == "0004"
        assert _events_indexes(engine)["ix_events_device_name_ts"] == ["device_id", "name",
                                                                       "ts_s"]
        assert _events(engine) == [EVENT] and _rollups(engine) == [ROLLUP]
        tier = _rollups_index(engine)
        if engine.dialect.name == "sqlite":
            assert tier == ("CREATE INDEX ix_rollups_device_tier ON rollups "
                            f"(device_id, {TIER}, metric, min_value, max_value)")
        else:  # PostgreSQL's own spelling of the same expression
            assert tier.endswith("(device_id, (((bucket_s / (600.0)::double precision))"
                                 "::integer), metric, min_value, max_value)"), tier
        assert _rollups_index(engine, "ix_rollups_device_tier2m") is None
        migrate.upgrade(engine)  # 0007 adds the two-minute groups' index the same way
        two = _rollups_index(engine, "ix_rollups_device_tier2m")
        if engine.dialect.name == "sqlite":
            assert two == ("CREATE INDEX ix_rollups_device_tier2m ON rollups "
                           "(device_id, CAST(bucket_s / 120.0 AS INTEGER), metric, min_value, "
                           "max_value)")
        else:
            assert two.endswith("(device_id, (((bucket_s / (120.0)::double precision))"
                                "::integer), metric, min_value, max_value)"), two
        assert _rollups_index(engine) is None  # 0008: the ten-minute groups are a table
        migrate.check(engine)  # schema.py and the revisions agree
        migrate.downgrade(engine, "0003")
        assert "ix_events_device_name_ts" not in _events_indexes(engine)
        assert _events_indexes(engine)["ix_events_device_ts"] == ["device_id", "ts_s"]
        assert _rollups_index(engine) is None
        assert _events(engine) == [EVENT] and _rollups(engine) == [ROLLUP]
    finally:
        engine.dispose()
