"""Every device of every host at once, for the fleet page and the Overview of a fleet: what
each device is (host, index, model), its newest sample and its host's newest agent report, in
a fixed number of statements whatever the fleet's size (one statement per device is 512 round
trips to PostgreSQL for 64 nodes of 8 GPUs).

Each per-device (or per-host) newest value is a correlated scalar subquery: one seek on the
``(device_id, ts_s)`` (``(host_id, ts_s)``) index per row inside one statement, never a GROUP
BY, which would read every row of the history (a day of raw samples, 90 days of rollups) on
every request. Read through :func:`vramscope.agent.store.reader.fleet`, and, for
``/metrics``, :func:`~vramscope.agent.store.reader.fleet_samples` (the samples of each
device's newest seconds that hold its newest values) and
:mod:`~vramscope.agent.store.fleet_events` (each device's events of some names in a window):
there the rows after each seek are an index range of the device's own rows, joined to the
device row that bounds it.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Connection,
    Float,
    Integer,
    Select,
    and_,
    bindparam,
    case,
    func,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import ARRAY as PG_ARRAY
from sqlalchemy.dialects.postgresql import array as pg_array
from vramscope.agent.durations import MINUTE_S
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS, Phase, Sample
from vramscope.agent.store import sample_blocks as blocks
from vramscope.agent.store.reads import DeviceNow
from vramscope.agent.store.schema import (
    agent_stats,
    devices,
    hosts,
    rollups,
    samples,
)
from vramscope.agent.store.store import stored_reasons

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from vramscope.agent.store import Store


@contextmanager
def connection(store: Store) -> Iterator[Connection]:
    """A connection for the fleet's statements; on PostgreSQL without JIT compilation: their
    hundreds of correlated seeks are estimated dear enough to pass ``jit_above_cost``, and
    compiling them cost PostgreSQL 0.3 to 3 s a statement, more than running them (0.1 s)."""
    with store.engine.connect() as c:
        if store.dialect == "postgresql":
            c.exec_driver_sql("SET LOCAL jit = off")  # this transaction's, rolled back at close
        yield c


def devices_now(store: Store, not_after_s: float) -> list[dict[str, Any]]:
    """Every device row with its host and ``newest_ts_s``: its newest sample not ahead of
    ``not_after_s``, from the minute rollups where raw samples are gone (as
    ``Store.time_range`` gives it for one device; None: nothing stored). By host, then index."""
    q = _devices_now_statement()
    with connection(store) as c:
        rows = [dict(r._mapping) for r in c.execute(q, {"not_after_s": not_after_s})]
        for r in rows:
            raw_s, minute_s, row_id = r.pop("raw"), r.pop("minute"), r.pop("row_id")
            if r.pop("straddles"):
                raw_s = _newest_of(c, row_id, raw_s, not_after_s)
            r["newest_ts_s"] = (float(raw_s) if raw_s is not None else None if minute_s is None
                                else float(minute_s) + MINUTE_S)
    return rows


# The spans' statements are built once, the bound a parameter: their correlated seeks of the
# compact raw tier cost SQLAlchemy more to build each time than SQLite to answer
_NOT_AFTER: Any = bindparam("not_after_s", type_=Float)  # a bound where sample_blocks takes a float


@cache
def _devices_now_statement() -> Select[Any]:
    here = samples.c.device_id == devices.c.id
    raw = greater(select(func.max(samples.c.ts_s)).where(here, samples.c.ts_s <= _NOT_AFTER)
                  .scalar_subquery(), blocks.edge_of(devices.c.id, True, _NOT_AFTER))
    minute = (select(func.max(rollups.c.bucket_s))
              .where(rollups.c.device_id == devices.c.id, rollups.c.bucket_s <= _NOT_AFTER)
              .scalar_subquery())
    return (select(devices.c.id.label("row_id"), hosts.c.name.label("host"),
                   devices.c.device_index, devices.c.name, devices.c.uuid, devices.c.total_bytes,
                   raw.label("raw"), minute.label("minute"),
                   blocks.straddles(devices.c.id, _NOT_AFTER).label("straddles"))
            .join(hosts, hosts.c.id == devices.c.host_id)
            .order_by(hosts.c.name, devices.c.device_index))


@cache
def _device_spans_statement(bounded: bool) -> Select[Any]:
    not_after = _NOT_AFTER if bounded else None
    return (select(devices.c.id, hosts.c.name, devices.c.device_index, *_span_ends(not_after),
                   blocks.straddles(devices.c.id, not_after))
            .join(hosts, hosts.c.id == devices.c.host_id))


def agent_reports(store: Store) -> dict[str, dict[str, Any]]:
    """Each host's newest agent report (``agent_stats``' row, as
    ``Store.latest_agent_stats`` gives it), by host name; hosts without one are left out."""
    inner = agent_stats.alias("newer")
    newest = (select(func.max(inner.c.ts_s)).where(inner.c.host_id == hosts.c.id)
              .correlate(hosts).scalar_subquery())
    on_newest = and_(agent_stats.c.host_id == hosts.c.id, agent_stats.c.ts_s == newest)
    # each host's newest row by its own seek (an agent reports every few seconds: a day is
    # 17,000 rows a host), as newest_samples reads samples: joined, SQLite walked every report
    # stored and PostgreSQL could hash-join them all
    if store.dialect == "postgresql":
        found = select(agent_stats).where(on_newest).offset(0).lateral("found")
        q = (select(hosts.c.name.label("host"), found)
             .select_from(hosts.join(found, true())).order_by(found.c.id))
    else:  # an outer join: SQLite keeps its order, the hosts first
        q = (select(hosts.c.name.label("host"), agent_stats).select_from(hosts)
             .outerjoin(agent_stats, on_newest).order_by(agent_stats.c.id))
    with connection(store) as c:
        rows = [dict(r._mapping) for r in c.execute(q)]
    out: dict[str, dict[str, Any]] = {}
    for r in rows:  # two reports of one instant: the later written
        if r["id"] is None:
            continue  # a host that never reported (SQLite's outer join)
        r["rejected_by_reason"] = stored_reasons(r["rejected_by_reason"])
        out[r.pop("host")] = r
    return out


def newest_samples(store: Store, not_after_s: float | None,
                   window_s: float) -> list[DeviceNow]:
    """Every device row (as ``Store.devices`` gives it, with its host name) with its span (as
    ``Store.time_range(device, host, not_after_s=...)`` gives it; ``not_after_s`` None: not
    bounded) and, of its samples of the ``window_s`` up to the span's end (what
    ``Store.samples`` gives for that window), those :func:`newest_values` keeps, in time
    order; for all devices in two statements (:func:`_newest_samples_statements`). By host,
    then index.

    The span's four ends are correlated ``min``/``max`` seeks on the device's own index rows
    (one each per device); the samples a range of ``ix_samples_device_ts`` behind the end."""
    ends_q, window_q, n_device = _newest_samples_statements(store.dialect == "postgresql",
                                                            not_after_s is not None)
    params: dict[str, Any] = {"not_after_s": not_after_s, "window_s": window_s}
    with connection(store) as c:
        out, again = _devices_with_spans(c.execute(ends_q, params), n_device, window_s)
        if store.dialect == "postgresql":
            # each device's window end as the first statement found it (not sought again)
            ended = [(now.device["id"], now.span[1]) for now in out if now.span is not None]
            params = {"device_ids": [i for i, _ in ended], "ends_s": [e for _, e in ended],
                      "window_s": window_s}
        _add_window_rows(c.execute(window_q, params), {now.device["id"]: now for now in out})
        for i in again:
            now = out[i]
            ends = now.span
            newest = _newest_of(c, now.device["id"], None if ends is None else ends[1],
                                not_after_s)
            if newest is None:
                continue
            first = newest if ends is None else ends[0]
            out[i] = DeviceNow(now.device, (first, newest),
                               _recent_of(c, now.device, newest - window_s, newest))
        return out


def _recent_of(c: Connection, device: dict[str, Any], lo_s: float,
               hi_s: float) -> list[Sample]:
    """One device's samples in [lo_s, hi_s] that :func:`newest_values` keeps, as
    :func:`newest_samples` reads them."""
    columns = ("phase", "source", "pid", *SAMPLE_COUNTER_FIELDS)
    rows = blocks.window_rows(c, [device["id"]], lo_s, hi_s, columns)
    return newest_values(
        [Sample(r[0], device["device_index"], Phase(r[2]), *r[3:],  # type: ignore[misc]
                host=device["host"], device_uuid=device["uuid"]) for r in rows], _cell_of_sample)


# A window row's places (newest_samples' statements and a Sample alike): its phase, source and
# pid, then the counters
_PHASE_AT, _SOURCE_AT, _PID_AT = 2, 3, 4
_COUNTERS_AT = tuple(range(5, 5 + len(SAMPLE_COUNTER_FIELDS)))


def _cell_of_row(r: Any) -> Any:
    return r[0], r[_SOURCE_AT], r[_PID_AT]  # device id, source, pid


def _cell_of_sample(r: Any) -> Any:
    return r[_SOURCE_AT], r[_PID_AT]  # one device's


def newest_values(rows: Sequence[Any], cell: Any) -> list[Any]:
    """The rows (in time order, ties by id) that hold each cell's newest values: per cell
    (``cell(row)``: a device's source and pid) its newest row, its newest row with each
    counter not NULL and its newest with a known phase; in their order. Any grouping of
    whole cells (a device's NVML rows, a process's) finds its newest value of each counter,
    its newest moment and phase, and each source its newest moment, in these rows as in all
    of them: what a device's values now are made of, without the window's other rows."""
    pending: dict[Any, tuple[int, ...]] = {}
    kept = []
    for r in reversed(rows):
        key = cell(r)
        todo = pending.get(key)
        if todo is None:  # the cell's newest row
            kept.append(r)
            pending[key] = tuple(i for i in _COUNTERS_AT if r[i] is None) + (
                (_PHASE_AT,) if r[_PHASE_AT] == _UNKNOWN else ())
        elif todo:
            still = tuple(i for i in todo if r[i] is None or r[i] == _UNKNOWN)
            if len(still) < len(todo):
                kept.append(r)
                pending[key] = still
    kept.reverse()
    return kept


_UNKNOWN = Phase.UNKNOWN.value  # equal to Phase.UNKNOWN too (a str enum)


_WINDOW: Any = bindparam("window_s", type_=Float)


@cache
def _newest_samples_statements(postgresql: bool, bounded: bool
                               ) -> tuple[Select[Any], Select[Any], int]:
    """:func:`newest_samples`' two statements (their bound and window parameters), built once
    (a scrape runs them every few seconds; building them cost SQLAlchemy more than SQLite
    spends seeking the ends of 512 devices): every device with its span's ends, and every
    device's samples of its window by device id (on PostgreSQL only those
    :func:`newest_values` keeps, and a few of their moment); and where the first one's device
    columns end. Two, not one: joined, each of a fleet's 30,000 window rows carried its
    device's 15 columns again, which cost more to send and convert than the samples
    themselves."""
    not_after: Any = _NOT_AFTER if bounded else None
    # with the span's ends, whether the device straddles a block and its newest block's last
    # sample: where the window reaches into the compact raw tier (a device that stopped
    # sending a while ago, or a view of a compacted time) its samples are read again
    ends = _span_ends(not_after)
    tops = (select(devices, hosts.c.name.label("host"), *ends,
                   blocks.straddles(devices.c.id, not_after).label("straddles"),
                   blocks.edge_of(devices.c.id, True, not_after).label("block_hi"))
            .join(hosts, hosts.c.id == devices.c.host_id).subquery("device_ends"))
    ends_q = select(tops).order_by(tops.c.host, tops.c.device_index)
    # the window's end alone: the newest raw sample, else a minute after the newest rollup
    # (time_range's); computed once a device: flattened into the join, SQLite evaluated the
    # correlated seeks again for every sample row of the device's window (a LIMIT/OFFSET keeps
    # a subquery from being flattened)
    newest: Any = (select(devices.c.id, ends[1], ends[3]).offset(0).subquery("device_newest"))
    end = func.coalesce(newest.c.raw_hi, newest.c.minute_hi + MINUTE_S)
    if postgresql:
        # the devices and their windows' ends as the first statement found them, parameters
        # (sought again here, they were half this statement's time)
        newest = (func.unnest(bindparam("device_ids", type_=PG_ARRAY(Integer)),
                              bindparam("ends_s", type_=PG_ARRAY(Float)))
                  .table_valued("id", "end_s").render_derived(name="device_newest"))
        end = newest.c.end_s
    columns = (samples.c.ts_s, samples.c.phase, samples.c.source, samples.c.pid,
               *(samples.c[n] for n in SAMPLE_COUNTER_FIELDS))
    window = and_(samples.c.device_id == newest.c.id, samples.c.ts_s >= end - _WINDOW,
                  samples.c.ts_s <= end)
    if postgresql:
        # PostgreSQL planned the join as a hash join over every sample stored (the window's
        # bounds a filter on each row). A LATERAL subquery is each device's index range, once
        # it is kept from being pulled up into a plain join again: OFFSET 0, the usual fence
        # Only the rows newest_values keeps are sent (a fleet's window is 30,000 rows, their
        # newest values a few hundred): per device (LATERAL: each device's own index range,
        # grouped in memory) and (source, pid) the moment of its newest row, of its newest
        # with a known phase and with each counter; then the device's rows of those moments
        # (an index seek each). Rows of one moment all come (ties, other cells' rows):
        # newest_values picks among them as among the whole window
        def newest_at(holds: Any) -> Any:
            return func.max(samples.c.ts_s) if holds is None else \
                func.max(samples.c.ts_s).filter(holds)

        moments = [newest_at(None), newest_at(samples.c.phase != Phase.UNKNOWN.value),
                   *(newest_at(samples.c[n].is_not(None)) for n in SAMPLE_COUNTER_FIELDS)]
        cells = (select(pg_array(moments).label("moments")).where(window)
                 .group_by(samples.c.source, samples.c.pid).lateral("cells"))
        kept = (select(newest.c.id, func.unnest(cells.c.moments).label("ts_s"))
                .select_from(newest.join(cells, true())).distinct().subquery("kept"))
        # each moment's rows by their own seek (joined, PostgreSQL merged the moments with
        # every sample stored)
        found = (select(*(c.label(f"s_{c.name}") for c in columns), samples.c.id.label("s_id"))
                 .where(samples.c.device_id == kept.c.id, samples.c.ts_s == kept.c.ts_s)
                 .offset(0).lateral("found"))
        window_q = (select(kept.c.id, *(found.c[f"s_{c.name}"] for c in columns))
                    .select_from(kept.join(found, true()))
                    .order_by(kept.c.id, found.c.s_ts_s, found.c.s_id))
    else:  # SQLite loops over the devices and reads each one's range of the index
        window_q = (select(newest.c.id, *columns).select_from(newest.join(samples, window))
                    .order_by(newest.c.id, samples.c.ts_s, samples.c.id))
    # the devices row and its host; then the span's four ends, whether it straddles a block,
    # its newest block's last sample
    return ends_q, window_q, len(tops.c) - 6


_PHASES = {p.value: p for p in Phase}


def _devices_with_spans(ends: Any, n_device: int,
                        window_s: float) -> tuple[list[DeviceNow], list[int]]:
    """The devices with their spans (``ends``' rows), no samples yet, and the places of those
    whose window also lies in blocks or whose end straddles a block."""
    out: list[DeviceNow] = []
    again: list[int] = []
    keys = list(ends.keys())[:n_device]
    for r in ends:
        span = _span(r[n_device:n_device + 4])
        out.append(DeviceNow(dict(zip(keys, r[:n_device])), span, []))
        block_hi = r[n_device + 5]
        if r[n_device + 4] or (block_hi is not None and span is not None
                               and block_hi >= span[1] - window_s):
            again.append(len(out) - 1)
    return out, again


def _add_window_rows(window: Any, by_id: dict[int, DeviceNow]) -> None:
    """``samples``'s rows of the devices' windows (``window``'s, by device id), those
    :func:`newest_values` keeps, into each device's ``recent``."""
    make = Sample._make
    mine: list[Sample] = []
    device_id = index = host = uuid = None
    for r in newest_values(window.all(), _cell_of_row):
        if r[0] != device_id:
            device_id = r[0]
            d, mine = by_id[device_id].device, by_id[device_id].recent
            index, host, uuid = d["device_index"], d["host"], d["uuid"]
        # r's rest: source, pid and the counters, as Store.iter_samples reads them (a
        # Sample's fields in its order, made without its keyword arguments)
        mine.append(make((r[1], index, _PHASES[r[2]], *r[3:], host, uuid)))


def _span_ends(not_after_s: Any) -> list[Any]:
    """The four ends of ``Store.time_range``'s span of the statement's device row: its first
    and newest raw sample, its first and newest minute rollup (the newest not ahead of
    ``not_after_s`` when given), each a correlated ``min``/``max``: one seek on the device's
    own index rows."""
    def edge(column: Any, owner: Any, fn: Any, bounded: bool) -> Any:
        where = [owner == devices.c.id] + (
            [column <= not_after_s] if bounded and not_after_s is not None else [])
        return select(fn(column)).where(*where).scalar_subquery()

    raw_lo = lesser(edge(samples.c.ts_s, samples.c.device_id, func.min, False),
                    blocks.edge_of(devices.c.id, False, None))
    raw_hi = greater(edge(samples.c.ts_s, samples.c.device_id, func.max, True),
                     blocks.edge_of(devices.c.id, True, not_after_s))
    return [raw_lo.label("raw_lo"), raw_hi.label("raw_hi"),
            edge(rollups.c.bucket_s, rollups.c.device_id, func.min, False).label("minute_lo"),
            edge(rollups.c.bucket_s, rollups.c.device_id, func.max, True).label("minute_hi")]


def _newest_of(c: Connection, device_id: int, raw_s: float | None,
               not_after_s: float | None) -> float | None:
    """``raw_s`` (the newest raw sample found in SQL) or the newest one not ahead of
    ``not_after_s`` of a block across it, whichever is newer."""
    found = blocks.last_ts(c, device_id, not_after_s)
    return max((x for x in (raw_s, found) if x is not None), default=None)


def lesser(a: Any, b: Any) -> Any:
    """The lesser of two nullable SQL values (either where the other is NULL)."""
    return case((a.is_(None), b), (b.is_(None), a), (a <= b, a), else_=b)


def greater(a: Any, b: Any) -> Any:
    """The greater of two nullable SQL values (either where the other is NULL)."""
    return case((a.is_(None), b), (b.is_(None), a), (a >= b, a), else_=b)


def device_spans(store: Store, not_after_s: float | None = None
                 ) -> dict[tuple[str, int], tuple[float, float] | None]:
    """Every device's span (as ``Store.time_range(device, host, not_after_s=not_after_s)``
    gives it: its first and newest sample, reaching back into the minute rollups; None:
    nothing stored) by (host name, device index), in one statement."""
    q = _device_spans_statement(not_after_s is not None)
    with connection(store) as c:
        out = {}
        for row in c.execute(q, {"not_after_s": not_after_s}).all():
            did, host, index, raw_lo, raw_hi, minute_lo, minute_hi, straddles = tuple(row)
            if straddles:
                raw_hi = _newest_of(c, did, raw_hi, not_after_s)
            out[(host, index)] = _span((raw_lo, raw_hi, minute_lo, minute_hi))
        return out


def _span(ends: Sequence[Any]) -> tuple[float, float] | None:
    """``Store.time_range``'s span of one device from its raw and minute ends."""
    raw_lo, raw_hi, minute_lo, minute_hi = ends
    firsts = [x for x in (raw_lo, minute_lo) if x is not None]
    last = raw_hi if raw_hi is not None else (
        None if minute_hi is None else minute_hi + MINUTE_S)
    if not firsts or last is None:
        return None
    return float(min(firsts)), float(last)
