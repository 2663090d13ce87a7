"""The compact raw tier's rows grouped on a window's grid in Python, as the tier modules group
rows of ``samples`` in SQL (a private part of :mod:`vramscope.agent.store.reader`).

A block's rows are in time order, so a bucket is a slice of each column, reduced by C builtins
(``min``, ``max``, ``Counter``): Python's work is per bucket and column, not per row. (Decoding
into a temporary table and grouping ``samples UNION ALL`` it in SQL cost 1.5-1.7x a raw read.)
A row's bucket is computed in float64 as the SQL computes it
(:func:`~vramscope.agent.store.downsample.grid_index`), so a row lands in the same bucket
whichever table holds it.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterator, Sequence
from itertools import compress
from typing import Any

from vramscope.agent.store.sample_blocks import Slice

# A bucket's values, the layout downsample's parts use: [last_ts, min_0, max_0, min_1, max_1,
# ..., last_0, last_1, ...] (no lasts where they were not asked for)
Group = list[Any]


def runs(keys: Sequence[Any], offset: int = 0) -> list[tuple[Any, int, int]]:
    """``(key, offset + i, offset + j)`` for each run ``keys[i:j]`` of one key (``keys`` in
    order: a row's bucket, of rows in time order)."""
    out = []
    i, n = 0, len(keys)
    while i < n:
        j = bisect_right(keys, keys[i], i)
        out.append((keys[i], offset + i, offset + j))
        i = j
    return out


def _bucket_runs(times: Sequence[float], a: int, b: int, start_s: float,
                 width_s: float) -> list[tuple[int, int, int]]:
    """``(bucket, i, j)`` for each run of rows ``times[i:j]`` (within ``[a, b)``, in time
    order) that share a bucket."""
    return runs([math.floor((t - start_s) / width_s) for t in times[a:b]], a)


def _groups(times: Sequence[float], cols: Sequence[Sequence[Any]], a: int, b: int,
           start_s: float, width_s: float, lasts: bool) -> Iterator[tuple[int, Group]]:
    """Rows ``[a, b)`` of time-ordered columns grouped on the grid: per bucket its newest
    time, each column's least and greatest value (NULLs ignored, as SQL's min and max do;
    None where the bucket has none) and, with ``lasts``, each column's greatest value among
    the rows at the bucket's newest time (the "last" the SQL reads back by time)."""
    gaps = [None in col[a:b] for col in cols]
    for k, i, j in _bucket_runs(times, a, b, start_s, width_s):
        row: Group = [times[j - 1]]
        for col, gap in zip(cols, gaps, strict=True):
            part = col[i:j]
            if gap:
                part = [v for v in part if v is not None]
                row += (min(part, default=None), max(part, default=None))
            else:
                row += (min(part), max(part))
        if lasts:
            tie = bisect_left(times, times[j - 1], i, j)  # rows at the newest time
            row += ([col[j - 1] for col in cols] if tie == j - 1 else
                    [greatest(col[tie:j]) for col in cols])
        yield k, row


def merge_group(into: dict[Any, Group], key: Any, row: Group, columns: int,
                lasts: bool) -> None:
    """``row`` added to the group ``into[key]`` (both of ``columns`` columns): the newer
    time, the lesser minima, the greater maxima, and the last values of the newer time (of
    the same time: each column's greater, as one GROUP BY over both tables would give)."""
    had = into.get(key)
    if had is None:
        into[key] = row
        return
    for i in range(1, 2 * columns + 1, 2):
        had[i] = least((had[i], row[i]))
        had[i + 1] = greatest((had[i + 1], row[i + 1]))
    if lasts:
        tail = slice(2 * columns + 1, 3 * columns + 1)
        if row[0] > had[0]:
            had[tail] = row[tail]
        elif row[0] == had[0]:
            had[tail] = [greatest(pair) for pair in zip(had[tail], row[tail], strict=True)]
    had[0] = max(had[0], row[0])


def min_max_last(slices: Sequence[Slice], columns: Sequence[str], start_s: float,
                 width_s: float, lasts: bool, into: dict[Any, Group]) -> None:
    """The blocks' rows of ``slices`` grouped on the grid, merged into ``into`` by bucket."""
    for s in slices:
        cols = [s.column(name) for name in columns]
        for k, row in _groups(s.column("ts_s"), cols, s.a, s.b, start_s, width_s, lasts):
            merge_group(into, k, row, len(columns), lasts)


def min_max_per_pid(slices: Sequence[Slice], columns: Sequence[str], start_s: float,
                    width_s: float, into: dict[Any, Group]) -> None:
    """Per (pid, bucket): the newest time and each column's least and greatest value of the
    rows with any of ``columns`` measured (rows with none are left out, as the SQL's
    ``WHERE`` does), merged into ``into``."""
    for s in slices:
        times, cols, a, b = s.column("ts_s"), [s.column(name) for name in columns], s.a, s.b
        if all(None in col[a:b] for col in cols):  # some rows may measure none of them
            keep = [any(v is not None for v in values)
                    for values in zip(*(col[a:b] for col in cols), strict=True)]
            times = list(compress(times[a:b], keep))
            cols = [list(compress(col[a:b], keep)) for col in cols]
            a, b = 0, len(times)
        for k, row in _groups(times, cols, a, b, start_s, width_s, lasts=False):
            merge_group(into, (s.pid, k), row, len(columns), lasts=False)


def phase_counts(slices: Sequence[Slice], start_s: float, width_s: float,
                 into: dict[int, Counter[str]]) -> None:
    """Per bucket, the rows of each phase, added to ``into``."""
    for s in slices:
        phases = s.column("phase")
        for k, i, j in _bucket_runs(s.column("ts_s"), s.a, s.b, start_s, width_s):
            into.setdefault(k, Counter()).update(phases[i:j])


def least(values: Sequence[Any]) -> Any:
    return min((v for v in values if v is not None), default=None)


def greatest(values: Sequence[Any]) -> Any:
    return max((v for v in values if v is not None), default=None)
