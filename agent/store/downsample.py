"""Downsampling: N time buckets, min / max / last per bucket, so peaks survive.

A private part of the store's reader (:mod:`vramscope.agent.store.reader`). Three sources: raw
samples grouped in SQL; the per-second tier before the device's first raw sample, up to
``SECONDS_READ_MAX_S``; and the minute rollups once one point a minute gives at least half the
points asked for (the minutes not rolled up yet come from raw samples on the same grid). Which
answers when: docs/dashboard.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from itertools import chain, repeat
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Float,
    Integer,
    Select,
    Table,
    and_,
    any_,
    case,
    cast,
    func,
    literal,
    null,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import ARRAY
from vramscope.agent.durations import MINUTE_S, SECOND_S
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS
from vramscope.agent.store import block_grid
from vramscope.agent.store.read_once import once
from vramscope.agent.store.sample_blocks import window_slices
from vramscope.agent.store.schema import (
    ROLLUP_GROUPS_S,
    ROLLUP_TIER_S,
    event_counts,
    rollup_group,
    rollups,
    rollups_10m,
    samples,
    seconds,
)
from vramscope.agent.store.window import (
    count_at_most,
    first_of,
    first_sample_columns,
    first_sample_key,
    first_sample_ts,
)

if TYPE_CHECKING:
    from vramscope.agent.store.store import Store

# One bucket's values from one source of rows: (bucket, last_ts_s, flat), ``flat`` the grid's
# columns' minima and maxima interleaved, then their last values, (min_0, max_0, min_1, max_1,
# ..., last_0, last_1, ...): the order the grouped SQL hands back its aggregates in, so a part
# is a tuple slice, and a bucket's output row one ``dict(zip(...))`` (see ``_Grid.flat_keys``).
_Part = tuple[int, float, tuple[Any, ...]]


# Where a downsampled window's buckets came from (:func:`downsampled`'s tier), joined with
# ", then " in time order where several tiers answer parts of it
RAW_GROUPED = "raw samples grouped in SQL"
PER_SECOND = "per-second tier"
PER_MINUTE = "per-minute rollups"
TEN_MINUTE = "ten-minute rollups"


def _then(*tiers: str) -> str:
    return ", then ".join(t for t in tiers if t)


def downsample(store: Store, device: int, start_s: float, end_s: float, buckets: int,
               columns: Sequence[str], source: str | None, host: str | None,
               aligned: bool = False, lasts: bool = True,
               width_s: float | None = None) -> list[dict[str, Any]]:
    """The rows of :func:`downsampled`."""
    return downsampled(store, device, start_s, end_s, buckets, columns, source, host,
                       aligned, lasts, width_s)[0]


def downsampled(store: Store, device: int, start_s: float, end_s: float, buckets: int,
                columns: Sequence[str], source: str | None, host: str | None,
                aligned: bool = False, lasts: bool = True,
                width_s: float | None = None) -> tuple[list[dict[str, Any]], str]:
    """One row per non-empty bucket, and the tiers that answered, in time order (``RAW_GROUPED``,
    ``PER_SECOND``, ``PER_MINUTE``, ``TEN_MINUTE``, joined by ", then "): known from the path
    taken, no query of its own. A row: ``{"ts_s": <bucket start>, "last_ts_s", "<col>_min",
    "<col>_max", "<col>_last"}`` (peaks survive: the maximum is kept, not averaged away).

    ``aligned``: buckets of five minutes or more go on the ten-minute grid of
    :func:`tier_grid`, which the rollups are indexed by: a week's minutes are then grouped along
    the index rather than sorted (see ``_grouped``); buckets of a second to half a minute on
    whole seconds (:func:`second_grid`), where the per-second tier merges exactly.

    ``lasts=False``: every ``<col>_last`` is None, and the query of their own that raw rows
    and minute rollups take for them is not made (the analysis views read minima and maxima
    only, and PostgreSQL looks the last values up a minute at a time).

    ``width_s`` (``buckets`` is then ignored): buckets that wide, as the analysis views ask for
    them (:func:`width_grid`): from a multiple of ``width_s`` when it is a multiple of a kept
    rollup group, read on whole groups as an aligned window is; else
    ``ceil(span / width_s)`` buckets from ``start_s``."""
    if width_s is not None:
        if not width_s > 0:
            raise ValueError(f"width_s must be > 0, got {width_s}")
        buckets = max(1, math.ceil((end_s - start_s) / width_s))
    _validate(start_s, end_s, buckets, columns)
    did = device_row_id(store, device, host)
    if did is None:
        return [], RAW_GROUPED
    tier = (width_grid(start_s, end_s, width_s) if width_s is not None
            else tier_grid(start_s, end_s, buckets) if aligned else None)
    if tier is not None:
        buckets = tier[2]
    grid = (_Grid(*tier, tuple(columns), lasts) if tier else
            _Grid(start_s, (end_s - start_s) / buckets, buckets, tuple(columns), lasts))
    whole_seconds = second_grid(start_s, end_s, buckets) if aligned else None
    if whole_seconds is not None:
        grid = _Grid(*whole_seconds, tuple(columns), lasts)
    fine = not _rollups_worthwhile(start_s, end_s, buckets)
    heavy = fine and raw_rows_over(store, device, host, start_s, end_s)
    # a tier up where grouping the raw rows would cost more than the window is worth: the
    # per-second tier up to two hours, the minute rollups beyond (fewer points than asked,
    # each still the minimum and maximum of its minute)
    covered = (_rollup_span(store, did, start_s, end_s)
               if not fine or heavy and end_s - start_s > SECONDS_READ_MAX_S else None)
    if covered is None:
        if whole_seconds is not None or heavy:
            return _via_seconds(store, device, host, did, grid, start_s, end_s, source)
        parts, read = _unrolled(store, device, host, did, grid, start_s, end_s, source)
        return grid.rows(parts), read
    lo, hi = covered
    parts = _raw(store, did, grid, start_s, lo, source, False) if lo > start_s else []
    tiered = tier is not None
    parts += _from_rollups(store, did, grid, lo, hi, source, tiered=tiered)
    if hi <= end_s:
        parts += _raw(store, did, grid, hi, end_s, source, True)
    rolled = TEN_MINUTE if tiered and _index_group(grid) == ROLLUP_TIER_S else PER_MINUTE
    return grid.rows(parts), _then(RAW_GROUPED if lo > start_s else "", rolled,
                                   RAW_GROUPED if hi <= end_s else "")


# Two-minute groups one aligned window reads (per metric), at most: they are the minutes grouped
# along an index, and past this SQLite's grouping costs more than the window is worth (three
# days: 52k index entries, 26k groups back); ten-minute groups are
# read from their own table (rollups_10m: three days, 432 rows a metric).
MAX_GROUPS = 1_100
# The buckets asked for from which a group's grid is used: ten minutes from five (at worst half
# the buckets asked), two minutes from two (windows under 2.8 days in 2,000 keep their grid)
_GROUP_FROM_S = {120.0: 120.0, 600.0: 300.0}


def tier_grid(start_s: float, end_s: float, buckets: int) -> tuple[float, float, int] | None:
    """``(start, width, count)`` of the grid an aligned window is drawn on when the ``buckets``
    asked for are two minutes or wider: the width a multiple of the widest rollup group that
    fits (:data:`ROLLUP_GROUPS_S`: ten minutes from buckets of five, two minutes below), the
    start on a group boundary at or before ``start_s``, between half and all of the buckets
    asked for (a week in 2,000: 1,008 of ten minutes; a day in 500: 360 of four), or fewer
    where the two-minute groups would be more than ``MAX_GROUPS`` (from 36 hours: ten minutes;
    three days in 2,000: 433 of them). None for finer buckets."""
    asked = (end_s - start_s) / buckets
    fits = [g for g in ROLLUP_GROUPS_S if asked >= _GROUP_FROM_S[g]]
    if not fits:
        return None
    # the finest group whose count over the window stays bounded: the rows SQLite hands back
    # are groups x metrics, and Python's part of a timeline grows with them (five days of
    # two-minute groups are 43k rows; of ten-minute ones, 720 buckets)
    group = next(g for g in ROLLUP_GROUPS_S
                 if g >= fits[-1] and ((end_s - start_s) / g <= MAX_GROUPS
                                       or g == ROLLUP_GROUPS_S[-1]))
    start = math.floor(start_s / group) * group
    width = math.ceil(asked / group) * group
    while math.ceil((end_s - start) / width) > buckets:
        width += group
    return start, width, max(1, math.ceil((end_s - start) / width))


def width_grid(start_s: float, end_s: float, width_s: float) -> tuple[float, float, int] | None:
    """``(start, width, count)`` of buckets ``width_s`` wide from the multiple of ``width_s``
    at or before ``start_s``, where ``width_s`` is a multiple of a kept rollup group
    (:data:`ROLLUP_GROUPS_S`): each group then lies in one bucket, read from ``rollups_10m``
    (ten-minute multiples) or grouped along the two-minute index, never sorted (the risk
    page's week in 302 s buckets: a sort of 10,080 minutes of four metrics). None for other
    widths."""
    if not any(width_s % g == 0 for g in ROLLUP_GROUPS_S):
        return None
    start = math.floor(start_s / width_s) * width_s
    return start, width_s, max(1, math.ceil((end_s - start) / width_s))


def _index_group(grid: _Grid) -> float:
    """The widest indexed rollup group whose groups each lie in one bucket of ``grid`` (a
    :func:`tier_grid`)."""
    return max(g for g in ROLLUP_GROUPS_S
               if grid.width_s % g == 0 and grid.start_s % g == 0)


def aligned_grid(start_s: float, end_s: float, buckets: int
                 ) -> tuple[float, float, int] | None:
    """The grid ``downsample(..., aligned=True)`` draws on: :func:`tier_grid` or
    :func:`second_grid`, None where buckets are as asked (finer than a second, or between half
    a minute and five minutes)."""
    return tier_grid(start_s, end_s, buckets) or second_grid(start_s, end_s, buckets)


def timeline_grid(start_s: float, end_s: float, buckets: int) -> tuple[float, float, int]:
    """``(start, width, count)``: the timeline's grid (:func:`aligned_grid`, else as asked)."""
    return aligned_grid(start_s, end_s, buckets) or (start_s, (end_s - start_s) / buckets,
                                                      buckets)


def second_grid(start_s: float, end_s: float, buckets: int) -> tuple[float, float, int] | None:
    """``(start, width, count)`` of an aligned window whose buckets are half a second or wider
    but too fine for the minute rollups: a whole number of seconds wide, starting on a second,
    between half and all of the buckets asked for (an hour in 2,000: 1,800 of two seconds). On
    it the per-second tier's seconds merge exactly (a bucket's minimum is its seconds' least).
    None otherwise."""
    width = (end_s - start_s) / buckets
    if width < SECOND_S / 2 or _rollups_worthwhile(start_s, end_s, buckets):
        return None
    start = math.floor(start_s)
    width = float(math.ceil(width))
    while math.ceil((end_s - start) / width) > buckets:
        width += SECOND_S
    return float(start), width, max(1, math.ceil((end_s - start) / width))


def _via_seconds(store: Store, device: int, host: str | None, did: int, grid: _Grid,
                 start_s: float, end_s: float, source: str | None
                 ) -> tuple[list[dict[str, Any]], str]:
    """The per-second tier up to the end of its newest minute (the minutes retention has
    rolled up, raw samples or not), raw rows grouped in SQL after it. An hour at 10 Hz is 60
    packed rows instead of 36,000 raw ones for SQLite's sorter to group. On
    :func:`second_grid` the seconds merge exactly; on a finer or unaligned grid a second counts
    in the bucket of its start. A window longer than ``SECONDS_READ_MAX_S`` or without seconds
    reads as before."""
    rolled = seconds_end(store, did)
    if rolled is None or rolled <= start_s or end_s - start_s > SECONDS_READ_MAX_S:
        parts, read = _unrolled(store, device, host, did, grid, start_s, end_s, source)
        return grid.rows(parts), read
    upto = min(rolled, end_s)
    parts = _seconds_on_grid(grid, _read_seconds(store, device, host, grid, start_s, upto,
                                                 source))
    if upto < end_s:
        parts += _raw(store, did, grid, upto, end_s, source, True)
    return grid.rows(parts), _then(PER_SECOND, RAW_GROUPED if upto < end_s else "")


# Raw rows a fine grid groups in SQL before it reads a tier up instead (20,000: 33 minutes at
# 10 Hz, 5.6 hours at 1 Hz), so that grouping stays a small part of a page's budget whatever
# the rate. Counted on the index, up to the limit, before anything is grouped.
RAW_GROUP_LIMIT = 20_000


def raw_rows_over(store: Store, device: int, host: str | None, start_s: float,
                  end_s: float) -> bool:
    """More than ``RAW_GROUP_LIMIT`` raw rows of the device in [start_s, end_s]
    (:func:`~vramscope.agent.store.window.count_at_most`: an index range of at most the limit
    + 1 keys)."""
    return count_at_most(store, device, start_s, end_s, RAW_GROUP_LIMIT, host) > RAW_GROUP_LIMIT


def grid_index(store: Store, ts: Any, start_s: float, width_s: float) -> ColumnElement[Any]:
    """The bucket index of a time column on a grid from ``start_s`` of ``width_s`` buckets, for
    times at or after ``start_s``: CAST truncates toward zero in SQLite (so that is floor);
    PostgreSQL's CAST rounds, so floor() there."""
    ratio = (ts - start_s) / width_s
    return func.floor(ratio) if store.dialect == "postgresql" else cast(ratio, Integer)


def seconds_end(store: Store, did: int) -> float | None:
    """The end of the device's newest minute in the per-second tier (one seek), or None."""
    return minutes_end(store, seconds.c.minute_s, did)


def minutes_end(store: Store, minute: Column[Any], did: int) -> float | None:
    """The end of the device's newest minute in ``minute``'s table (a tier keyed by device
    and minute start; one seek), or None. Within ``read_once.reading``, read once."""
    return once(_minutes_end_key(store, minute, did), lambda: _minutes_end(store, minute, did))


def _minutes_end_key(store: Store, minute: Column[Any], did: int) -> tuple[Any, ...]:
    return ("minutes_end", store.engine, minute.table.name, did)


def read_edges(store: Store, device: int, host: str | None) -> None:
    """Within ``read_once.reading``: where the device's raw samples begin
    (``window.first_sample_ts``) and where its per-second tier and its event counts end
    (:func:`minutes_end`), asked in one statement, so that the reads after it that ask them
    (a timeline's series, phases, request rate and per-process reads) find the answers kept.
    Outside it, a statement for nothing."""
    did = device_row_id(store, device, host)
    if did is None:
        return
    newest_second = select(func.max(seconds.c.minute_s)).where(seconds.c.device_id == did)
    newest_count = (select(func.max(event_counts.c.minute_s))
                    .where(event_counts.c.device_id == did))
    with store.engine.connect() as c:
        first, block_first, second, counted = c.execute(select(
            *first_sample_columns(did), newest_second.scalar_subquery(),
            newest_count.scalar_subquery())).one()
    once(first_sample_key(store, device, host), lambda: first_of((first, block_first)))
    for minute, newest in ((seconds.c.minute_s, second), (event_counts.c.minute_s, counted)):
        end: float | None = None if newest is None else float(newest) + MINUTE_S
        once(_minutes_end_key(store, minute, did), partial(_given, end))


def _given(value: float | None) -> float | None:
    return value


def _minutes_end(store: Store, minute: Column[Any], did: int) -> float | None:
    q = select(func.max(minute)).where(minute.table.c.device_id == did)
    with store.engine.connect() as c:
        newest = c.execute(q).scalar()
    return None if newest is None else float(newest) + MINUTE_S


def any_minute(store: Store, minute: Column[Any], did: int, lo_s: float, hi_s: float) -> bool:
    """Whether a minute of the device in ``minute``'s table (a tier keyed by device and minute
    start) overlaps [lo_s, hi_s) (one seek). Within ``read_once.reading``, read once."""
    return once(("any_minute", store.engine, minute.table.name, did, lo_s, hi_s),
                lambda: _any_minute(store, minute, did, lo_s, hi_s))


def _any_minute(store: Store, minute: Column[Any], did: int, lo_s: float, hi_s: float) -> bool:
    q = (select(minute).where(minute.table.c.device_id == did, minute > lo_s - MINUTE_S,
                              minute < hi_s).limit(1))
    with store.engine.connect() as c:
        return c.execute(q).first() is not None


def _validate(start_s: float, end_s: float, buckets: int, columns: Sequence[str]) -> None:
    bad = [c for c in columns if c not in SAMPLE_COUNTER_FIELDS]
    if bad:
        known = ", ".join(SAMPLE_COUNTER_FIELDS)
        raise ValueError(f"unknown sample column(s) {bad}; known: {known}")
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    if not end_s > start_s:
        raise ValueError(f"end ({end_s}) must be after start ({start_s})")


def _rollups_worthwhile(start_s: float, end_s: float, buckets: int) -> bool:
    return (end_s - start_s) / MINUTE_S >= buckets / 2


class _Grid:
    """The output buckets, and the merge of partial results into them."""

    def __init__(self, start_s: float, width_s: float, buckets: int,
                 columns: tuple[str, ...], lasts: bool = True) -> None:
        self.start_s, self.width_s, self.buckets, self.columns = start_s, width_s, buckets, columns
        self.lasts = lasts  # False: no "last" is read, and every one is None
        # a row's keys in the order of a part's values (:data:`_Part`), made once
        self.flat_keys = ("ts_s", "last_ts_s",
                          *(f"{col}_{stat}" for col in columns for stat in ("min", "max")),
                          *(f"{col}_last" for col in columns))
        self.no_lasts: tuple[None, ...] = (None,) * len(columns)

    def index(self, ts_s: float) -> int:
        return min(int((ts_s - self.start_s) // self.width_s), self.buckets - 1)

    def rows(self, parts: list[_Part]) -> list[dict[str, Any]]:
        """``parts`` (:data:`_Part`) -> one dict per bucket, in time order.

        Only buckets with several parts are merged (a long window's first and last bucket,
        where raw samples meet the rollups), not all 2,000 of a week. A row is one
        ``dict(zip(...))`` of the part's flat values, not a key at a time: an hour's timeline is
        1,800 buckets of a dozen columns."""
        keys, start, width, n = self.flat_keys, self.start_s, self.width_s, 2 * len(self.columns)
        if all(a[0] < b[0] for a, b in zip(parts, parts[1:])):
            merged = parts  # a part a bucket, in order (one source of rows): nothing to merge
        else:
            by_bucket: dict[int, list[_Part]] = {}
            for part in parts:
                by_bucket.setdefault(part[0], []).append(part)
            merged = [mine[0] if len(mine) == 1 else _merge(mine, len(self.columns))
                      for _, mine in sorted(by_bucket.items())]
        if not self.lasts:
            merged = [(b, last_ts, flat[:n] + self.no_lasts) for b, last_ts, flat in merged]
        return [dict(zip(keys, (start + b * width, last_ts, *flat), strict=True))
                for b, last_ts, flat in merged]


def _merge(parts: list[_Part], n: int) -> _Part:
    """One bucket's parts (``n`` columns each) to one, in time order: the least minimum, the
    greatest maximum and the newest known last value of each column."""
    parts = sorted(parts, key=lambda p: p[1])
    acc: list[Any] = [None] * (3 * n)
    for _, _, flat in parts:
        for i in range(0, 2 * n, 2):
            lo, hi = flat[i], flat[i + 1]
            if lo is not None and (acc[i] is None or lo < acc[i]):
                acc[i] = lo
            if hi is not None and (acc[i + 1] is None or hi > acc[i + 1]):
                acc[i + 1] = hi
        for i in range(2 * n, 3 * n):
            if flat[i] is not None:  # parts in time order
                acc[i] = flat[i]
    return parts[-1][0], parts[-1][1], tuple(acc)


def _raw(store: Store, did: int, grid: _Grid, lo_s: float, hi_s: float, source: str | None,
         include_hi: bool) -> list[_Part]:
    """Raw samples in [lo_s, hi_s] (or [lo_s, hi_s)) grouped on the grid: rows of ``samples``
    in SQL, rows of the compact raw tier from their decoded blocks (:mod:`block_grid`), merged
    per bucket."""
    with store.engine.connect() as c:
        bucket = grid_index(store, samples.c.ts_s, grid.start_s, grid.width_s).label("bucket")
        upper = samples.c.ts_s <= hi_s if include_hi else samples.c.ts_s < hi_s
        where = [samples.c.device_id == did, samples.c.ts_s >= lo_s, upper]
        if source is not None:
            where.append(samples.c.source == source)
        agg = [bucket, func.max(samples.c.ts_s).label("last_ts_s")]
        for col in grid.columns:
            agg += [func.min(samples.c[col]).label(f"{col}_min"),
                    func.max(samples.c[col]).label(f"{col}_max")]
        grouped = c.execute(select(*agg).where(and_(*where)).group_by(bucket)).all()
        last = (_last_values(c, did, [r[1] for r in grouped], grid.columns, source)
                if grid.lasts else {})
        in_blocks = [s for s in window_slices(c, [did], lo_s, hi_s, include_hi)
                     if source is None or s.source == source]
    # A last row can be gone by the second query (PostgreSQL reads each statement afresh and
    # retention may have deleted it): that bucket then has no "last", not a failed request.
    # Rows by position (bucket, last_ts_s, then min, max per column): already a part's flat
    # layout (:data:`_Part`), each Row made a plain tuple once and sliced (by name, or indexed
    # 24 times a bucket, was a third of a 15-minute timeline).
    top = grid.buckets - 1
    if not in_blocks:
        out = []
        for r in grouped:
            t = tuple(r)
            out.append((min(int(t[0]), top), t[1], t[2:] + last.get(t[1], grid.no_lasts)))
        return out
    by_bucket: dict[Any, block_grid.Group] = {
        int(r[0]): [r[1], *r[2:], *last.get(r[1], grid.no_lasts)] for r in grouped}
    block_grid.min_max_last(in_blocks, grid.columns, grid.start_s, grid.width_s, grid.lasts,
                            by_bucket)
    n = 2 * len(grid.columns)
    return [(min(k, top), row[0],
             tuple(row[1:]) if grid.lasts else tuple(row[1:n + 1]) + grid.no_lasts)
            for k, row in sorted(by_bucket.items())]


def _unrolled(store: Store, device: int, host: str | None, did: int, grid: _Grid,
              start_s: float, end_s: float, source: str | None) -> tuple[list[_Part], str]:
    """[start_s, end_s] on a grid too fine for the minute rollups: raw rows grouped in SQL,
    and before the device's first raw row (retention deleted the older ones) the per-second
    tier (:func:`_before_raw`); and the tiers read."""
    horizon = first_sample_ts(store, device, host)
    old_end = end_s if horizon is None else min(horizon, end_s)
    parts = _before_raw(store, device, host, did, grid, start_s, old_end, source)
    old = "" if old_end <= start_s else (
        PER_MINUTE if old_end - start_s > SECONDS_READ_MAX_S else PER_SECOND)
    if horizon is not None and horizon <= end_s:
        parts += _raw(store, did, grid, max(start_s, horizon), end_s, source, True)
        return parts, _then(old, RAW_GROUPED)
    return parts, old or RAW_GROUPED


# The per-second tier is read a row per device, source and minute, each unpacked in Python:
# two hours is 120 rows a source, and the unpacking grows with the span. Where raw rows are
# gone over a longer range (a fine grid of up to 16 h: 2,000 buckets under 30 s), the minute
# rollups stand in.
SECONDS_READ_MAX_S = 2 * 3600.0


def _before_raw(store: Store, device: int, host: str | None, did: int, grid: _Grid,
                lo_s: float, hi_s: float, source: str | None) -> list[_Part]:
    """[lo_s, hi_s), where raw rows are gone: the per-second tier (each second's low, high and
    last), or the minute rollups over a range longer than ``SECONDS_READ_MAX_S``."""
    if hi_s <= lo_s:
        return []
    if hi_s - lo_s > SECONDS_READ_MAX_S:
        return _from_rollups(store, did, grid, lo_s, hi_s, source)
    return _seconds_on_grid(grid, _read_seconds(store, device, host, grid, lo_s, hi_s, source))


# The per-second tier's seconds of a window as columns: their starts, and per grid column its
# (lows, highs, lasts) series, in time order
_Columns = tuple[list[float], list[tuple[list[Any], list[Any], list[Any]]]]


def _read_seconds(store: Store, device: int, host: str | None, grid: _Grid, lo_s: float,
                  hi_s: float, source: str | None) -> _Columns:
    """The grid's columns of the per-second tier in [lo_s, hi_s), in time order: one
    source's minutes joined end to end; several sources' seconds merged by time, ties by
    source (the order is then the same on every backend)."""
    fields = [SAMPLE_COUNTER_FIELDS.index(col) for col in grid.columns]
    rows = store.seconds_columns(device, lo_s, hi_s, fields, host=host, source=source)
    ts: list[float] = []
    stats: list[tuple[list[Any], list[Any], list[Any]]] = [([], [], []) for _ in fields]
    for _, minute_ts, minute_stats in rows:
        ts += minute_ts
        for mine, theirs in zip(stats, minute_stats, strict=True):
            for into, part in zip(mine, theirs, strict=True):
                into += part
    if len({src for src, _, _ in rows}) > 1:
        sources = [src for src, minute_ts, _ in rows for _ in minute_ts]
        order = sorted(range(len(ts)), key=lambda j: (ts[j], sources[j]))
        ts = [ts[j] for j in order]
        stats = [([lo[j] for j in order], [hi[j] for j in order], [la[j] for j in order])
                 for lo, hi, la in stats]
    return ts, stats


def _seconds_on_grid(grid: _Grid, seconds_read: _Columns) -> list[_Part]:
    """Seconds (columns in time order, :func:`_read_seconds`) merged into one part per
    bucket: [min, max, last] per column. A second's last value stands at its end (its exact
    time is not kept), as a rolled-up minute's stands at the minute's end. A bucket's seconds
    are consecutive: a bucket is a slice of each series, reduced by C builtins; a counter
    measured in every second (the usual case) needs no filter of the unmeasured, and one
    measured in none (a source without it) none either: Python's work is per bucket, not per
    second and column. The tier is read as columns (``Store.seconds_columns``), not as a
    ``Second`` per second transposed back to series here."""
    ts, per_field = seconds_read
    if not ts:
        return []
    index = grid.index
    bounds = block_grid.runs([index(t) for t in ts])
    min_max: list[list[Any]] = []  # per column its minima, then its maxima, a value a bucket
    last_values: list[list[Any]] = []
    nothing = [None] * len(bounds)
    for lo, hi, la in per_field:
        if la.count(None) == len(la):  # a counter no second measured (none of its stats)
            min_max += [nothing, nothing]
            last_values.append(nothing)
        elif None in lo or None in hi or None in la:
            # a counter some seconds did not measure: its known values, the newest known last
            min_max += [[block_grid.least(lo[a:b]) for _, a, b in bounds],
                        [block_grid.greatest(hi[a:b]) for _, a, b in bounds]]
            last_values.append([next((v for v in reversed(la[a:b]) if v is not None), None)
                                for _, a, b in bounds])
        else:
            min_max += [[min(lo[a:b]) for _, a, b in bounds], [max(hi[a:b]) for _, a, b in bounds]]
            last_values.append([la[b - 1] for _, _, b in bounds])
    return [(k, ts[b - 1] + 1.0, flat)
            for (k, _, b), flat in zip(bounds, zip(*min_max, *last_values), strict=True)]


def read_from(store: Store, device: int, start_s: float, end_s: float, width_s: float,
              host: str | None = None) -> str:
    """Where :func:`downsample` reads buckets ``width_s`` wide over [start_s, end_s] from, for a
    view to say: "per-minute rollups", "raw samples grouped in SQL", "per-second tier", or the
    tier the deleted part came from followed by ", then raw samples grouped in SQL"."""
    did = device_row_id(store, device, host)
    if did is None:
        return RAW_GROUPED
    if width_s >= MINUTE_S / 2 and _rollup_span(store, did, start_s, end_s) is not None:
        return PER_MINUTE
    horizon = first_sample_ts(store, device, host)
    old_end = end_s if horizon is None else min(horizon, end_s)
    if old_end <= start_s or not any_minute(store, seconds.c.minute_s, did, start_s, old_end):
        return RAW_GROUPED
    old = PER_MINUTE if old_end - start_s > SECONDS_READ_MAX_S else PER_SECOND
    return _then(old, RAW_GROUPED if horizon is not None and horizon <= end_s else "")


LAST_ROWS_CHUNK = 500  # timestamps per IN (...) list; far under SQLite's and psycopg's limits


def _last_values(c: Connection, did: int, stamps: list[float], columns: Sequence[str],
                 source: str | None) -> dict[float, tuple[Any, ...]]:
    """Each bucket's "last": the row(s) at its latest timestamp, fetched by (device, ts_s) on
    the samples index. A separate query rather than a join back on the grouped subquery,
    because newer SQLite (the GPU machine's; reproduced with 3.51) plans that join as a scan of
    every row of the device around the subquery, a cost that grows with the device's history
    (tests/agent/test_store.py checks a window's cost on both SQLite versions)."""
    out: dict[float, tuple[Any, ...]] = {}
    postgres = c.dialect.name == "postgresql"
    # PostgreSQL: every stamp in one array parameter (``= ANY``), and its time span, so that
    # only the day partitions holding it are probed; 500 expanded IN parameters a statement
    # cost more to render and parse than the probes themselves (a 15-minute timeline has 2,000
    # stamps)
    step = len(stamps) if postgres else LAST_ROWS_CHUNK
    for i in range(0, len(stamps), max(step, 1)):
        chunk = stamps[i:i + step]
        where = [samples.c.device_id == did,
                 (samples.c.ts_s == any_(literal(chunk, ARRAY(Float)))) if postgres
                 else samples.c.ts_s.in_(chunk)]
        if postgres:
            where += [samples.c.ts_s >= min(chunk), samples.c.ts_s <= max(chunk)]
        if source is not None:
            where.append(samples.c.source == source)
        q = (select(samples.c.ts_s, *(func.max(samples.c[col]).label(col) for col in columns))
             .where(*where).group_by(samples.c.ts_s))
        # fetched at once (C), not a row at a time through the Result (a Python call per row)
        for r in c.execute(q).all():
            out[r[0]] = tuple(r[1:])  # the columns' values, in order
    return out


def _rollup_span(store: Store, did: int, start_s: float,
                 end_s: float) -> tuple[float, float] | None:
    """[first whole minute >= start, end of the last rolled-up minute <= end) or None."""
    lo = math.ceil(start_s / MINUTE_S) * MINUTE_S
    q = select(func.max(rollups.c.bucket_s)).where(
        rollups.c.device_id == did, rollups.c.bucket_s >= lo,
        rollups.c.bucket_s + MINUTE_S <= end_s)
    with store.engine.connect() as c:
        newest = c.execute(q).scalar()
    if newest is None:
        return None
    return lo, float(newest) + MINUTE_S


def _from_rollups(store: Store, did: int, grid: _Grid, lo_s: float, hi_s: float,
                  source: str | None, tiered: bool = False) -> list[_Part]:
    """Rollup minutes in [lo_s, hi_s) grouped on the grid in SQL, pivoted to one row per
    output bucket (a week is 10,080 minutes of a dozen metric rows each, too many to merge in
    Python). Each bucket's "last" is its newest minute's, fetched by primary
    key in a second pivoted query; a minute's last value stands at the minute's end (its
    exact time is not kept)."""
    if tiered and _index_group(grid) == ROLLUP_TIER_S:
        return _from_ten_minutes(store, did, grid, lo_s, hi_s, source)
    if not tiered and grid.width_s < MINUTES_IN_ORDER_BELOW_S:
        return _in_order(store, rollups, did, grid, lo_s, hi_s, source)
    where = _where(rollups, did, grid, source)
    newest: dict[int, float] = {}
    values: dict[int, dict[str, tuple[Any, Any]]] = {}
    index, top = grid.index, grid.buckets - 1
    with store.engine.connect() as c:
        # fetched at once (C), not row by row through the Result (a day is 17k rows)
        grouped = c.execute(_grouped(store, grid, where, lo_s, hi_s, tiered)).all()
        for b, metric, lo, hi, minute in grouped:
            k = index(float(minute)) if tiered else min(int(b), top)
            newest[k] = max(float(minute), newest.get(k, float(minute)))
            mine = values.setdefault(k, {})
            if metric in mine:  # several groups a bucket (tiers; the end's clamped bucket)
                lo, hi = min(lo, mine[metric][0]), max(hi, mine[metric][1])
            mine[metric] = (lo, hi)
        last = (_rollup_lasts(c, where, sorted(newest.values()), grid.columns)
                if grid.lasts else {})
    unread = (None, None)
    out = []
    for k in sorted(newest):
        mine = values[k]
        flat = tuple(chain.from_iterable(map(mine.get, grid.columns, repeat(unread))))
        out.append((k, newest[k] + MINUTE_S, flat + last.get(newest[k], grid.no_lasts)))
    return out


MINUTES_IN_ORDER_BELOW_S = 2 * MINUTE_S  # buckets narrower: minutes read in order (_in_order)


def _where(table: Table, did: int, grid: _Grid, source: str | None
           ) -> list[ColumnElement[bool]]:
    """The device's rows of the grid's metrics (of one source, if given) in ``table``."""
    where = [table.c.device_id == did, table.c.metric.in_(list(grid.columns))]
    if source is not None:
        where.append(table.c.source == source)
    return where


def _from_ten_minutes(store: Store, did: int, grid: _Grid, lo_s: float, hi_s: float,
                      source: str | None) -> list[_Part]:
    """:func:`_from_rollups` on a grid of whole ten-minute groups: the groups wholly in
    [lo_s, hi_s) from ``rollups_10m`` (a week: 1,008 rows a metric, where the minute rollups
    are 10,080 that SQLite would group along an index and PostgreSQL hash), the
    minutes at either end (a partial group) from the minute rollups."""
    first = math.ceil(lo_s / ROLLUP_TIER_S) * ROLLUP_TIER_S
    after = math.floor(hi_s / ROLLUP_TIER_S) * ROLLUP_TIER_S
    if first >= after:
        return _in_order(store, rollups, did, grid, lo_s, hi_s, source)
    parts = _in_order(store, rollups, did, grid, lo_s, first, source) if lo_s < first else []
    parts += _in_order(store, rollups_10m, did, grid, first, after, source)
    if after < hi_s:
        parts += _in_order(store, rollups, did, grid, after, hi_s, source)
    return parts


def _in_order(store: Store, table: Table, did: int, grid: _Grid, lo_s: float, hi_s: float,
              source: str | None) -> list[_Part]:
    """Rows of ``table`` (minute rollups, or ten-minute groups) in [lo_s, hi_s) read along the
    primary key in time order, last values with them, and folded here into the grid's buckets
    (each row in one bucket): where a bucket holds one or two minutes (under two minutes
    wide: a day in 2,000 buckets), and for the ten-minute groups. Nothing to group, and no
    query for the last values: grouped in SQL, SQLite sorted a day's 17k minute rows (a
    computed bucket) and handed back as many, then looked up 1,440 minutes' last values by
    key. A row is placed as the grouped SQL places a
    minute (``CAST`` truncates, ``floor`` on PostgreSQL: the same for times after the start);
    a bucket's last values are its newest minute's (a group's ``last_s``), the greatest over
    sources, as :func:`_rollup_lasts` pivots them."""
    newest_minute = table.c.last_s if table is rollups_10m else table.c.bucket_s
    q = (select(table.c.bucket_s, newest_minute, table.c.metric, table.c.min_value,
                table.c.max_value, table.c.last_value if grid.lasts else null())
         .where(*_where(table, did, grid, source), table.c.bucket_s >= lo_s,
                table.c.bucket_s < hi_s)
         .order_by(table.c.bucket_s))
    with store.engine.connect() as c:
        rows = c.execute(q).all()
    start, width, top = grid.start_s, grid.width_s, grid.buckets - 1
    out: list[_Part] = []
    k, row_s, minute = -1, -math.inf, -math.inf  # the bucket, row time and newest minute
    low: dict[str, Any] = {}
    high: dict[str, Any] = {}
    last: dict[str, Any] = {}

    def flush() -> None:
        flat = tuple(chain.from_iterable(zip(map(low.get, grid.columns),
                                             map(high.get, grid.columns))))
        out.append((k, float(minute) + MINUTE_S, flat + tuple(map(last.get, grid.columns))))

    for bucket_s, newest, metric, lo, hi, la in rows:
        if bucket_s != row_s:
            row_s, b = bucket_s, min(int((bucket_s - start) / width), top)
            if b != k:
                if k >= 0:
                    flush()
                k, minute, low, high, last = b, -math.inf, {}, {}, {}
        if newest > minute:  # a newer minute's last values replace the older's
            minute, last = newest, {}
        if newest == minute and (la is None or metric not in last or la > last[metric]):
            last[metric] = la  # the greatest over the minute's sources (None: not read)
        if metric in low:  # another source, or another minute of the bucket
            lo, hi = min(lo, low[metric]), max(hi, high[metric])
        low[metric], high[metric] = lo, hi
    if k >= 0:
        flush()
    return out


def _grouped(store: Store, grid: _Grid, where: list[ColumnElement[bool]], lo_s: float,
             hi_s: float, tiered: bool) -> Select[Any]:
    """Per group and metric: min, max and the newest minute.

    Grouped by (bucket, metric), not pivoted with a CASE per column: two aggregates a row
    instead of two per column (a week's 141k rows), 22k rows back.
    ``tiered`` (a grid of whole two-minute groups, on SQLite; ten-minute ones read
    ``rollups_10m``): grouped by two-minute group, in the order of the
    ``ix_rollups_device_tier2m`` index, which SQLite then reads without the sort a computed
    bucket needs (three days: 47k rollup rows to sort); each
    group lies in one bucket. PostgreSQL hashes its groups: no sort to save."""
    if tiered and store.dialect == "sqlite":
        width = _index_group(grid)
        group: ColumnElement[Any] = rollup_group(width)
        where = [*where, group >= math.floor(lo_s / width), group <= math.floor(hi_s / width)]
    else:
        group = grid_index(store, rollups.c.bucket_s, grid.start_s, grid.width_s)
    return (select(group.label("b"), rollups.c.metric, func.min(rollups.c.min_value),
                   func.max(rollups.c.max_value), func.max(rollups.c.bucket_s))
            .where(*where, rollups.c.bucket_s >= lo_s, rollups.c.bucket_s < hi_s)
            .group_by(group, rollups.c.metric))


def _rollup_lasts(c: Connection, where: list[ColumnElement[bool]], minutes: list[float],
                  columns: Sequence[str]) -> dict[float, tuple[Any, ...]]:
    """Each minute's last value per column (the max over sources), by primary key.

    On PostgreSQL the minutes are one array, unnested, each the key of a LATERAL subquery: a
    probe of the primary key per minute, whatever the planner estimates. Given as ``bucket_s IN
    (...)`` (or ``= ANY``) PostgreSQL bitmap-scanned every rollup row of the device and
    filtered (a week: 131k rows for 500 minutes); as a plain join it hashed the device's rows
    where the table was small: both grow with the device's history, the probes do not."""
    out: dict[float, tuple[Any, ...]] = {}
    pivot = [func.max(case((rollups.c.metric == col, rollups.c.last_value))) for col in columns]
    if c.dialect.name == "postgresql":
        wanted = (func.unnest(literal(minutes, ARRAY(Float))).table_valued("minute_s")
                  .render_derived(name="wanted"))
        per_minute = (select(*pivot).where(*where, rollups.c.bucket_s == wanted.c.minute_s)
                      .lateral("last_values"))
        q = select(wanted.c.minute_s, *per_minute.c).select_from(wanted.join(per_minute, true()))
        return {float(r[0]): tuple(r[1:]) for r in c.execute(q)}
    for i in range(0, len(minutes), LAST_ROWS_CHUNK):
        q = (select(rollups.c.bucket_s, *pivot)
             .where(*where, rollups.c.bucket_s.in_(minutes[i:i + LAST_ROWS_CHUNK]))
             .group_by(rollups.c.bucket_s))
        for r in c.execute(q):
            out[float(r[0])] = tuple(r[1:])
    return out


def device_row_id(store: Store, device: int, host: str | None) -> int | None:
    """The device's row id, None when it is not stored (``Store.known_device_id``)."""
    return store.known_device_id(device, host)
