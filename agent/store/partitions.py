"""PostgreSQL: ``samples`` partitioned by day of ``ts_s`` (UTC) plus a DEFAULT partition
(migration 0006); on SQLite every function here does nothing. docs/agent.md, "Retention and
rollups", tells what is created, moved and dropped, and when.

A day's partition is made as a plain table, the default's rows of that day moved into it, and
then attached, because PostgreSQL refuses a partition whose range has rows in the default. The
DDL runs with a short ``lock_timeout`` under a try-lock, so behind a long query it gives up until
the next step instead of queueing every reader and writer. What exists is decided from the
bounds PostgreSQL reports, never from the ``samples_pYYYYMMDD`` names.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from sqlalchemy import Connection
from sqlalchemy.exc import OperationalError
from vramscope.agent.durations import DAY_S
from vramscope.agent.store.schema import samples

if TYPE_CHECKING:
    from vramscope.agent.store.store import Store

_T = TypeVar("_T")

log = logging.getLogger("vramscope.partitions")

TABLE = "samples"
DEFAULT = "samples_default"
LOCK_TIMEOUT = "2s"  # what partition DDL waits for its locks before it gives up for this step
_LOCK_KEY = 0x76524150  # "vRAP": serialises partition DDL across the agents of a fleet
_BOUND = re.compile(r"^FOR VALUES FROM \('?([-0-9.e+]+)'?\) TO \('?([-0-9.e+]+)'?\)$")


class Partition(NamedTuple):
    name: str
    start_s: float  # inclusive
    end_s: float  # exclusive


def day_of(ts_s: float) -> int:
    """The Unix day (UTC) of a time: its partition's number."""
    return int(ts_s // DAY_S)


def day_name(day: int) -> str:
    return f"{TABLE}_p{datetime.fromtimestamp(day * DAY_S, timezone.utc):%Y%m%d}"


def partitioned(c: Connection) -> bool:
    """True when ``samples`` is a partitioned table (PostgreSQL after 0006)."""
    if c.dialect.name != "postgresql":
        return False
    return bool(c.exec_driver_sql(
        "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table "
        f"WHERE partrelid = to_regclass('{TABLE}'))").scalar())


def names(c: Connection) -> set[str]:
    """Every partition of ``samples``, the default's included: tables that ``alembic check``
    must not compare with the schema (they are ``samples``'s)."""
    if not partitioned(c):
        return set()
    return {str(n) for n in c.exec_driver_sql(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        f"WHERE i.inhparent = to_regclass('{TABLE}')").scalars()}


def ranges(c: Connection) -> list[Partition]:
    """The range partitions (not the default), oldest first, with the bounds PostgreSQL
    holds: one catalog query, whatever the rows."""
    rows = c.exec_driver_sql(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        f"JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass('{TABLE}')"
    ).all()
    out = []
    for name, bound in rows:
        m = _BOUND.match(str(bound))
        if m:  # "DEFAULT" has no bounds
            out.append(Partition(str(name), float(m.group(1)), float(m.group(2))))
    return sorted(out, key=lambda p: p.start_s)


def ensure_days(store: Store, start_s: float, end_s: float) -> list[str] | None:
    """Create the day partitions that [start_s, end_s] touches and that do not exist yet,
    moving their rows out of the default; the names created ([] on SQLite). None: not done,
    another agent held the partition lock or a table lock did not come within LOCK_TIMEOUT
    (the next call tries again)."""
    days = range(day_of(start_s), day_of(end_s) + 1)
    nothing: list[str] = []
    return _maintain(store, lambda c: create_days(c, days), nothing)


def create_days(c: Connection, days: Iterable[int]) -> list[str]:
    """In ``c``'s transaction (the caller holds the locks it needs): each day's partition that
    no existing one overlaps."""
    have = ranges(c)
    made = []
    for day in days:
        lo, hi = day * DAY_S, (day + 1) * DAY_S
        if any(p.start_s < hi and lo < p.end_s for p in have):
            continue
        moved = _create(c, day_name(day), lo, hi)
        have.append(Partition(day_name(day), lo, hi))
        made.append(day_name(day))
        if moved:
            log.info("partition %s created; %d rows moved into it from %s",
                     day_name(day), moved, DEFAULT)
    return made


def _create(c: Connection, name: str, lo: float, hi: float) -> int:
    """A plain table like ``samples``, the default's rows of [lo, hi) moved into it, then
    attached (which builds its indexes and checks that the default holds none of its range);
    rows moved."""
    cols = ", ".join(col.name for col in samples.columns)
    c.exec_driver_sql(f"CREATE TABLE {name} (LIKE {TABLE} INCLUDING DEFAULTS)")
    moved = c.exec_driver_sql(
        f"WITH moved AS (DELETE FROM {DEFAULT} WHERE ts_s >= %(lo)s AND ts_s < %(hi)s "
        f"RETURNING {cols}) INSERT INTO {name} ({cols}) SELECT {cols} FROM moved",
        {"lo": lo, "hi": hi}).rowcount
    c.exec_driver_sql(
        f"ALTER TABLE {TABLE} ATTACH PARTITION {name} FOR VALUES FROM ({lo!r}) TO ({hi!r})")
    return max(0, moved)


class Dropped(NamedTuple):
    names: list[str]  # the partitions dropped, oldest first
    oldest_end_s: float | None  # the upper bound of the oldest partition left (None: unknown)


def drop_before(store: Store, cutoff_s: float, limit: int = 1) -> Dropped | None:
    """Drop at most ``limit`` of the oldest partitions whose upper bound is at or before
    ``cutoff_s`` (every row in them is older); nothing on SQLite. None: the locks were not
    had (the next call tries again)."""
    def drop(c: Connection) -> Dropped:
        have = ranges(c)
        gone = [p.name for p in have if p.end_s <= cutoff_s][:limit]
        for name in gone:
            c.exec_driver_sql(f"DROP TABLE {name}")
        left = have[len(gone):]
        return Dropped(gone, left[0].end_s if left else None)
    return _maintain(store, drop, Dropped([], None))


def _maintain(store: Store, work: Callable[[Connection], _T], nothing: _T) -> _T | None:
    """``work`` in one transaction under the fleet's partition lock (taken without waiting),
    its table locks waited for at most LOCK_TIMEOUT. ``nothing`` where samples is not
    partitioned (SQLite); None when a lock was not had."""
    try:
        with store.engine.begin() as c:
            if not partitioned(c):
                return nothing
            if not c.exec_driver_sql(f"SELECT pg_try_advisory_xact_lock({_LOCK_KEY})").scalar():
                return None  # another agent is at it
            c.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            return work(c)
    except OperationalError as exc:
        if getattr(exc.orig, "sqlstate", None) != "55P03":  # lock_not_available
            raise
        log.info("partition maintenance waited %s for a lock on %s; tried again next step",
                 LOCK_TIMEOUT, TABLE)
        return None
