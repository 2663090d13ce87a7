"""Migration 0003: rollups become a WITHOUT ROWID table on SQLite, their rows kept both ways."""

from __future__ import annotations

from sqlalchemy import create_engine, text
from vramscope.agent.store import migrate

from tests.support.sql_watch import insert_one_device

ROW = (1, 1_700_000_040.0, "torch", "allocated_bytes", 5, 9, 7.0, 8, 3)


def _rollups_sql(engine) -> tuple[str, list[tuple]]:
    with engine.connect() as c:
        sql = c.execute(text("SELECT sql FROM sqlite_master WHERE name = 'rollups'")).scalar()
        return sql, [tuple(r) for r in c.execute(text("SELECT * FROM rollups"))]


def test_rollups_are_rebuilt_without_rowid_and_back(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'm.db'}")
    try:
        migrate.upgrade(engine, "0002")
        with engine.begin() as c:
            insert_one_device(c)
            c.execute(text("INSERT INTO rollups VALUES (:a, :b, :c, :d, :e, :f, :g, :h, :i)"),
                      dict(zip("abcdefghi", ROW)))
        assert "WITHOUT ROWID" not in _rollups_sql(engine)[0]
        migrate.upgrade(engine)
        sql, rows = _rollups_sql(engine)
        assert sql.rstrip().endswith("WITHOUT ROWID") and rows == [ROW]
        migrate.check(engine)
        migrate.downgrade(engine, "0002")
        sql, rows = _rollups_sql(engine)
        assert "WITHOUT ROWID" not in sql and rows == [ROW]
    finally:
        engine.dispose()
