"""The compact raw tier: closed intervals of raw samples moved from ``samples`` into blocks.

Writes are unchanged: the live agent and ``import`` insert rows into ``samples``, with their
idempotency keys ((origin, seq) and ``content_key``). The store-wide maintenance (the agent
holding the store-wide lock, :mod:`vramscope.agent.retention`) then compacts: per device, each
closed ``BLOCK_S`` interval older than ``retention.compact_after_s`` and already rolled up has
its rows deleted from ``samples`` and written back, in the same transaction, as one
``sample_blocks`` row per (source, pid): the interval's rows as compressed columns
(:mod:`vramscope.agent.store.block_codec`). The rows moved are the ones the ``DELETE ...
RETURNING`` removed, so a row written meanwhile is either moved or left in ``samples``, never
lost. Each interval moves in a transaction of its own: compaction (and the conversion of a
store upgraded with rows in ``samples``, which is the same compaction) can stop anywhere and
reads stay exact.

Reads: every read of raw samples asks :func:`raw_samples` for its table. Where no block
overlaps the devices and window asked, that is ``samples`` itself; else the overlapping blocks
are decoded into a temporary table of the connection (``samples_unpacked``, the rows of the
window only) and the read runs on ``samples UNION ALL samples_unpacked``: the same rows, ids,
values and phases as before compaction, so the tier modules' SQL (grouping, window functions,
ordering by (ts_s, id)) is unchanged.

Import's duplicate check: blocks keep each row's ``content_key``; a batch's keys are looked
up in the keyed blocks (``keyed > 0``) overlapping its span as well as in ``samples``
(:func:`stored_keys`), so a file imported twice stores nothing twice after compaction too.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import groupby, repeat
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Column,
    Connection,
    FromClause,
    MetaData,
    Table,
    delete,
    func,
    insert,
    select,
)
from sqlalchemy.schema import CreateTable
from vramscope.agent.store import block_codec
from vramscope.agent.store.schema import devices, sample_blocks, samples

if TYPE_CHECKING:
    from vramscope.agent.store.store import Store

BLOCK_S = 600.0  # a block's interval: ten minutes (6,000 samples of one source at 10 Hz)
# the columns of ``samples`` a block keeps besides its key (device_id, source, pid)
_KEY = ("device_id", "source", "pid")
_ROW = (*_KEY, *block_codec.COLUMNS)  # what compaction reads back from the DELETE
SAMPLE_COLUMNS = tuple(c.name for c in samples.columns)

# The connection's decoded rows: a temporary table shaped as ``samples`` (its own metadata,
# so that the schema's, which Alembic compares, never sees it).
_unpacked_metadata = MetaData()
unpacked = Table("samples_unpacked", _unpacked_metadata,
                 *(Column(c.name, c.type, nullable=True) for c in samples.columns),
                 prefixes=["TEMPORARY"])


def block_start(ts_s: float) -> float:
    return math.floor(ts_s / BLOCK_S) * BLOCK_S


# --- reads -------------------------------------------------------------------------------------
def overlapping(device_ids: Sequence[int] | None, lo_s: float | None,
                hi_s: float | None) -> list[Any]:
    """Conditions on ``sample_blocks`` for blocks that may hold rows of ``device_ids`` (every
    device: None) in [lo_s, hi_s]: a range of the ``(device_id, block_s)`` index per device."""
    where: list[Any] = []
    if device_ids is not None:
        where.append(sample_blocks.c.device_id.in_(list(device_ids)))
    if lo_s is not None:
        where += [sample_blocks.c.block_s >= block_start(lo_s),
                  sample_blocks.c.last_s >= lo_s]
    if hi_s is not None:
        where += [sample_blocks.c.block_s <= hi_s, sample_blocks.c.first_s <= hi_s]
    return where


def rows_of_blocks(c: Connection, device_ids: Sequence[int] | None, lo_s: float | None,
                   hi_s: float | None) -> list[tuple[Any, ...]]:
    """The rows the blocks hold for ``device_ids`` in [lo_s, hi_s], as rows of ``samples``
    (:data:`SAMPLE_COLUMNS` order), in no particular order. A block's rows are in time order,
    so the window is a slice of its columns (found by bisection), zipped into rows in C."""
    q = (select(sample_blocks.c.id, sample_blocks.c.device_id, sample_blocks.c.source,
                sample_blocks.c.pid, sample_blocks.c.count, sample_blocks.c.first_s,
                sample_blocks.c.last_s)
         .where(*overlapping(device_ids, lo_s, hi_s)))
    found = c.execute(q).all()
    lo = -math.inf if lo_s is None else lo_s
    hi = math.inf if hi_s is None else hi_s
    decoded = _columns(c, [(r[0], r[4], r[5], r[6]) for r in found])
    ts = _PLACE["ts_s"]
    out: list[tuple[Any, ...]] = []
    for bid, did, source, pid, *_ in found:
        columns = decoded[bid]
        times = columns[ts]
        a, b = bisect_left(times, lo), bisect_right(times, hi)
        if a >= b:
            continue
        key = {"device_id": repeat(did), "source": repeat(source), "pid": repeat(pid)}
        out.extend(zip(*(key[name] if name in key else columns[_PLACE[name]][a:b]
                         for name in SAMPLE_COLUMNS)))
    return out


def _columns(c: Connection, metas: list[_Key]) -> dict[int, list[list[Any]]]:
    """The decoded columns of blocks ``(id, count, first_s, last_s)``, by id: from the cache,
    the others read and decoded (and cached)."""
    cache = _decoded_cache(c)
    keys = {m[0]: m for m in metas}
    missing = [bid for bid, key in keys.items() if key not in cache]
    for i in range(0, len(missing), 500):
        chunk = missing[i:i + 500]
        for bid, data in c.execute(select(sample_blocks.c.id, sample_blocks.c.data)
                                   .where(sample_blocks.c.id.in_(chunk))).all():
            _remember(cache, keys[bid], block_codec.decode_columns(data))
    with _cache_lock:
        return {bid: cache[key] for bid, key in keys.items()}


_PLACE = {name: i for i, name in enumerate(block_codec.COLUMNS)}
# Decoded blocks, per database: a block is never changed once written (compaction writes new
# ones, retention deletes them), so one request's several reads of a window, and the next
# refresh's, decode it once. Keyed by (block id, row count, first and last time): an id SQLite
# gives again after the newest block was deleted comes with other rows. The oldest entries go
# first once more than ``_CACHE_ROWS`` rows are held.
_CACHE_ROWS = 2_000_000
_Key = tuple[int, int, float, float]
_caches: dict[str, OrderedDict[_Key, list[list[Any]]]] = {}
_cache_lock = threading.Lock()


def _decoded_cache(c: Connection) -> OrderedDict[_Key, list[list[Any]]]:
    url = c.engine.url.render_as_string(hide_password=True)
    with _cache_lock:
        return _caches.setdefault(url, OrderedDict())


def _remember(cache: OrderedDict[_Key, list[list[Any]]], key: _Key,
              columns: list[list[Any]]) -> None:
    with _cache_lock:
        cache[key] = columns
        rows = sum(k[1] for k in cache)
        while rows > _CACHE_ROWS and len(cache) > 1:
            old, _ = cache.popitem(last=False)
            rows -= old[1]


def any_blocks(c: Connection, device_ids: Sequence[int] | None, lo_s: float | None,
               hi_s: float | None) -> bool:
    q = select(sample_blocks.c.id).where(*overlapping(device_ids, lo_s, hi_s)).limit(1)
    return c.execute(q).first() is not None


def raw_samples(c: Connection, device_ids: Sequence[int] | None, lo_s: float | None = None,
                hi_s: float | None = None) -> FromClause:
    """The table a read of raw samples of ``device_ids`` (every device: None) in [lo_s, hi_s]
    runs on, through connection ``c``: ``samples`` where no block overlaps them, else
    ``samples`` and the blocks' rows of that window (decoded into the connection's temporary
    table) under one UNION ALL, with ``samples``'s column names. A read must run on ``c``."""
    if not any_blocks(c, device_ids, lo_s, hi_s):
        return samples
    rows = rows_of_blocks(c, device_ids, lo_s, hi_s)
    c.execute(CreateTable(unpacked, if_not_exists=True))
    c.execute(delete(unpacked))
    if rows:
        _insert_unpacked(c, rows)
    names = SAMPLE_COLUMNS
    both = select(*(samples.c[n] for n in names)).union_all(
        select(*(unpacked.c[n] for n in names)))
    return both.subquery("raw_samples")


def _insert_unpacked(c: Connection, rows: list[tuple[Any, ...]]) -> None:
    if c.dialect.name == "postgresql":
        types = [_pg_type(col) for col in unpacked.columns]
        sql = (f"INSERT INTO samples_unpacked ({', '.join(SAMPLE_COLUMNS)}) SELECT * FROM "
               f"unnest({', '.join(f'%s::{t}[]' for t in types)})")
        c.exec_driver_sql(sql, tuple(list(col) for col in zip(*rows)))
        return
    marks = ", ".join("?" * len(SAMPLE_COLUMNS))
    c.exec_driver_sql(f"INSERT INTO samples_unpacked ({', '.join(SAMPLE_COLUMNS)}) "
                      f"VALUES ({marks})", rows)


def _pg_type(col: Column[Any]) -> str:
    name = type(col.type).__name__
    return {"BigInteger": "int8", "Integer": "int4", "Float": "float8"}.get(name, "text")


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
        times = sorted(times + [t for t in block_times if lo_s <= t <= hi_s], reverse=newest)
    # the union's first n rows lie within the n-th of either part that has n (a part with
    # fewer bounds nothing: the other part's n-th, or the window's end, does)
    if len(times) >= n:
        edge = max(edge, times[n - 1]) if newest else min(edge, times[n - 1])
    return (edge, hi_s) if newest else (lo_s, edge)


def first_ts(c: Connection, device_id: Any) -> float | None:
    """The device's first sample time kept in blocks (``device_id``: an id or a scalar
    subquery), or None: one seek."""
    q = (select(sample_blocks.c.first_s).where(sample_blocks.c.device_id == device_id)
         .order_by(sample_blocks.c.block_s, sample_blocks.c.first_s).limit(1))
    value = c.execute(q).scalar()
    return None if value is None else float(value)


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
    q = (select(sample_blocks.c.id, sample_blocks.c.count, sample_blocks.c.first_s,
                sample_blocks.c.last_s)
         .where(*overlapping([device_id], lo_s, hi_s)))
    lo = -math.inf if lo_s is None else lo_s
    hi = math.inf if hi_s is None else hi_s
    total = 0
    partial = []
    for meta in c.execute(q).all():
        if lo <= meta[2] and meta[3] <= hi:
            total += int(meta[1])
        else:
            partial.append(tuple(meta))
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
             rows_before_s: float | None = None) -> list[tuple[float, int]]:
    """At most ``limit`` (interval start, device id) whose interval ends by ``closed_by_s``
    and still has rows in ``samples`` (before ``rows_before_s``, when given), oldest first:
    each device's oldest such row (one seek each)."""
    before = closed_by_s if rows_before_s is None else min(closed_by_s, rows_before_s)
    first = (select(samples.c.ts_s).where(samples.c.device_id == devices.c.id,
                                          samples.c.ts_s < before)
             .order_by(samples.c.ts_s).limit(1).scalar_subquery())
    with store.engine.connect() as c:
        found = c.execute(select(devices.c.id, first)).all()
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


def delete_older(store: Store, cutoff_s: float, limit: int) -> int:
    """Delete at most ``limit`` blocks whose interval ends by ``cutoff_s`` (retention's raw
    cutoff: a block goes whole, so its rows stay at most ``BLOCK_S`` longer than a row of
    ``samples`` would); blocks deleted."""
    with store.engine.begin() as c:
        ids = c.execute(select(sample_blocks.c.id)
                        .where(sample_blocks.c.block_s <= cutoff_s - BLOCK_S)
                        .limit(limit)).scalars().all()
        if not ids:
            return 0
        return c.execute(delete(sample_blocks).where(sample_blocks.c.id.in_(ids))).rowcount
