"""Store queries for retention and rollups (used by ``vramscope.agent.retention``; SQL lives in
the store).

Every function does a bounded amount of work, so the writer thread that runs them never stalls
ingest for long: a rollup covers a window of a few minutes, a delete removes at most ``limit``
rows (``DELETE ... WHERE id IN (SELECT id ... LIMIT n)`` works on SQLite and PostgreSQL).
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

from sqlalchemy import delete, func, insert, select
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS
from vramscope.agent.store.schema import agent_stats, events, rollups, samples
from vramscope.agent.store.store import Store

BUCKET_S = 60.0
_TABLES = {"samples": samples, "events": events, "agent_stats": agent_stats}


def rollup_watermark(store: Store) -> float | None:
    """The end of the last rolled-up minute, or None when nothing was rolled up yet."""
    with store.engine.connect() as c:
        last = c.execute(select(func.max(rollups.c.bucket_s))).scalar()
    return None if last is None else float(last) + BUCKET_S


def first_sample_ts(store: Store, at_or_after_s: float | None = None) -> float | None:
    q = select(func.min(samples.c.ts_s))
    if at_or_after_s is not None:
        q = q.where(samples.c.ts_s >= at_or_after_s)
    with store.engine.connect() as c:
        first = c.execute(q).scalar()
    return None if first is None else float(first)


def rollup_window(store: Store, start_s: float, end_s: float) -> int:
    """Replace the rollups of the minutes in [start_s, end_s) from raw samples; rows written.

    ``start_s`` and ``end_s`` are minute boundaries. Idempotent: running it twice for the same
    window gives the same rows (delete, then insert, in one transaction). Rows are fetched
    through the driver's own cursor: SQLAlchemy's Row objects would cost more than the
    aggregation itself.
    """
    cols = [samples.c.device_id, samples.c.source, samples.c.ts_s,
            *(samples.c[n] for n in SAMPLE_COUNTER_FIELDS)]
    q = (select(*cols).where(samples.c.ts_s >= start_s, samples.c.ts_s < end_s)
         .order_by(samples.c.device_id, func.coalesce(samples.c.source, ""), samples.c.ts_s,
                   samples.c.id))
    with store.engine.begin() as c:
        rows = aggregate(_fetch_raw(c, q))
        c.execute(delete(rollups).where(rollups.c.bucket_s >= start_s,
                                        rollups.c.bucket_s < end_s))
        if rows:
            c.execute(insert(rollups), rows)
    return len(rows)


def _fetch_raw(c, query) -> list[tuple]:
    compiled = query.compile(dialect=c.dialect, compile_kwargs={"literal_binds": True})
    cursor = c.connection.driver_connection.cursor()
    try:
        cursor.execute(str(compiled))
        return cursor.fetchall()
    finally:
        cursor.close()


def aggregate(rows: list[tuple]) -> list[dict[str, Any]]:
    """Per (device, minute, source, metric): min, max, mean, last, count.

    ``rows`` are ``(device_id, source, ts_s, *counters)`` ordered by device, source and time,
    so each (device, source, minute) group is contiguous; within a group each metric is
    reduced a column at a time by C builtins.
    """
    out: list[dict[str, Any]] = []
    for (device_id, source, bucket), group in groupby(rows, key=_group_key):
        members = list(group)
        for offset, metric in enumerate(SAMPLE_COUNTER_FIELDS, start=3):
            col = [r[offset] for r in members if r[offset] is not None]
            if col:
                out.append({"device_id": device_id, "bucket_s": bucket, "source": source,
                            "metric": metric, "min_value": min(col), "max_value": max(col),
                            "mean_value": sum(col) / len(col), "last_value": col[-1],
                            "count": len(col)})
    return out


def _group_key(row: tuple) -> tuple:
    return row[0], row[1] or "", (row[2] // BUCKET_S) * BUCKET_S


def delete_older(store: Store, table_name: str, cutoff_s: float, limit: int) -> int:
    """Delete at most ``limit`` rows of ``table_name`` with ``ts_s < cutoff_s``; rows deleted."""
    table = _TABLES[table_name]
    ids = select(table.c.id).where(table.c.ts_s < cutoff_s).limit(limit).scalar_subquery()
    with store.engine.begin() as c:
        return c.execute(delete(table).where(table.c.id.in_(ids))).rowcount


def delete_rollups_older(store: Store, cutoff_s: float, max_minutes: int) -> int:
    """Delete the rollups of at most ``max_minutes`` of the oldest minutes before ``cutoff_s``."""
    with store.engine.begin() as c:
        first = c.execute(select(func.min(rollups.c.bucket_s))).scalar()
        if first is None or first >= cutoff_s:
            return 0
        upto = min(cutoff_s, float(first) + max_minutes * BUCKET_S)
        return c.execute(delete(rollups).where(rollups.c.bucket_s < upto)).rowcount


def read_rollups(store: Store, device_id: int | None = None) -> list[dict[str, Any]]:
    """Rollup rows in (bucket, device, source, metric) order: for tests and tools."""
    q = select(rollups).order_by(rollups.c.bucket_s, rollups.c.device_id, rollups.c.source,
                                 rollups.c.metric)
    if device_id is not None:
        q = q.where(rollups.c.device_id == device_id)
    with store.engine.connect() as c:
        return [dict(r._mapping) for r in c.execute(q)]
