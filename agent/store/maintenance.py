"""Store queries for retention and rollups (used by ``vramscope.agent.retention``).

Every query does bounded work, so the writer thread that runs them never stalls ingest: a rollup
covers a few minutes, a delete removes at most ``limit`` rows, and every query names its devices
and a time range (an index seek per device, never a walk of the whole history: design rule 8).
One statement per table for all devices, not one per device, so a fleet's leader sends a fixed
few statements a step whatever the fleet's size (docs/agent.md, "Retention and rollups";
tests/agent/test_retention_cost.py and test_retention_statements.py count the work).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import groupby
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    TableClause,
    case,
    column,
    delete,
    func,
    insert,
    select,
    table,
    text,
)
from vramscope.agent.durations import MINUTE_S
from vramscope.agent.event_kinds import CHEAP_EVENTS, KEPT_EVENTS
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS
from vramscope.agent.store import event_blocks, sample_blocks
from vramscope.agent.store import seconds as tier
from vramscope.agent.store.schema import (
    ROLLUP_TIER_S,
    agent_stats,
    device_verdicts,
    devices,
    event_counts,
    events,
    hosts,
    rollups,
    rollups_10m,
    samples,
    seconds,
    verdicts,
)
from vramscope.agent.store.store import Store

_IDS_PER_DELETE = 500  # ids per DELETE ... IN (...): far under SQLite's and psycopg's limits
# A rollup holds its devices' raw rows in memory at once (two minutes of 32 devices at 10 Hz:
# 38,400 rows), so a fleet's hundreds of devices go 32 at a time (12 statements each) rather
# than in one read whose memory would grow the leader with the fleet
ROLLUP_DEVICES_PER_CHUNK = 32
# PostgreSQL: a rollup holds a transaction-level advisory lock per device (this class, the
# device's id; a key space apart from the store-wide lock's one bigint), taken in id order, so
# that two agents rolling up one device's minutes (a host's agent back while the leader rolls
# up the host it took for gone) take turns instead of failing on each other's rows
ROLLUP_LOCK_CLASS = int.from_bytes(b"vrmr", "big")
_LOCK_DEVICES = text("SELECT pg_advisory_xact_lock(:cls, d) FROM (SELECT unnest(CAST(:ids AS "
                     "integer[])) AS d ORDER BY d) AS ordered")
# PostgreSQL: samples's DEFAULT partition (agent/store/partitions.py), the rows of days without
# a partition of their own, which retention deletes as rows
SAMPLES_DEFAULT = table("samples_default", column("id"), column("device_id"), column("ts_s"))
# table -> (the column its time index starts with, the table that column's ids come from)
_TABLES: dict[str, tuple[TableClause, str, TableClause]] = {
    "samples": (samples, "device_id", devices),
    "samples_default": (SAMPLES_DEFAULT, "device_id", devices),
    "events": (events, "device_id", devices),
    "agent_stats": (agent_stats, "host_id", hosts),
    "verdicts": (verdicts, "device_id", devices),
    "device_verdicts": (device_verdicts, "device_id", devices),
}


def device_ids(c: Connection) -> list[int]:
    """Every device row's id (all hosts): the few keys the per-device seeks loop over."""
    return [int(i) for i in c.execute(select(devices.c.id).order_by(devices.c.id)).scalars()]


def _per_device(c: Connection, seek: Any, ids: Sequence[int] | None = None) -> list[Any]:
    """``seek`` (a scalar subquery correlated to ``devices``) of every device (or of devices
    ``ids``), in one statement: its value per device, None where a device has none."""
    q = select(seek).select_from(devices)
    if ids is not None:
        q = q.where(devices.c.id.in_(ids))
    return list(c.execute(q).scalars())


def rollup_watermark(store: Store, ids: Sequence[int] | None = None) -> float | None:
    """The end of the last rolled-up minute, or None when nothing was rolled up yet: one
    ``max(minute_s)`` seek on the per-second tier's primary key per device.

    The per-second tier, not the minute rollups: a store upgraded from before it (0005) has
    minute rollups but no seconds, and must roll its kept raw samples up again (the minutes
    come out the same) so that deleting them loses nothing a second tier keeps.
    ``ids``: of these devices only (one host's, in a fleet)."""
    last = (select(func.max(seconds.c.minute_s)).where(seconds.c.device_id == devices.c.id)
            .scalar_subquery())
    with store.engine.connect() as c:
        lasts = _per_device(c, last, ids)
    found = [float(x) for x in lasts if x is not None]
    return max(found) + MINUTE_S if found else None


def oldest_sample_ts(store: Store, at_or_after_s: float | None = None,
                     ids: Sequence[int] | None = None) -> float | None:
    """The first sample time at or after ``at_or_after_s`` of any device (of devices ``ids``
    when given): one index seek per device (``ORDER BY ts_s LIMIT 1`` under
    ``device_id = ?``)."""
    q = select(samples.c.ts_s).where(samples.c.device_id == devices.c.id)
    if at_or_after_s is not None:
        q = q.where(samples.c.ts_s >= at_or_after_s)
    with store.engine.connect() as c:
        firsts = _per_device(c, q.order_by(samples.c.ts_s).limit(1).scalar_subquery(), ids)
    found = [float(x) for x in firsts if x is not None]
    return min(found) if found else None


def host_device_ids(c: Connection, host: str) -> list[int]:
    """The device rows of one host: what an agent of a fleet rolls up and compacts, whether or
    not it holds the store-wide lock (vramscope.agent.store.store_wide_lock)."""
    q = (select(devices.c.id).join(hosts, hosts.c.id == devices.c.host_id)
         .where(hosts.c.name == host).order_by(devices.c.id))
    return [int(i) for i in c.execute(q).scalars()]


def host_device_ids_of(store: Store, host: str) -> list[int]:
    """:func:`host_device_ids` on a connection of its own: the devices a fleet's agent rolls
    up and compacts (vramscope.agent.retention)."""
    with store.engine.connect() as c:
        return host_device_ids(c, host)


def first_unrolled_ts(store: Store, horizon_s: float) -> float | None:
    """The oldest raw sample at or after ``horizon_s`` that its device's rollups have not
    reached yet (after the device's last per-second minute), of any device: where a fleet's
    leader may delete raw samples up to, whoever rolls each host up (one statement, two
    index seeks per device). Samples before ``horizon_s`` are older than every tier keeps and
    are never rolled up (vramscope.agent.retention)."""
    rolled_end = (select(func.max(seconds.c.minute_s) + MINUTE_S)
                  .where(seconds.c.device_id == devices.c.id)
                  .correlate(devices).scalar_subquery())  # nested: name the outer devices
    from_s = case((rolled_end > horizon_s, rolled_end), else_=horizon_s)
    first = (select(samples.c.ts_s)
             .where(samples.c.device_id == devices.c.id, samples.c.ts_s >= from_s)
             .order_by(samples.c.ts_s).limit(1).scalar_subquery())
    with store.engine.connect() as c:
        found = [float(x) for x in _per_device(c, first) if x is not None]
    return min(found) if found else None


def hosts_devices(store: Store, *, stale_before_s: float | None = None,
                  but: str | None = None) -> dict[int, list[int]]:
    """Host id -> its device ids, the hosts sorted by id: every host (but ``but``), or with
    ``stale_before_s`` only those whose agent is gone: no ``agent_stats`` row (an agent's
    heartbeat, every few seconds) at or after it, or none ever (a host only ``import`` wrote).
    One seek of ``ix_agent_stats_host_ts`` per host."""
    q = (select(hosts.c.id, devices.c.id).join(devices, devices.c.host_id == hosts.c.id)
         .order_by(hosts.c.id, devices.c.id))
    if but is not None:
        q = q.where(hosts.c.name != but)
    if stale_before_s is not None:
        beat = (select(agent_stats.c.ts_s).where(agent_stats.c.host_id == hosts.c.id,
                                                 agent_stats.c.ts_s >= stale_before_s)
                .limit(1).exists())
        q = q.where(~beat)
    out: dict[int, list[int]] = {}
    with store.engine.connect() as c:
        for host_id, device_id in c.execute(q):
            out.setdefault(int(host_id), []).append(int(device_id))
    return out


def rollup_window(store: Store, start_s: float, end_s: float, host: str | None = None,
                  ids: Sequence[int] | None = None) -> int:
    """Replace the rollups and the per-second tier of the minutes in [start_s, end_s) from raw
    samples; rollup rows written. Every device's, or only ``host``'s devices', or devices
    ``ids``.

    ``start_s`` and ``end_s`` are minute boundaries. Idempotent: running it twice for the same
    window gives the same rows (delete, then insert, in one transaction). The devices
    ``ROLLUP_DEVICES_PER_CHUNK`` at a time, in one statement per table, each device a range on
    the ``(device_id, ts_s)`` index, so the cost is the window's rows whatever the history.
    Rows are fetched through the driver's own cursor: SQLAlchemy's Row objects would cost more
    than the aggregation itself.
    """
    written = 0
    with store.engine.begin() as c:
        if ids is None:
            ids = device_ids(c) if host is None else host_device_ids(c, host)
        if ids and c.dialect.name == "postgresql":
            c.execute(_LOCK_DEVICES, {"cls": ROLLUP_LOCK_CLASS, "ids": sorted(ids)})
        for i in range(0, len(ids), ROLLUP_DEVICES_PER_CHUNK):
            written += _rollup_devices(c, ids[i:i + ROLLUP_DEVICES_PER_CHUNK], start_s, end_s)
    return written


def _rollup_devices(c: Connection, ids: Sequence[int], start_s: float, end_s: float) -> int:
    # whether the compact raw tier holds samples or events of the window, in one statement
    samples_moved, events_moved = event_blocks.blocks_overlap(c, ids, start_s, end_s)
    if samples_moved:
        # a late minute rolled up again whose interval is in the compact raw tier already
        raw = _raw_with_blocks(c, ids, start_s, end_s)
    else:
        cols = [samples.c.device_id, samples.c.source, samples.c.ts_s,
                *(samples.c[n] for n in SAMPLE_COUNTER_FIELDS), samples.c.phase]
        q = (select(*cols)
             .where(samples.c.device_id.in_(ids), samples.c.ts_s >= start_s,
                    samples.c.ts_s < end_s)
             .order_by(samples.c.device_id, func.coalesce(samples.c.source, ""),
                       samples.c.ts_s, samples.c.id))
        raw = _fetch_raw(c, q)
    rows = aggregate(raw)
    _replace(c, rollups.c.bucket_s, ids, start_s, end_s, rows)
    refresh_ten_minutes(c, ids, start_s, end_s)
    _replace(c, seconds.c.minute_s, ids, start_s, end_s, pack_seconds(raw))
    count_events(c, ids, start_s, end_s, events_moved)
    return len(rows)


def count_events(c: Connection, ids: Sequence[int], start_s: float, end_s: float,
                 blocks: bool = True) -> None:
    """Replace the ``event_counts`` of the minutes in [start_s, end_s) of devices ``ids``: per
    device, minute and name, the cheap events listed in agent/event_kinds.py (a range of the
    ``(device_id, name, ts_s)`` index per device and name; a busy server has tens a minute).
    Names the table does not list are not counted: a client choosing them would choose how many
    rows the rollups' 90 days keep. ``blocks``: the compact raw tier may hold some (a late
    minute counted again after its interval moved)."""
    times = [tuple(r) for r in c.execute(
        select(events.c.device_id, events.c.name, events.c.ts_s)
        .where(events.c.device_id.in_(ids), events.c.name.in_(CHEAP_EVENTS),
               events.c.ts_s >= start_s, events.c.ts_s < end_s)).all()]
    if blocks:
        times += [(r[1], r[3], r[2]) for r in event_blocks.window_rows(c, ids, start_s, end_s,
                                                                       CHEAP_EVENTS)
                  if r[2] < end_s]
    counts = Counter((did, (ts // MINUTE_S) * MINUTE_S, name) for did, name, ts in times)
    _replace(c, event_counts.c.minute_s, ids, start_s, end_s, [
        {"device_id": did, "minute_s": minute, "name": name, "count": n}
        for (did, minute, name), n in sorted(counts.items())])


def refresh_ten_minutes(c: Connection, ids: Sequence[int], start_s: float,
                        end_s: float) -> None:
    """Make the ten-minute groups (``rollups_10m``) of devices ``ids`` that share a minute with
    [start_s, end_s) again from their minute rollups: at most the window's minutes and the two
    groups' others at its ends, read along the primary key."""
    lo = math.floor(start_s / ROLLUP_TIER_S) * ROLLUP_TIER_S
    hi = math.ceil(end_s / ROLLUP_TIER_S) * ROLLUP_TIER_S
    minutes = c.execute(select(rollups.c.device_id, rollups.c.bucket_s, rollups.c.source,
                               rollups.c.metric, rollups.c.min_value, rollups.c.max_value,
                               rollups.c.last_value)
                        .where(rollups.c.device_id.in_(ids), rollups.c.bucket_s >= lo,
                               rollups.c.bucket_s < hi)).all()
    _replace(c, rollups_10m.c.bucket_s, ids, lo, hi, ten_minute_rows(minutes))


def _replace(c: Connection, time_column: Column[Any], ids: Sequence[int], start_s: float,
             end_s: float, rows: list[dict[str, Any]]) -> None:
    """Replace the rows of devices ``ids`` in ``time_column``'s table in [start_s, end_s) with
    ``rows`` (delete, then insert: a refresh run twice gives the same rows)."""
    tier_table = time_column.table
    c.execute(delete(tier_table).where(tier_table.c.device_id.in_(ids),
                                       time_column >= start_s, time_column < end_s))
    if rows:
        c.execute(insert(tier_table), rows)


def ten_minute_rows(minutes: Iterable[Sequence[Any]]) -> list[dict[str, Any]]:
    """``rollups_10m`` rows of minute rollups ``(device_id, bucket_s, source, metric, min_value,
    max_value, last_value)``, in any order: per device, ten minutes, source and metric the least
    minimum, the greatest maximum, and the newest minute's last value with that minute."""
    acc: dict[tuple[Any, ...], list[Any]] = {}
    for did, minute, source, metric, lo, hi, last in minutes:
        key = (did, (minute // ROLLUP_TIER_S) * ROLLUP_TIER_S, source, metric)
        cur = acc.get(key)
        if cur is None:
            acc[key] = [lo, hi, last, minute]
            continue
        cur[0], cur[1] = min(cur[0], lo), max(cur[1], hi)
        if minute > cur[3]:
            cur[2], cur[3] = last, minute
    return [{"device_id": did, "bucket_s": float(group), "source": source, "metric": metric,
             "min_value": lo, "max_value": hi, "last_value": last, "last_s": float(minute)}
            for (did, group, source, metric), (lo, hi, last, minute) in acc.items()]


def pack_seconds(raw: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """The per-second tier's rows (one per device, source and minute) of raw rows
    ``(device_id, source, ts_s, *counters, phase)`` ordered by device, source and time."""
    out: list[dict[str, Any]] = []
    last = 3 + len(SAMPLE_COUNTER_FIELDS)
    for (device_id, source), group in groupby(raw, key=lambda r: (r[0], r[1] or "")):
        secs = tier.summarize((r[2], r[last], *r[3:last]) for r in group)
        for minute, members in tier.by_minute(secs):
            out.append({"device_id": device_id, "minute_s": minute, "source": source,
                        "seconds": len(members), "data": tier.pack(members)})
    return out


def _raw_with_blocks(c: Connection, ids: Sequence[int], start_s: float,
                     end_s: float) -> list[tuple[Any, ...]]:
    """The rows :func:`_rollup_devices` reads, as it orders them, from ``samples`` and the
    compact raw tier together."""
    names = ("device_id", "source", *SAMPLE_COUNTER_FIELDS, "phase")
    rows = [r for r in sample_blocks.window_rows(c, ids, start_s, end_s, names)
            if r[0] < end_s]
    rows.sort(key=lambda r: (r[2], r[3] or "", r[0], r[1]))  # device, source, time, id
    return [(r[2], r[3], r[0], *r[4:]) for r in rows]


def _fetch_raw(c: Connection, query: Any) -> list[tuple[Any, ...]]:  # query: a Select
    compiled = query.compile(dialect=c.dialect, compile_kwargs={"literal_binds": True})
    driver: Any = c.connection.driver_connection  # the DB-API connection (open: c is)
    cursor = driver.cursor()
    try:
        cursor.execute(str(compiled))
        rows: list[tuple[Any, ...]] = cursor.fetchall()
        return rows
    finally:
        cursor.close()


def aggregate(rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
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


def _group_key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return row[0], row[1] or "", (row[2] // MINUTE_S) * MINUTE_S


def delete_older(store: Store, table_name: str, cutoff_s: float, limit: int,
                 names: tuple[str, ...] | None = None) -> int:
    """Delete at most ``limit`` rows of ``table_name`` with ``ts_s < cutoff_s``, oldest first,
    every device (host, for agent_stats) in one statement; rows deleted. ``names`` (events
    only): just the events of these names, each a range of the ``(device_id, name, ts_s)``
    index.
    ``samples_default`` (PostgreSQL): the rows of samples's DEFAULT partition only, those of
    days without a partition of their own (retention drops the others a day at a time).

    The ids are read first (a range of the time index per owner, at most ``limit`` in all, in
    no particular order: every row before the cutoff goes) and then deleted by primary key:
    with ``DELETE ... WHERE id IN (SELECT ... LIMIT n)`` both SQLite and PostgreSQL may plan a
    scan of the whole table against the subquery's rows."""
    table, key, owners = _TABLES[table_name]
    with store.engine.begin() as c:
        where = [table.c.ts_s < cutoff_s]
        if names is not None:
            where.append(table.c.name.in_(names))
        return _delete_found(c, table, key, owners, where, limit)


def _delete_found(c: Connection, table: TableClause, key: str, owners: TableClause,
                  where: list[Any], limit: int) -> int:
    """Delete at most ``limit`` rows of ``table`` matching ``where``, sought under every owner
    (one ``key IN (...)``) and deleted by primary key, ``_IDS_PER_DELETE`` at a time."""
    owner_ids = c.execute(select(owners.c.id).order_by(owners.c.id)).scalars().all()
    if not owner_ids or limit < 1:
        return 0
    rows = sorted(c.execute(select(table.c.id, table.c.ts_s, table.c[key])
                            .where(table.c[key].in_(owner_ids), *where).limit(limit)).all(),
                  key=lambda r: r[1])
    deleted = 0
    for i in range(0, len(rows), _IDS_PER_DELETE):
        chunk = rows[i:i + _IDS_PER_DELETE]
        # the chunk's owners and time span (in time order: its first and last rows) besides
        # its ids: PostgreSQL's samples is partitioned by ts_s (0006), so the delete is planned
        # on the one or two partitions that hold it instead of looking every id up in every
        # partition's primary key; and a small table is not scanned whole for a list of ids
        # that the (owner, ts_s) index finds
        which = [table.c.id.in_([r[0] for r in chunk]),
                 table.c[key].in_(sorted({r[2] for r in chunk})),
                 table.c.ts_s >= chunk[0][1], table.c.ts_s <= chunk[-1][1]]
        deleted += c.execute(delete(table).where(*which)).rowcount
    return deleted


def oldest_event_ts(store: Store, before_s: float) -> float | None:
    """The first event time before ``before_s`` of any device: one index seek per device
    (``ORDER BY ts_s LIMIT 1`` under ``device_id = ?``)."""
    q = (select(events.c.ts_s).where(events.c.device_id == devices.c.id,
                                     events.c.ts_s < before_s)
         .order_by(events.c.ts_s).limit(1).scalar_subquery())
    with store.engine.connect() as c:
        firsts = _per_device(c, q)
    found = [float(x) for x in firsts if x is not None]
    return min(found) if found else None


def delete_unlisted_events(store: Store, start_s: float, end_s: float, limit: int) -> int:
    """Delete at most ``limit`` events in [start_s, end_s) whose name is not of the kept class
    (agent/event_kinds.py): the names no table lists, which an index range per name cannot
    find. A range of the ``(device_id, ts_s)`` index per device, every device in one statement;
    retention walks it forward once (``Retention._delete_unlisted``), so a step reads the rows
    of its window only, never the kept history before it."""
    with store.engine.begin() as c:
        return _delete_found(c, events, "device_id", devices,
                             [events.c.ts_s >= start_s, events.c.ts_s < end_s,
                              events.c.name.not_in(KEPT_EVENTS)], limit)


def delete_newer(store: Store, table_name: str, after_s: float, limit: int) -> int:
    """Delete at most ``limit`` rows of ``samples`` or ``events`` timed after ``after_s``, every
    device in one statement (a range of the ``(device_id, ts_s)`` index from its far end per
    device); rows deleted. Rows from the future are a client's wrong clock or a hand edit:
    never old enough for :func:`delete_older`, they would stay for good and hide the newest
    real sample."""
    table, key, owners = _TABLES[table_name]
    with store.engine.begin() as c:
        return _delete_found(c, table, key, owners, [table.c.ts_s > after_s], limit)


def delete_rollups_older(store: Store, cutoff_s: float, max_minutes: int) -> int:
    """Delete, per device, the rollups of at most ``max_minutes`` of its oldest minutes before
    ``cutoff_s`` (a ``min(bucket_s)`` seek per device, then a range of the primary key per
    device, one statement for the devices whose oldest minute is the same), the ten-minute
    groups that end before it, and the event counts of those minutes."""
    return (_delete_oldest_minutes(store, rollups.c.bucket_s, cutoff_s, max_minutes)
            + _delete_oldest_minutes(store, rollups_10m.c.bucket_s, cutoff_s - ROLLUP_TIER_S,
                                     max_minutes)
            + _delete_oldest_minutes(store, event_counts.c.minute_s, cutoff_s, max_minutes))


def delete_seconds_older(store: Store, cutoff_s: float, max_minutes: int) -> int:
    """The same for the per-second tier (a minute's row holds its seconds)."""
    return _delete_oldest_minutes(store, seconds.c.minute_s, cutoff_s, max_minutes)


def _delete_oldest_minutes(store: Store, minute: Any, cutoff_s: float, max_minutes: int) -> int:
    table = minute.table
    first = select(func.min(minute)).where(table.c.device_id == devices.c.id).scalar_subquery()
    deleted = 0
    with store.engine.begin() as c:
        upto_of: dict[float, list[int]] = {}  # where each device's deletion stops -> devices
        for did, oldest in c.execute(select(devices.c.id, first).order_by(devices.c.id)):
            if oldest is not None and oldest < cutoff_s:
                upto = min(cutoff_s, float(oldest) + max_minutes * MINUTE_S)
                upto_of.setdefault(upto, []).append(int(did))
        for upto, ids in upto_of.items():
            deleted += c.execute(delete(table).where(table.c.device_id.in_(ids),
                                                     minute < upto)).rowcount
    return deleted

