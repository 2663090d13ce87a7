"""Downsampling: N time buckets, min / max / last per bucket, so peaks survive.

24 hours at 10 Hz is 864k rows per series; the dashboard asks for ~2,000 points. Three sources:

- **raw samples**, grouped in SQL (one row per bucket leaves the database);
- **the per-second tier** (``agent/store/seconds.py``), for buckets too fine for the rollups
  over the part of the range before the device's first raw sample (retention deleted the
  older ones after ``retention.raw_s``): each second's low, high and last merged into the
  buckets, one row read per minute and source, up to ``SECONDS_READ_MAX_S`` (the rollups
  beyond);
- **per-minute rollups** (min, max, last per device, source and metric, kept by the agent's
  retention), used when the range is long enough that one point per minute still gives at
  least half the points asked for. Reading 1,440 rollup minutes instead of scanning 100k+ raw
  rows is what keeps a 24-hour view cheap, and rollups outlive the raw retention, so long ranges
  still show data after raw samples were deleted. The minutes not rolled up yet (the newest
  few, or a partial minute at the range's start) come from raw samples, on the same grid.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import partial
from operator import is_not
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Float,
    Integer,
    Select,
    and_,
    case,
    cast,
    func,
    literal,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import ARRAY
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS
from vramscope.agent.store.schema import (
    ROLLUP_GROUPS_S,
    devices,
    hosts,
    rollup_group,
    rollups,
    samples,
    seconds,
)
from vramscope.agent.store.window import count_at_most, first_sample_ts

if TYPE_CHECKING:
    from vramscope.agent.store.seconds import Second
    from vramscope.agent.store.store import Store

_MinMaxLast = tuple[Any, Any, Any]  # a column's (min, max, last) in one bucket

ROLLUP_S = 60.0  # the rollups table's bucket (agent.retention)
SECOND_S = 1.0  # the per-second tier's


def downsample(store: Store, device: int, start_s: float, end_s: float, buckets: int,
               columns: Sequence[str], source: str | None, host: str | None,
               aligned: bool = False, lasts: bool = True) -> list[dict[str, Any]]:
    """``aligned``: buckets of five minutes or more go on the ten-minute grid of
    :func:`tier_grid`, which the rollups are indexed by: a week's minutes are then grouped along
    the index rather than sorted (see ``_grouped``); buckets of a second to half a minute on
    whole seconds (:func:`second_grid`), where the per-second tier merges exactly.

    ``lasts=False``: every ``<col>_last`` is None, and the query of their own that raw rows
    and minute rollups take for them is not made (the analysis views read minima and maxima
    only: on PostgreSQL the 2,000 newest minutes of a risk page's week cost 50-90 ms)."""
    _validate(start_s, end_s, buckets, columns)
    did = device_row_id(store, device, host)
    if did is None:
        return []
    tier = tier_grid(start_s, end_s, buckets) if aligned else None
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
        return grid.rows(_unrolled(store, device, host, did, grid, start_s, end_s, source))
    lo, hi = covered
    parts = _raw(store, did, grid, start_s, lo, source, False) if lo > start_s else []
    parts += _from_rollups(store, did, grid, lo, hi, source, tiered=tier is not None)
    if hi <= end_s:
        parts += _raw(store, did, grid, hi, end_s, source, True)
    return grid.rows(parts)


MAX_GROUPS = 2_200  # rollup groups one aligned window reads (per metric)
# The buckets asked for from which a group's grid is used: ten minutes from five (at worst half
# the buckets asked), two minutes from two (windows under 2.8 days in 2,000 keep their grid)
_GROUP_FROM_S = {120.0: 120.0, 600.0: 300.0}


def tier_grid(start_s: float, end_s: float, buckets: int) -> tuple[float, float, int] | None:
    """``(start, width, count)`` of the grid an aligned window is drawn on when the ``buckets``
    asked for are two minutes or wider: the width a multiple of the widest rollup group that
    fits (:data:`ROLLUP_GROUPS_S`: ten minutes from buckets of five, two minutes below), the
    start on a group boundary at or before ``start_s``, between half and all of the buckets
    asked for (a week in 2,000: 1,008 of ten minutes; three days: 1,080 of four), or fewer
    where the two-minute groups would be more than ``MAX_GROUPS`` (four to seven days: ten
    minutes). None for finer buckets."""
    asked = (end_s - start_s) / buckets
    fits = [g for g in ROLLUP_GROUPS_S if asked >= _GROUP_FROM_S[g]]
    if not fits:
        return None
    # the finest group whose count over the window stays bounded: the rows SQLite hands back
    # are groups x metrics, and Python's part of a timeline grows with them (five days of
    # two-minute groups, 43k rows: 380 ms; of ten-minute ones, 720 buckets, under 200)
    group = next(g for g in ROLLUP_GROUPS_S
                 if g >= fits[-1] and ((end_s - start_s) / g <= MAX_GROUPS
                                       or g == ROLLUP_GROUPS_S[-1]))
    start = math.floor(start_s / group) * group
    width = math.ceil(asked / group) * group
    while math.ceil((end_s - start) / width) > buckets:
        width += group
    return start, width, max(1, math.ceil((end_s - start) / width))


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
                 start_s: float, end_s: float, source: str | None) -> list[dict[str, Any]]:
    """The per-second tier up to the end of its newest minute (the minutes retention has
    rolled up, raw samples or not), raw rows grouped in SQL after it. An hour at 10 Hz is 60
    packed rows instead of grouping 36,000 raw ones (95 ms of SQLite's sorter on the generated
    week). On :func:`second_grid` the seconds merge exactly; on a finer or unaligned grid a
    second counts in the bucket of its start. A window longer than ``SECONDS_READ_MAX_S`` or
    without seconds reads as before."""
    rolled = seconds_end(store, did)
    if rolled is None or rolled <= start_s or end_s - start_s > SECONDS_READ_MAX_S:
        return grid.rows(_unrolled(store, device, host, did, grid, start_s, end_s, source))
    upto = min(rolled, end_s)
    parts = _seconds_on_grid(grid, [s for src, s in store.seconds(device, start_s, upto,
                                                                  host=host)
                                    if source is None or src == source])
    if upto < end_s:
        parts += _raw(store, did, grid, upto, end_s, source, True)
    return grid.rows(parts)


# Raw rows a fine grid groups in SQL before it reads a tier up instead: SQLite groups about
# 400k rows a second here (20,000: 33 minutes at 10 Hz, 5.6 hours at 1 Hz, ~50 ms). Counted
# on the index, up to the limit, before anything is grouped.
RAW_GROUP_LIMIT = 20_000


def raw_rows_over(store: Store, device: int, host: str | None, start_s: float,
                  end_s: float) -> bool:
    """More than ``RAW_GROUP_LIMIT`` raw rows of the device in [start_s, end_s]
    (:func:`~vramscope.agent.store.window.count_at_most`: an index range of at most the limit
    + 1 keys)."""
    return count_at_most(store, device, start_s, end_s, RAW_GROUP_LIMIT, host) > RAW_GROUP_LIMIT


def seconds_end(store: Store, did: int) -> float | None:
    """The end of the device's newest minute in the per-second tier (one seek), or None."""
    q = select(func.max(seconds.c.minute_s)).where(seconds.c.device_id == did)
    with store.engine.connect() as c:
        newest = c.execute(q).scalar()
    return None if newest is None else float(newest) + ROLLUP_S


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
    return (end_s - start_s) / ROLLUP_S >= buckets / 2


class _Grid:
    """The output buckets, and the merge of partial results into them."""

    def __init__(self, start_s: float, width_s: float, buckets: int,
                 columns: tuple[str, ...], lasts: bool = True) -> None:
        self.start_s, self.width_s, self.buckets, self.columns = start_s, width_s, buckets, columns
        self.lasts = lasts  # False: no "last" is read, and every one is None
        # each column's output keys, formatted once rather than three times a bucket
        self._keys = [(col, f"{col}_min", f"{col}_max", f"{col}_last") for col in columns]

    def index(self, ts_s: float) -> int:
        return min(int((ts_s - self.start_s) // self.width_s), self.buckets - 1)

    def rows(self, parts: list[tuple[int, float, dict[str, _MinMaxLast]]]
             ) -> list[dict[str, Any]]:
        """``parts``: (bucket, last_ts_s, {col: (min, max, last)}) -> one dict per bucket.

        Only buckets with several parts are merged (a long window's first and last bucket,
        where raw samples meet the rollups): merging all 2,000 of a week was 70 ms."""
        by_bucket: dict[int, list[tuple[int, float, dict[str, _MinMaxLast]]]] = {}
        for part in parts:
            by_bucket.setdefault(part[0], []).append(part)
        out = []
        for b in sorted(by_bucket):
            mine = by_bucket[b]
            out.append(self._row(b, mine[0][1], mine[0][2]) if len(mine) == 1
                       else self._row(b, *_merge(mine)))
        return out

    def _row(self, b: int, last_ts: float, values: Mapping[str, Sequence[Any]]
             ) -> dict[str, Any]:
        row: dict[str, Any] = {"ts_s": self.start_s + b * self.width_s, "last_ts_s": last_ts}
        none = (None, None, None)
        for col, lo_key, hi_key, last_key in self._keys:
            row[lo_key], row[hi_key], row[last_key] = values.get(col, none)
            if not self.lasts:
                row[last_key] = None
        return row


def _merge(parts: list[tuple[int, float, dict[str, _MinMaxLast]]]
           ) -> tuple[float, dict[str, list[Any]]]:
    """One bucket's parts, in time order, to its (last_ts_s, {col: [min, max, last]})."""
    last_ts = 0.0
    acc: dict[str, list[Any]] = {}
    for _, part_last_ts, values in sorted(parts, key=lambda p: p[1]):
        last_ts = part_last_ts
        for col, (lo, hi, last) in values.items():
            cur = acc.setdefault(col, [None, None, None])
            cur[0] = lo if cur[0] is None or (lo is not None and lo < cur[0]) else cur[0]
            cur[1] = hi if cur[1] is None or (hi is not None and hi > cur[1]) else cur[1]
            cur[2] = last if last is not None else cur[2]  # parts arrive in time order
    return last_ts, acc


def _raw(store: Store, did: int, grid: _Grid, lo_s: float, hi_s: float, source: str | None,
         include_hi: bool) -> list[tuple[int, float, dict[str, _MinMaxLast]]]:
    """Raw samples in [lo_s, hi_s] (or [lo_s, hi_s)) grouped in SQL on the grid."""
    ratio = (samples.c.ts_s - grid.start_s) / grid.width_s
    # CAST truncates toward zero in SQLite (ts >= start, so that is floor); PostgreSQL rounds.
    bucket: ColumnElement[Any] = (func.floor(ratio) if store.dialect == "postgresql"
                                  else cast(ratio, Integer))
    bucket = bucket.label("bucket")
    upper = samples.c.ts_s <= hi_s if include_hi else samples.c.ts_s < hi_s
    where = [samples.c.device_id == did, samples.c.ts_s >= lo_s, upper]
    if source is not None:
        where.append(samples.c.source == source)
    agg = [bucket, func.max(samples.c.ts_s).label("last_ts_s")]
    for col in grid.columns:
        agg += [func.min(samples.c[col]).label(f"{col}_min"),
                func.max(samples.c[col]).label(f"{col}_max")]
    with store.engine.connect() as c:
        grouped = c.execute(select(*agg).where(and_(*where)).group_by(bucket)).all()
        last = (_last_values(c, did, [r[1] for r in grouped], grid.columns, source)
                if grid.lasts else {})
    # A last row can be gone by the second query (PostgreSQL reads each statement afresh and
    # retention may have deleted it): that bucket then has no "last", not a failed request.
    # Rows by position (bucket, last_ts_s, then min, max per column): 2,000 buckets of a dozen
    # columns by name was a third of a 15-minute timeline.
    # Each Row made a plain tuple once and sliced: indexing a Row 24 times a bucket was 50 ms
    # of a 1-hour timeline.
    missing = (None,) * len(grid.columns)
    out = []
    for r in grouped:
        t = tuple(r)
        lasts = last.get(t[1], missing)
        out.append((min(int(t[0]), grid.buckets - 1), t[1],
                    dict(zip(grid.columns, zip(t[2::2], t[3::2], lasts)))))
    return out


def _unrolled(store: Store, device: int, host: str | None, did: int, grid: _Grid,
              start_s: float, end_s: float, source: str | None
              ) -> list[tuple[int, float, dict[str, _MinMaxLast]]]:
    """[start_s, end_s] on a grid too fine for the minute rollups: raw rows grouped in SQL,
    and before the device's first raw row (retention deleted the older ones) the per-second
    tier (:func:`_before_raw`)."""
    horizon = first_sample_ts(store, device, host)
    old_end = end_s if horizon is None else min(horizon, end_s)
    parts = _before_raw(store, device, host, did, grid, start_s, old_end, source)
    if horizon is not None and horizon <= end_s:
        parts += _raw(store, did, grid, max(start_s, horizon), end_s, source, True)
    return parts


# The per-second tier is read a row per device, source and minute, each unpacked in Python
# (about 0.6 ms): two hours is 120 rows a source. Where raw rows are gone over a longer range
# (a fine grid of up to 16 h: 2,000 buckets under 30 s), the minute rollups stand in.
SECONDS_READ_MAX_S = 2 * 3600.0


def _before_raw(store: Store, device: int, host: str | None, did: int, grid: _Grid,
                lo_s: float, hi_s: float, source: str | None
                ) -> list[tuple[int, float, dict[str, _MinMaxLast]]]:
    """[lo_s, hi_s), where raw rows are gone: the per-second tier (each second's low, high and
    last), or the minute rollups over a range longer than ``SECONDS_READ_MAX_S``."""
    if hi_s <= lo_s:
        return []
    if hi_s - lo_s > SECONDS_READ_MAX_S:
        return _from_rollups(store, did, grid, lo_s, hi_s, source)
    seconds_read = store.seconds(device, lo_s, hi_s, host=host)
    return _seconds_on_grid(grid, [s for src, s in seconds_read
                                   if source is None or src == source])


def _seconds_on_grid(grid: _Grid, seconds_read: list[Second]
                     ) -> list[tuple[int, float, dict[str, _MinMaxLast]]]:
    """Seconds (time order) merged into one part per bucket: [min, max, last] per column. A
    second's last value stands at its end (its exact time is not kept), as a rolled-up
    minute's stands at the minute's end. Merged here, not by ``_Grid.rows``: a part per second
    through its generic merge was a third of an hour's timeline. A bucket's seconds are
    consecutive: each statistic is transposed to one series per counter once (C's ``zip``),
    and a bucket is a slice of it, reduced by C builtins; a counter measured in every second
    (the usual case) needs no filter of the unmeasured (an hour of 12 counters on 2 s buckets:
    28 ms, 57 ms with a transpose per bucket; a fold per second and column before that was
    120 ms of a 2-hour timeline)."""
    if not seconds_read:
        return []
    fields = [SAMPLE_COUNTER_FIELDS.index(col) for col in grid.columns]
    keys = [grid.index(s.ts_s) for s in seconds_read]
    bounds = _runs(keys)
    lows, highs, lasts = (list(zip(*stat, strict=True)) for stat in
                          zip(*((s.low, s.high, s.last) for s in seconds_read), strict=True))
    per_column = []
    for i in fields:
        lo, hi, la = lows[i], highs[i], lasts[i]
        if None in lo or None in hi or None in la:
            per_column.append([_min_max_last(lo[a:b], hi[a:b], la[a:b]) for _, a, b in bounds])
        else:
            per_column.append([(min(lo[a:b]), max(hi[a:b]), la[b - 1]) for _, a, b in bounds])
    return [(k, seconds_read[b - 1].ts_s + 1.0, dict(zip(grid.columns, values, strict=True)))
            for (k, _, b), values in zip(bounds, zip(*per_column, strict=True), strict=True)]


def _runs(keys: list[int]) -> list[tuple[int, int, int]]:
    """``(key, start, stop)`` of each run of equal consecutive ``keys``."""
    out, a = [], 0
    for j in range(1, len(keys) + 1):
        if j == len(keys) or keys[j] != keys[a]:
            out.append((keys[a], a, j))
            a = j
    return out


def _min_max_last(lows: Sequence[Any], highs: Sequence[Any], lasts: Sequence[Any]
                  ) -> _MinMaxLast:
    """A bucket's (min, max, last) of a counter some of its seconds did not measure."""
    known = [v for v in lasts if v is not None]
    return (min(filter(_KNOWN, lows), default=None), max(filter(_KNOWN, highs), default=None),
            known[-1] if known else None)


_KNOWN = partial(is_not, None)  # a measured value: filter(_KNOWN, ...) in C


def read_from(store: Store, device: int, start_s: float, end_s: float, width_s: float,
              host: str | None = None) -> str:
    """Where :func:`downsample` reads buckets ``width_s`` wide over [start_s, end_s] from, for a
    view to say: "per-minute rollups", "raw samples grouped in SQL", "per-second tier", or the
    tier the deleted part came from followed by ", then raw samples grouped in SQL"."""
    raw = "raw samples grouped in SQL"
    did = device_row_id(store, device, host)
    if did is None:
        return raw
    if width_s >= ROLLUP_S / 2 and _rollup_span(store, did, start_s, end_s) is not None:
        return "per-minute rollups"
    horizon = first_sample_ts(store, device, host)
    old_end = end_s if horizon is None else min(horizon, end_s)
    if old_end <= start_s or not _any_seconds(store, did, start_s, old_end):
        return raw
    old = ("per-minute rollups" if old_end - start_s > SECONDS_READ_MAX_S
           else "per-second tier")
    return old if horizon is None or horizon > end_s else f"{old}, then {raw}"


def _any_seconds(store: Store, did: int, lo_s: float, hi_s: float) -> bool:
    q = select(seconds.c.minute_s).where(seconds.c.device_id == did,
                                         seconds.c.minute_s > lo_s - ROLLUP_S,
                                         seconds.c.minute_s < hi_s).limit(1)
    with store.engine.connect() as c:
        return c.execute(q).first() is not None


LAST_ROWS_CHUNK = 500  # timestamps per IN (...) list; far under SQLite's and psycopg's limits


def _last_values(c: Connection, did: int, stamps: list[float], columns: Sequence[str],
                 source: str | None) -> dict[float, tuple[Any, ...]]:
    """Each bucket's "last": the row(s) at its latest timestamp, fetched by (device, ts_s) on
    the samples index. A separate query rather than a join back on the grouped subquery,
    because newer SQLite (the GPU machine's; reproduced with 3.51) plans that join as a scan of
    every row of the device around the subquery: 17 s instead of 70 ms for a 24-hour view."""
    out: dict[float, tuple[Any, ...]] = {}
    for i in range(0, len(stamps), LAST_ROWS_CHUNK):
        where = [samples.c.device_id == did,
                 samples.c.ts_s.in_(stamps[i:i + LAST_ROWS_CHUNK])]
        if source is not None:
            where.append(samples.c.source == source)
        q = (select(samples.c.ts_s, *(func.max(samples.c[col]).label(col) for col in columns))
             .where(*where).group_by(samples.c.ts_s))
        for r in c.execute(q):
            out[r[0]] = tuple(r[1:])  # the columns' values, in order
    return out


def rollup_span(store: Store, device: int, start_s: float, end_s: float,
                host: str | None = None) -> tuple[float, float] | None:
    """The part of [start_s, end_s] that per-minute rollups cover for device index ``device``
    (see ``_rollup_span``), or None: which tier a downsampled window was read from."""
    did = device_row_id(store, device, host)
    return None if did is None else _rollup_span(store, did, start_s, end_s)


def _rollup_span(store: Store, did: int, start_s: float,
                 end_s: float) -> tuple[float, float] | None:
    """[first whole minute >= start, end of the last rolled-up minute <= end) or None."""
    lo = math.ceil(start_s / ROLLUP_S) * ROLLUP_S
    q = select(func.max(rollups.c.bucket_s)).where(
        rollups.c.device_id == did, rollups.c.bucket_s >= lo,
        rollups.c.bucket_s + ROLLUP_S <= end_s)
    with store.engine.connect() as c:
        newest = c.execute(q).scalar()
    if newest is None:
        return None
    return lo, float(newest) + ROLLUP_S


def _from_rollups(store: Store, did: int, grid: _Grid, lo_s: float, hi_s: float,
                  source: str | None, tiered: bool = False
                  ) -> list[tuple[int, float, dict[str, _MinMaxLast]]]:
    """Rollup minutes in [lo_s, hi_s) grouped on the grid in SQL, pivoted to one row per
    output bucket (a week is 10,080 minutes of a dozen metric rows each; merging them in
    Python was 2 s a device). Each bucket's "last" is its newest minute's, fetched by primary
    key in a second pivoted query; a minute's last value stands at the minute's end (its
    exact time is not kept)."""
    where = [rollups.c.device_id == did, rollups.c.metric.in_(list(grid.columns))]
    if source is not None:
        where.append(rollups.c.source == source)
    newest: dict[int, float] = {}
    values: dict[int, dict[str, tuple[Any, Any]]] = {}
    with store.engine.connect() as c:
        for b, metric, lo, hi, minute in c.execute(_grouped(store, grid, where, lo_s, hi_s,
                                                            tiered)):
            k = grid.index(float(minute)) if tiered else min(int(b), grid.buckets - 1)
            newest[k] = max(float(minute), newest.get(k, float(minute)))
            mine = values.setdefault(k, {})
            if metric in mine:  # several groups a bucket (tiers; the end's clamped bucket)
                lo, hi = min(lo, mine[metric][0]), max(hi, mine[metric][1])
            mine[metric] = (lo, hi)
        last = (_rollup_lasts(c, where, sorted(newest.values()), grid.columns)
                if grid.lasts else {})
    none = (None,) * len(grid.columns)
    out = []
    for k in sorted(newest):
        lasts, mine = last.get(newest[k], none), values[k]
        out.append((k, newest[k] + ROLLUP_S,
                    {col: (*mine.get(col, (None, None)), lasts[i])
                     for i, col in enumerate(grid.columns)}))
    return out


def _grouped(store: Store, grid: _Grid, where: list[ColumnElement[bool]], lo_s: float,
             hi_s: float, tiered: bool) -> Select[Any]:
    """Per group and metric: min, max and the newest minute.

    Grouped by (bucket, metric), not pivoted with a CASE per column: two aggregates a row
    instead of two per column (a week's 141k rows: 110 ms against 190 ms), 22k rows back.
    ``tiered`` (a :func:`tier_grid`, on SQLite): grouped by ten- or two-minute group, in the
    order of the ``ix_rollups_device_tier`` / ``ix_rollups_device_tier2m`` index, which SQLite
    then reads without the sort a computed bucket needs (a week: 54 ms and 11k rows instead of
    154 ms and 22k); each group lies in one bucket. PostgreSQL hashes its groups: no sort to
    save."""
    if tiered and store.dialect == "sqlite":
        width = _index_group(grid)
        group: ColumnElement[Any] = rollup_group(width)
        where = [*where, group >= math.floor(lo_s / width), group <= math.floor(hi_s / width)]
    else:
        ratio = (rollups.c.bucket_s - grid.start_s) / grid.width_s
        group = func.floor(ratio) if store.dialect == "postgresql" else cast(ratio, Integer)
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
    filtered (a week: 131k rows, 32 ms for 500 minutes, against 5 ms); as a plain join it
    hashed the device's rows where the table was small (2 devices: 75 ms for 1,008 minutes,
    against 17)."""
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
    q = (select(devices.c.id).join(hosts, hosts.c.id == devices.c.host_id)
         .where(hosts.c.name == (host or store.host_name), devices.c.device_index == device))
    with store.engine.connect() as c:
        return c.execute(q).scalar()
