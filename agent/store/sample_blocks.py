"""The compact raw tier: closed intervals of raw samples moved from ``samples`` into blocks.

Writes are unchanged; the store-wide maintenance (:mod:`vramscope.agent.retention`) compacts
each closed ``BLOCK_S`` interval older than ``retention.compact_after_s`` and already rolled up
into one ``sample_blocks`` row per (source, pid) (docs/agent.md, "Retention and rollups"). The
rows moved are the ones the ``DELETE ... RETURNING`` removed, so a row written meanwhile is
either moved or left in ``samples``, never lost; each interval is a transaction of its own.

Reads: :func:`window_slices` for the readers that group on a grid
(:mod:`~vramscope.agent.store.block_grid`), :func:`window_rows` (rows merged in (ts_s, id)
order) for those that list rows, :func:`stored_keys` for import's duplicate check.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from itertools import groupby, repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Connection, Table, delete, exists, func, insert, literal, select
from vramscope.agent.store import block_codec
from vramscope.agent.store.read_once import once
from vramscope.agent.store.schema import devices, sample_blocks, samples

if TYPE_CHECKING:
    from vramscope.agent.store.store import Store

BLOCK_S = 600.0  # a block's interval: ten minutes (6,000 samples of one source at 10 Hz)
# the columns of ``samples`` a block keeps besides its key (device_id, source, pid)
_KEY = ("device_id", "source", "pid")
_ROW = (*_KEY, *block_codec.COLUMNS)  # what compaction reads back from the DELETE


def block_start(ts_s: float) -> float:
    return math.floor(ts_s / BLOCK_S) * BLOCK_S


# --- reads -------------------------------------------------------------------------------------
def overlapping(device_ids: Sequence[int] | None, lo_s: float | None,
                hi_s: float | None, table: Table = sample_blocks) -> list[Any]:
    """Conditions on ``sample_blocks`` (or ``event_blocks``, whose key columns are the same)
    for blocks that may hold rows of ``device_ids`` (every device: None) in [lo_s, hi_s]: a
    range of the ``(device_id, block_s)`` index per device."""
    where: list[Any] = []
    if device_ids is not None:
        where.append(_one_of(table.c.device_id, device_ids))
    if lo_s is not None:
        where += [table.c.block_s >= block_start(lo_s), table.c.last_s >= lo_s]
    if hi_s is not None:
        where += [table.c.block_s <= hi_s, table.c.first_s <= hi_s]
    return where


def _one_of(column: Any, ids: Sequence[int]) -> Any:
    """``column IN ids``; ``=`` for one id (a page reads one device: an expanding IN costs
    SQLAlchemy more than the seek)."""
    return column == ids[0] if len(ids) == 1 else column.in_(list(ids))


class Slice(NamedTuple):
    """One block's rows in a window: its key, its decoded columns (:data:`block_codec.COLUMNS`
    order, shared with the cache: never to be changed) and the window's rows ``[a, b)``."""

    device_id: int
    source: str | None
    pid: int | None
    columns: list[Sequence[Any]]
    a: int
    b: int

    def column(self, name: str) -> Sequence[Any]:
        return self.columns[_PLACE[name]]


def window_slices(c: Connection, device_ids: Sequence[int] | None, lo_s: float | None,
                  hi_s: float | None, include_hi: bool = True) -> list[Slice]:
    """The blocks of ``device_ids`` (every device: None) with rows in [lo_s, hi_s] (or
    [lo_s, hi_s) without ``include_hi``), decoded (through the cache), each with the window's
    rows as a slice: a block's rows are in (ts_s, id) order, so the window is found by
    bisection. What the readers that aggregate in Python walk instead of a table."""
    found = _metas(c, device_ids, lo_s, hi_s)
    lo = -math.inf if lo_s is None else lo_s
    hi = math.inf if hi_s is None else hi_s
    upper = bisect_right if include_hi else bisect_left
    decoded = _columns(c, [(r[0], r[4], r[5], r[6]) for r in found])
    ts = _PLACE["ts_s"]
    out = []
    for bid, did, source, pid, *_ in found:
        columns = decoded[bid]
        a, b = bisect_left(columns[ts], lo), upper(columns[ts], hi)
        if a < b:
            out.append(Slice(did, source, pid, columns, a, b))
    return out


def _metas(c: Connection, device_ids: Sequence[int] | None, lo_s: float | None,
           hi_s: float | None) -> list[tuple[Any, ...]]:
    """``(id, device_id, source, pid, count, first_s, last_s, block_s)`` of the blocks of
    ``device_ids`` (every device: None) that may hold rows in [lo_s, hi_s]. Within
    ``read_once.reading`` a window inside one listed before is picked from that list by
    :func:`overlapping`'s conditions (a timeline's series, phases, counts and per-process
    reads ask of its window, or of the part of it from the first raw sample on)."""
    lo = -math.inf if lo_s is None else lo_s
    hi = math.inf if hi_s is None else hi_s
    ids = None if device_ids is None else tuple(device_ids)
    listed: list[tuple[float, float, list[tuple[Any, ...]]]] = once(
        ("sample_blocks.metas", c.engine, ids), list)
    for outer_lo, outer_hi, rows in listed:
        if outer_lo <= lo and hi <= outer_hi:
            start = block_start(lo) if lo > -math.inf else -math.inf
            return [r for r in rows if start <= r[7] <= hi and r[6] >= lo and r[5] <= hi]
    q = (select(sample_blocks.c.id, sample_blocks.c.device_id, sample_blocks.c.source,
                sample_blocks.c.pid, sample_blocks.c.count, sample_blocks.c.first_s,
                sample_blocks.c.last_s, sample_blocks.c.block_s)
         .where(*overlapping(device_ids, lo_s, hi_s)))
    found = [tuple(r) for r in c.execute(q).all()]
    listed.append((lo, hi, found))
    return found


def window_rows(c: Connection, device_ids: Sequence[int], lo_s: float | None,
                hi_s: float | None, names: Sequence[str], *, source: str | None = None,
                newest_first: bool = False, limit: int | None = None) -> list[tuple[Any, ...]]:
    """The raw rows of ``device_ids`` in [lo_s, hi_s] (None: open) of ``samples`` and of the
    blocks together, of ``source`` when given, as ``(ts_s, id, *names)`` tuples (``names``:
    columns of ``samples``) in (ts_s, id) order (``newest_first``: reversed), at most
    ``limit``: what a reader that lists rows (rather than groups them) reads where blocks
    overlap its window. ``samples``'s part in SQL, each block's slice zipped in C, the two
    sorted together."""
    where = [_one_of(samples.c.device_id, device_ids)]
    if lo_s is not None:
        where.append(samples.c.ts_s >= lo_s)
    if hi_s is not None:
        where.append(samples.c.ts_s <= hi_s)
    if source is not None:
        where.append(samples.c.source == source)
    order = (samples.c.ts_s.desc(), samples.c.id.desc()) if newest_first else (
        samples.c.ts_s, samples.c.id)
    q = (select(samples.c.ts_s, samples.c.id, *(samples.c[n] for n in names))
         .where(*where).order_by(*order))
    if limit is not None:
        q = q.limit(limit)
    rows: list[tuple[Any, ...]] = [tuple(r) for r in c.execute(q).all()]
    for s in window_slices(c, device_ids, lo_s, hi_s):
        if source is not None and s.source != source:
            continue
        a, b = s.a, s.b
        if limit is not None:  # a block's first (or newest) rows are its first (last) ones
            a, b = (max(a, b - limit), b) if newest_first else (a, min(b, a + limit))
        key = {"device_id": repeat(s.device_id), "source": repeat(s.source),
               "pid": repeat(s.pid)}
        rows.extend(zip(*(key[n] if n in key else s.columns[_PLACE[n]][a:b]
                          for n in ("ts_s", "id", *names))))
    rows.sort(key=itemgetter(0, 1), reverse=newest_first)
    return rows if limit is None else rows[:limit]


# A listing's rows are read this much time at a time (iter_window_rows): 36,000 rows a device
# at 10 Hz in memory, not the 864,000 of a day that export and analyze --db read whole
ROWS_CHUNK_S = 3_600.0


def iter_window_rows(c: Connection, device_ids: Sequence[int], lo_s: float | None,
                     hi_s: float | None, names: Sequence[str], *, source: str | None = None,
                     limit: int | None = None) -> Iterator[tuple[Any, ...]]:
    """:func:`window_rows` (oldest first) of a window of any length, ``ROWS_CHUNK_S`` of it at
    a time: the same rows in the same order, in memory a chunk at a time."""
    if lo_s is not None and hi_s is not None and hi_s - lo_s <= ROWS_CHUNK_S:
        yield from window_rows(c, device_ids, lo_s, hi_s, names, source=source, limit=limit)
        return
    span = _rows_span(c, device_ids)
    if span is None:
        return
    start = span[0] if lo_s is None else max(lo_s, span[0])
    hi = span[1] if hi_s is None else min(hi_s, span[1])
    left = limit
    while start <= hi and (left is None or left > 0):
        stop = start + ROWS_CHUNK_S
        rows = window_rows(c, device_ids, start, min(stop, hi), names, source=source, limit=left)
        if stop <= hi:  # the rows at ``stop`` itself are the next chunk's first
            rows = [r for r in rows if r[0] < stop]
        yield from rows
        if left is not None:
            left -= len(rows)
        start = stop


def _rows_span(c: Connection, device_ids: Sequence[int]) -> tuple[float, float] | None:
    """The first and newest raw sample time of ``device_ids`` in ``samples`` and the blocks
    (a seek each per device), or None."""
    found: list[float] = []
    for did in device_ids:
        mine = samples.c.device_id == did
        q = select(select(func.min(samples.c.ts_s)).where(mine).scalar_subquery(),
                   select(func.max(samples.c.ts_s)).where(mine).scalar_subquery(),
                   edge_of(did, False, None), edge_of(did, True, None))
        found += [float(x) for x in c.execute(q).one() if x is not None]
    return (min(found), max(found)) if found else None


def _columns(c: Connection, metas: list[_Key]) -> dict[int, list[Sequence[Any]]]:
    """The decoded columns of blocks ``(id, count, first_s, last_s)``, by id: from the cache,
    the others read and decoded (and cached). Held here whatever the cache keeps: a window of
    more rows than it holds (an export) evicts its own first blocks."""
    cache = decoded_cache(c)
    keys = {m[0]: m for m in metas}
    out = {}
    for bid, key in keys.items():
        found = cache.get(key)
        if found is not None:
            out[bid] = found
    missing = [bid for bid in keys if bid not in out]
    for i in range(0, len(missing), 500):
        chunk = missing[i:i + 500]
        for bid, data in c.execute(select(sample_blocks.c.id, sample_blocks.c.data)
                                   .where(sample_blocks.c.id.in_(chunk))).all():
            out[bid] = block_codec.decode_columns(data)
            cache.put(keys[bid], out[bid])
    return out


_PLACE = {name: i for i, name in enumerate(block_codec.COLUMNS)}
_Key = tuple[int, int, float, float]


class _Decoded:
    """Decoded blocks of one database, the least recently read going first once more than
    ``_CACHE_ROWS`` rows are held. A block is never changed once written (compaction writes
    new ones, retention deletes them), so one request's several reads of a window, and the
    next refresh's, decode it once. Keyed by (block id, row count, first and last time): an
    id SQLite gives again after the newest block was deleted comes with other rows."""

    def __init__(self) -> None:
        self._blocks: OrderedDict[_Key, Any] = OrderedDict()
        self._rows = 0
        self._lock = threading.Lock()

    def get(self, key: _Key) -> Any:
        with self._lock:
            found = self._blocks.get(key)
            if found is not None:
                self._blocks.move_to_end(key)
            return found

    def put(self, key: _Key, columns: Any) -> None:
        with self._lock:
            if key not in self._blocks:
                self._rows += key[1]
            self._blocks[key] = columns
            while self._rows > _CACHE_ROWS and len(self._blocks) > 1:
                old, _ = self._blocks.popitem(last=False)
                self._rows -= old[1]


# 500,000 rows: 83 ten-minute blocks of one source at 10 Hz, about 80 MB decoded (165 bytes a
# row, block_codec.decode_columns) at most; a page's reads of one device touch far fewer
_CACHE_ROWS = 500_000
_caches: dict[Any, _Decoded] = {}  # by the blocks' table and the engine's URL
_caches_lock = threading.Lock()


def decoded_cache(c: Connection, table: str = "sample_blocks") -> _Decoded:
    """The decoded blocks of ``table`` (``sample_blocks``, or ``event_blocks``: ids of two
    tables are not to meet in one cache) of ``c``'s database."""
    with _caches_lock:
        found = _caches.get((table, c.engine.url))
        if found is None:
            found = _caches[(table, c.engine.url)] = _Decoded()
        return found


def any_blocks(c: Connection, device_ids: Sequence[int] | None, lo_s: float | None,
               hi_s: float | None) -> bool:
    q = select(sample_blocks.c.id).where(*overlapping(device_ids, lo_s, hi_s)).limit(1)
    return c.execute(q).first() is not None


def edge_span(c: Connection, device_id: int, lo_s: float, hi_s: float, n: int,
              newest: bool) -> tuple[float, float]:
    """The part of [lo_s, hi_s] that holds the device's first (or ``newest``) ``n`` raw rows
    of ``samples`` and the blocks together: what a read of a window's edge rows (``ORDER BY
    ts_s LIMIT n``) needs decoded, instead of every block of the window (a day: 864,000 rows
    at 10 Hz). The ``n``-th time from that end in ``samples`` (one index range) and in the
    blocks, walked from that end until ``n`` rows are found and the next block starts past
    the ``n``-th of them."""
    order = samples.c.ts_s.desc() if newest else samples.c.ts_s.asc()
    q = (select(samples.c.ts_s).where(samples.c.device_id == device_id,
                                      samples.c.ts_s >= lo_s, samples.c.ts_s <= hi_s)
         .order_by(order).offset(n - 1).limit(1))
    nth = c.execute(q).scalar()
    edge = (hi_s if not newest else lo_s) if nth is None else float(nth)
    first, last = sample_blocks.c.first_s, sample_blocks.c.last_s
    blocks_q = (select(sample_blocks.c.id, sample_blocks.c.count, first, last)
                .where(*overlapping([device_id], lo_s, hi_s))
                .order_by(last.desc() if newest else first.asc()))
    times: list[float] = []
    for meta in c.execute(blocks_q).all():
        if len(times) >= n:
            nth_block = times[n - 1]
            if (meta[3] < nth_block) if newest else (meta[2] > nth_block):
                break
        block_times = _columns(c, [tuple(meta)])[meta[0]][_PLACE["ts_s"]]
        # the block's n rows nearest this end (bisected: its times are in order)
        a, b = bisect_left(block_times, lo_s), bisect_right(block_times, hi_s)
        part = block_times[max(a, b - n):b] if newest else block_times[a:min(b, a + n)]
        times = sorted([*times, *part], reverse=newest)[:n]
    # the union's first n rows lie within the n-th of either part that has n (a part with
    # fewer bounds nothing: the other part's n-th, or the window's end, does)
    if len(times) >= n:
        edge = max(edge, times[n - 1]) if newest else min(edge, times[n - 1])
    return (edge, hi_s) if newest else (lo_s, edge)


# the blocks an edge's interval is picked from: a name of its own, not the outer statement's
# rows (made once: an alias of a table costs SQLAlchemy a copy of every column)
_INTERVAL_PICK = sample_blocks.alias("interval_pick")


def edge_of(device_id: Any, newest: bool, not_after_s: float | None) -> Any:
    """The first or ``newest`` sample time of ``device_id`` (an id, or a column its statement
    correlates) in the compact raw tier, as a scalar subquery; bounded, the newest of the
    blocks wholly before ``not_after_s`` (a block that straddles it is :func:`straddles`'s to
    correct). Seeks on the ``(device_id, block_s)`` index: a device's first sample is in a
    block of its first interval, its newest in one of its last (or, bounded, of the last
    interval ended by the bound, or of the bound's own interval)."""
    mine = sample_blocks.c.device_id == device_id
    block_s, first_s, last_s = (sample_blocks.c.block_s, sample_blocks.c.first_s,
                                sample_blocks.c.last_s)

    def of_interval(edge: Any, before_s: float | None = None) -> Any:
        inner = _INTERVAL_PICK
        where = [inner.c.device_id == device_id]
        if before_s is not None:
            where.append(inner.c.block_s <= before_s)
        pick = select((func.max if newest else func.min)(inner.c.block_s)).where(*where) \
            .correlate_except(inner)  # device_id may be an outer query's column, two levels out
        return (select((func.max if newest else func.min)(edge))
                .where(mine, block_s == pick.scalar_subquery()).scalar_subquery())

    if not newest:
        return of_interval(first_s)
    if not_after_s is None:
        return of_interval(last_s)
    ended = of_interval(last_s, not_after_s - BLOCK_S)
    current = (select(func.max(last_s))
               .where(mine, block_s > not_after_s - BLOCK_S, block_s <= not_after_s,
                      last_s <= not_after_s).scalar_subquery())
    return func.coalesce(current, ended)


def straddles(device_id: Any, not_after_s: float | None) -> Any:
    """Whether ``device_id`` (an id, or a column its statement correlates) has a block across
    ``not_after_s`` (its first sample before, its last after: a view of a time already
    compacted), whose rows up to it :func:`last_ts` decodes; false without a bound. A seek on
    the device's blocks."""
    if not_after_s is None:
        return literal(False)
    return exists().where(sample_blocks.c.device_id == device_id,
                          sample_blocks.c.block_s > not_after_s - BLOCK_S,
                          sample_blocks.c.block_s <= not_after_s,
                          sample_blocks.c.first_s <= not_after_s,
                          sample_blocks.c.last_s > not_after_s)


def last_ts(c: Connection, device_id: int, not_after_s: float | None = None) -> float | None:
    """The device's newest sample time kept in blocks, not after ``not_after_s``: the newest
    block wholly before it (one seek), or the rows up to it of a block across it (decoded)."""
    q = select(func.max(sample_blocks.c.last_s)).where(sample_blocks.c.device_id == device_id)
    if not_after_s is None:
        value = c.execute(q).scalar()
        return None if value is None else float(value)
    whole = c.execute(q.where(sample_blocks.c.last_s <= not_after_s)).scalar()
    found = [float(whole)] if whole is not None else []
    across = c.execute(
        select(sample_blocks.c.id, sample_blocks.c.count, sample_blocks.c.first_s,
               sample_blocks.c.last_s)
        .where(sample_blocks.c.device_id == device_id,
               sample_blocks.c.block_s > not_after_s - BLOCK_S,
               sample_blocks.c.block_s <= not_after_s,
               sample_blocks.c.first_s <= not_after_s,
               sample_blocks.c.last_s > not_after_s)).all()
    for columns in _columns(c, [tuple(m) for m in across]).values():
        times = columns[_PLACE["ts_s"]]
        at = bisect_right(times, not_after_s)
        if at:
            found.append(times[at - 1])
    return max(found) if found else None


def count_in(c: Connection, device_id: int, lo_s: float | None, hi_s: float | None,
             limit: int) -> int:
    """The device's samples kept in blocks in [lo_s, hi_s], counted up to ``limit + 1``: a
    block wholly inside by its stored count, one across an end by bisecting its (cached)
    times."""
    lo = -math.inf if lo_s is None else lo_s
    hi = math.inf if hi_s is None else hi_s
    total = 0
    partial = []
    for bid, _, _, _, count, first, last, _ in _metas(c, [device_id], lo_s, hi_s):
        if lo <= first and last <= hi:
            total += int(count)
        else:
            partial.append((bid, count, first, last))
        if total > limit:
            return limit + 1
    for columns in _columns(c, partial).values():
        times = columns[_PLACE["ts_s"]]
        total += bisect_right(times, hi) - bisect_left(times, lo)
    return min(total, limit + 1)


def stored_keys(c: Connection, times: Sequence[float], keys: Iterable[int]) -> set[int]:
    """Which of ``keys`` (content keys of rows timed ``times``) the keyed blocks overlapping
    the span of ``times`` hold, with their times: what import's duplicate check adds to the
    keys it finds in ``samples``."""
    if not times:
        return set()
    lo, hi = min(times), max(times)
    q = (select(sample_blocks.c.data)
         .where(*overlapping(None, lo, hi), sample_blocks.c.keyed > 0))
    wanted = set(zip(times, keys))
    ts, key = block_codec.COLUMNS.index("ts_s"), block_codec.COLUMNS.index("content_key")
    found: set[int] = set()
    for (data,) in c.execute(q).all():
        found.update(r[key] for r in block_codec.decode(data)
                     if r[key] is not None and (r[ts], r[key]) in wanted)
    return found


# --- compaction --------------------------------------------------------------------------------
def due_sets(store: Store, closed_by_s: float, limit: int,
             rows_before_s: float | None = None,
             ids: Sequence[int] | None = None) -> list[tuple[float, int]]:
    """At most ``limit`` (interval start, device id) whose interval ends by ``closed_by_s``
    and still has rows in ``samples`` (before ``rows_before_s``, when given), oldest first:
    each device's oldest such row (one seek each); of devices ``ids`` only, when given."""
    before = closed_by_s if rows_before_s is None else min(closed_by_s, rows_before_s)
    first = (select(samples.c.ts_s).where(samples.c.device_id == devices.c.id,
                                          samples.c.ts_s < before)
             .order_by(samples.c.ts_s).limit(1).scalar_subquery())
    q = select(devices.c.id, first)
    if ids is not None:
        q = q.where(devices.c.id.in_(ids))
    with store.engine.connect() as c:
        found = c.execute(q).all()
    due = sorted((block_start(float(ts)), int(did)) for did, ts in found
                 if ts is not None and block_start(float(ts)) + BLOCK_S <= closed_by_s)
    return due[:limit]


def compact(store: Store, closed_by_s: float, max_sets: int,
            rows_before_s: float | None = None) -> int:
    """Move at most ``max_sets`` closed intervals (of one device each) that end by
    ``closed_by_s`` from ``samples`` into blocks, each in its own transaction: their rows
    before ``rows_before_s`` when given (retention: the rolled-up ones); rows moved."""
    moved, left = 0, max_sets
    while left > 0:  # each look-up finds every device's oldest due interval
        due = due_sets(store, closed_by_s, left, rows_before_s)
        for start, did in due:
            moved += compact_interval(store, did, start, rows_before_s)
        left -= len(due)
        if not due:
            break
    return moved


def compact_interval(store: Store, device_id: int, start_s: float,
                     rows_before_s: float | None = None) -> int:
    """One device's interval [start_s, start_s + BLOCK_S) (its rows before ``rows_before_s``
    when given): its rows deleted from ``samples`` and written as blocks, one per (source,
    pid), in one transaction; rows moved. Rows the interval gets later (late writes, an
    import) become blocks of their own at the next compaction."""
    cols = [samples.c[n] for n in _ROW]
    end = start_s + BLOCK_S if rows_before_s is None else min(start_s + BLOCK_S, rows_before_s)
    with store.engine.begin() as c:
        rows = c.execute(delete(samples)
                         .where(samples.c.device_id == device_id, samples.c.ts_s >= start_s,
                                samples.c.ts_s < end)
                         .returning(*cols)).all()
        blocks = pack_blocks(start_s, [tuple(r) for r in rows])
        if blocks:
            c.execute(insert(sample_blocks), blocks)
    return len(rows)


def pack_blocks(start_s: float, rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """``sample_blocks`` rows of raw rows laid out as ``_ROW`` (any order, one interval)."""
    ts = _ROW.index("ts_s")
    ident = _ROW.index("id")
    key_at = _ROW.index("content_key")

    def group(r: tuple[Any, ...]) -> tuple[Any, ...]:
        return (r[0], r[1] or "", r[1] is None, r[2] if r[2] is not None else -1,
                r[2] is None)

    out = []
    for _, members in groupby(sorted(rows, key=lambda r: (*group(r), r[ts], r[ident])),
                              key=group):
        block = list(members)
        out.append({"device_id": block[0][0], "block_s": start_s, "source": block[0][1],
                    "pid": block[0][2], "first_s": block[0][ts], "last_s": block[-1][ts],
                    "count": len(block),
                    "keyed": sum(1 for r in block if r[key_at] is not None),
                    "data": block_codec.encode([r[3:] for r in block])})
    return out


def delete_older(store: Store, cutoff_s: float, limit: int,
                 table: Table = sample_blocks) -> int:
    """Delete at most ``limit`` blocks of ``table`` (``sample_blocks``, or ``event_blocks``)
    whose interval ends by ``cutoff_s`` (retention's raw cutoff: a block goes whole, so its
    rows stay at most ``BLOCK_S`` longer than a row of ``samples`` would); blocks deleted."""
    with store.engine.begin() as c:
        ids = c.execute(select(table.c.id).where(table.c.block_s <= cutoff_s - BLOCK_S)
                        .limit(limit)).scalars().all()
        if not ids:
            return 0
        return c.execute(delete(table).where(table.c.id.in_(ids))).rowcount
