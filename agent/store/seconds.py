"""The per-second tier: what is kept of raw samples once ``retention.raw_s`` has passed.

One ``seconds`` row per device, source and minute holds, for every second that had samples, its
sample count, the phase of its last sample and each counter's minimum, maximum and last value,
packed as a time-series database packs a chunk: a row per second cost about 100 bytes on SQLite
(8.5 MB per device-day at 10 Hz), packed it is 1 to 3 MB. SQL cannot group inside the blob, but
this tier is only read for windows of an hour or so; longer ones read the rollups.

Format (version 1): one version byte, then zlib of little-endian int64s: ``k`` second offsets
within the minute, then each series (:data:`SERIES`: count, phase, then the statistics
:data:`KEPT` names per counter, last only for the others) as ``k`` values, first absolute, then
differences. A counter that was not measured in a second is stored as -1 (counters are >= 0).
"""

from __future__ import annotations

import sys
import zlib
from array import array
from collections.abc import Iterable, Sequence
from itertools import accumulate
from operator import attrgetter, sub
from typing import Any, NamedTuple

from vramscope.agent.durations import MINUTE_S
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS, Phase, Sample

FORMAT_VERSION = 1
PHASES: tuple[Phase, ...] = tuple(Phase)  # a phase's code is its place here (stable: append only)
_PHASE_CODE = {p: i for i, p in enumerate(PHASES)}
_PHASE_VALUES = tuple(p.value for p in PHASES)
STATS = ("min", "max", "last")
# The statistics kept per counter. Last for all; minimum and maximum where a view reads them:
# the leak detector's floor (allocated, device used, KV blocks in use), the risk model's peaks
# (reserved, device used), fragmentation (inactive split, the largest free block). A counter
# without them reports its last value as its min and max. Cumulative counters (retries, OOMs)
# and near-constant ones (totals) would gain nothing; each noisy series left out saves about
# 4 % of the tier (measured on the generated week: 27 noisy series cost 2.3 kB a minute).
KEPT: dict[str, tuple[str, ...]] = {
    "allocated_bytes": STATS,
    "reserved_bytes": STATS,
    "inactive_split_bytes": ("max", "last"),
    "largest_free_block_bytes": ("min", "last"),
    "device_used_bytes": STATS,
    "kv_blocks_used": STATS,
}
_KEPT = [(i, STATS.index(stat)) for i, f in enumerate(SAMPLE_COUNTER_FIELDS)
         for stat in KEPT.get(f, ("last",))]
SERIES: tuple[str, ...] = ("count", "phase",
                           *(f"{SAMPLE_COUNTER_FIELDS[i]}_{STATS[s]}" for i, s in _KEPT))
# (counter, statistic) -> its series' place in a blob (after the offsets, counts and phases)
_KEPT_COLUMN = {key: 3 + n for n, key in enumerate(_KEPT)}
_MISSING = -1
_STAT_OF = tuple(attrgetter(name) for name in ("low", "high", "last"))  # Second's, as STATS
_N = len(SAMPLE_COUNTER_FIELDS)


class Second(NamedTuple):
    """One second of one device and source, as the tier keeps it."""

    ts_s: float  # the second's start
    n_samples: int  # raw samples it had
    phase: Phase  # the phase of its last sample
    low: tuple[int | None, ...]  # per SAMPLE_COUNTER_FIELDS: the second's minimum (KEPT)
    high: tuple[int | None, ...]  # ... maximum (KEPT; else the last value)
    last: tuple[int | None, ...]  # ... value in its last sample that measured it

    def sample(self, device: int, which: str = "last", source: str | None = "seconds",
               phase: Phase | None = None) -> Sample:
        """The second as one Sample at its start: ``which`` of min / max / last values."""
        values = {"min": self.low, "max": self.high, "last": self.last}[which]
        head = (self.ts_s, device, self.phase if phase is None else phase, source, None)
        return Sample._make(head + values + (None, None))  # host, device_uuid


def summarize(rows: Iterable[Sequence[Any]]) -> list[Second]:
    """Seconds from raw rows ``(ts_s, phase, *counters)`` in time order (one source)."""
    out: list[Second] = []
    current: float | None = None
    group: list[Sequence[Any]] = []
    for row in rows:
        second = float(int(row[0] // 1))
        if second != current and group:
            out.append(_second(current, group))  # type: ignore[arg-type]
            group = []
        current = second
        group.append(row)
    if group:
        out.append(_second(current, group))  # type: ignore[arg-type]
    return out


def _second(ts_s: float, group: list[Sequence[Any]]) -> Second:
    if len(group) == 1:  # a second of one sample (1 Hz sources): its values are all three
        row = group[0]
        values = tuple(row[2:2 + _N])
        return Second(ts_s, 1, Phase.parse(row[1]), values, values, values)
    low, high, last = [], [], []
    for i in range(2, 2 + _N):
        col = [r[i] for r in group if r[i] is not None]
        low.append(min(col) if col else None)
        high.append(max(col) if col else None)
        last.append(col[-1] if col else None)
    return Second(ts_s, len(group), Phase.parse(group[-1][1]), tuple(low), tuple(high),
                  tuple(last))


def pack(seconds: Sequence[Second]) -> bytes:
    """One minute's seconds (all in the same minute, in time order) as the tier's blob."""
    if not seconds:
        raise ValueError("pack: no seconds to pack")
    minute = (seconds[0].ts_s // MINUTE_S) * MINUTE_S
    columns: list[Sequence[int]] = [[int(s.ts_s - minute) for s in seconds],
                                    [s.n_samples for s in seconds],
                                    [_PHASE_CODE[s.phase] for s in seconds]]
    # per statistic, each counter's values across the seconds (zip: a C loop, where a
    # rollup packs a minute of every device and source at once)
    per_stat = [list(zip(*map(stat, seconds), strict=True)) for stat in _STAT_OF]
    for i, stat in _KEPT:
        kept = per_stat[stat][i]
        columns.append([_MISSING if v is None else v for v in kept] if None in kept else kept)
    if min(columns[0]) < 0 or max(columns[0]) >= MINUTE_S:
        raise ValueError(f"pack: seconds outside the minute starting at {minute}")
    deltas: list[int] = []
    for col in columns:
        deltas.append(col[0])
        deltas.extend(map(sub, col[1:], col[:-1]))
    values = array("q", deltas)  # one conversion: array.extend of an iterator is slower
    if sys.byteorder == "big":
        values.byteswap()
    return bytes([FORMAT_VERSION]) + zlib.compress(values.tobytes(), 6)


def unpack(minute_s: float, blob: bytes) -> list[Second]:
    """The seconds a :func:`pack` blob holds, for the minute starting at ``minute_s``."""
    values, k = _decoded(minute_s, blob)
    columns = [list(accumulate(values[c * k:(c + 1) * k])) for c in range(1 + len(SERIES))]
    offsets, counts, phases = columns[0], columns[1], columns[2]
    kept = {key: [None if v == _MISSING else v for v in series]
            for key, series in zip(_KEPT, columns[3:], strict=True)}
    # per statistic, the series of each counter (its last values where the statistic is not
    # kept), turned into one tuple per second by zip: C loops, not Python ones
    per_stat = [list(zip(*(kept.get((i, stat), kept[(i, 2)]) for i in range(_N)), strict=True))
                for stat in range(len(STATS))]
    return [Second(minute_s + offsets[j], counts[j], PHASES[phases[j]], per_stat[0][j],
                   per_stat[1][j], per_stat[2][j]) for j in range(k)]


class PhaseSeconds(NamedTuple):
    """One row's seconds (a minute of one source) as columns of what phase bands and phase
    shares need: no counter decoded, no object per second (six hours would be 21,600
    ``Second`` objects built for one timeline)."""

    source: str
    starts: list[float]  # each second's start, in time order
    counts: list[int]  # its raw samples
    phases: list[str]  # the phase of its last sample (a ``Phase`` value)


def unpack_phases(minute_s: float, blob: bytes) -> tuple[list[float], list[int], list[str]]:
    """The seconds of a :func:`pack` blob as (starts, sample counts, phase values)."""
    values, k = _decoded(minute_s, blob)
    offsets, counts, codes = (list(accumulate(values[c * k:(c + 1) * k])) for c in range(3))
    return [minute_s + o for o in offsets], counts, [_PHASE_VALUES[c] for c in codes]


Series = list[int | None]  # one statistic of one counter, a value a second (None: unmeasured)


def unpack_columns(minute_s: float, blob: bytes, fields: Sequence[int]
                   ) -> tuple[list[float], list[tuple[Series, Series, Series]]]:
    """The seconds of a :func:`pack` blob as columns: each second's start, and per counter of
    ``fields`` (indexes into :data:`SAMPLE_COUNTER_FIELDS`) its (low, high, last) series, as
    :func:`unpack`'s ``Second`` holds them (the last values where a statistic is not kept).
    Only those counters' series are decoded, and no tuple is built per second: what the
    timeline's per-second buckets read (an hour: 60 rows)."""
    values, k = _decoded(minute_s, blob)

    def series(column: int) -> Series:
        out: Series = list(accumulate(values[column * k:(column + 1) * k]))
        # a counter measured in every second (the usual case) has nothing to mark: the test
        # is a scan in C, the marking a Python loop over every value
        return [None if v == _MISSING else v for v in out] if _MISSING in out else out

    decoded: dict[int, Series] = {}
    out = []
    for i in fields:
        stats = []
        for stat in range(len(STATS)):
            column = _KEPT_COLUMN.get((i, stat), _KEPT_COLUMN[(i, 2)])
            if column not in decoded:
                decoded[column] = series(column)
            stats.append(decoded[column])
        out.append((stats[0], stats[1], stats[2]))
    return [minute_s + o for o in accumulate(values[:k])], out


def _decoded(minute_s: float, blob: bytes) -> tuple[array[int], int]:
    """A blob's int64 values (every series, delta-encoded) and the seconds it holds."""
    if not blob or blob[0] != FORMAT_VERSION:
        found = blob[0] if blob else "nothing"
        raise ValueError(f"per-second tier row of minute {minute_s}: format {found}, "
                         f"expected {FORMAT_VERSION}")
    values = array("q")
    values.frombytes(zlib.decompress(blob[1:]))
    if sys.byteorder == "big":
        values.byteswap()
    width = 1 + len(SERIES)
    k, rest = divmod(len(values), width)
    if rest:
        raise ValueError(f"per-second tier row of minute {minute_s}: {len(values)} values "
                         f"are not {width} series of equal length")
    return values, k


def by_minute(seconds: Sequence[Second]) -> list[tuple[float, list[Second]]]:
    """``seconds`` (time order) split into their minutes: (minute start, its seconds)."""
    out: list[tuple[float, list[Second]]] = []
    for s in seconds:
        minute = (s.ts_s // MINUTE_S) * MINUTE_S
        if out and out[-1][0] == minute:
            out[-1][1].append(s)
        else:
            out.append((minute, [s]))
    return out
