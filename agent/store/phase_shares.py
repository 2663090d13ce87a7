"""Phase bands and phase shares per time bucket: what the timeline's phase lane draws.

A private part of the store's reader (:mod:`vramscope.agent.store.reader`), which chooses what
answers a window (:func:`vramscope.agent.store.reader.phase_bands`). Exact bands come from phase
events or from raw samples' phase changes. At an hour or more a 2-second prefill is narrower
than a pixel, so shares of samples per phase per bucket keep it visible: counted in SQL over raw
samples, in Python over compact blocks and the per-second tier; ``unknown`` samples (NVML) are
not counted. The functions below the SQL ones are pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, func, or_, select
from vramscope.agent.records import Event, Phase
from vramscope.agent.store import block_grid
from vramscope.agent.store.downsample import device_row_id, grid_index
from vramscope.agent.store.sample_blocks import Slice, window_slices
from vramscope.agent.store.schema import samples

if TYPE_CHECKING:
    from vramscope.agent.store.seconds import PhaseSeconds
    from vramscope.agent.store.store import Store

_UNKNOWN = Phase.UNKNOWN.value  # NVML's samples: they say nothing of the phase
BAND_PHASES = frozenset({Phase.PREFILL.value, Phase.DECODE.value, Phase.IDLE.value,
                         Phase.SETUP.value})


def phase_counts(store: Store, device: int, start_s: float, end_s: float, buckets: int,
                 host: str | None = None, from_s: float | None = None
                 ) -> dict[int, dict[str, int]]:
    """``{bucket: {phase: samples}}`` for buckets ``0..buckets-1`` of ``[start_s, end_s]``;
    ``from_s``: only the samples from then on (on the same grid)."""
    if buckets < 1 or not end_s > start_s:
        raise ValueError(f"need buckets >= 1 and end > start, got {buckets}, {start_s}, {end_s}")
    did = device_row_id(store, device, host)
    if did is None:
        return {}
    lo_s = start_s if from_s is None else max(start_s, from_s)
    width = (end_s - start_s) / buckets
    bucket = grid_index(store, samples.c.ts_s, start_s, width).label("bucket")
    q = (select(bucket, samples.c.phase, func.count().label("n"))
         .where(samples.c.device_id == did, samples.c.ts_s >= lo_s, samples.c.ts_s <= end_s,
                samples.c.phase != "unknown")
         .group_by(bucket, samples.c.phase))
    counted: dict[int, Counter[str]] = {}
    with store.engine.connect() as c:
        for b, phase, n in c.execute(q):
            counted.setdefault(int(b), Counter())[phase] += int(n)
        # the compact raw tier's rows, counted from their decoded blocks
        block_grid.phase_counts(window_slices(c, [did], lo_s, end_s), start_s, width, counted)
    out: dict[int, dict[str, int]] = {}
    for b, phases in counted.items():
        mine = out.setdefault(min(b, buckets - 1), {})
        for phase, n in phases.items():
            if phase != "unknown":
                mine[phase] = mine.get(phase, 0) + n
    return out


def phase_changes(store: Store, device: int, start_s: float, end_s: float, limit: int,
                  host: str | None = None) -> list[tuple[float, str]] | None:
    """``(ts_s, phase)`` of each sample in [start_s, end_s] whose phase differs from the one
    before (``unknown`` samples left out), in time order; None when more than ``limit``.

    Found in SQL (``lag() over``): the database hands back the few hundred changes of a
    15-minute window, not its 9,000 samples as ``Sample`` objects built only to be compared."""
    did = device_row_id(store, device, host)
    if did is None:
        return []
    with store.engine.connect() as c:
        in_blocks = window_slices(c, [did], start_s, end_s)
        if in_blocks:  # the compact raw tier's rows: the changes found in Python
            return _changes_with_blocks(c, did, start_s, end_s, limit, in_blocks)
        previous = func.lag(samples.c.phase).over(order_by=(samples.c.ts_s, samples.c.id))
        phased = (select(samples.c.ts_s, samples.c.phase, previous.label("previous"))
                  .where(samples.c.device_id == did, samples.c.ts_s >= start_s,
                         samples.c.ts_s <= end_s, samples.c.phase != "unknown")
                  .subquery())
        q = (select(phased.c.ts_s, phased.c.phase)
             .where(or_(phased.c.previous.is_(None), phased.c.previous != phased.c.phase))
             .order_by(phased.c.ts_s).limit(limit + 1))
        rows = [(float(ts), str(phase)) for ts, phase in c.execute(q)]
    return rows if len(rows) <= limit else None


def _changes_with_blocks(c: Connection, did: int, start_s: float, end_s: float, limit: int,
                         in_blocks: list[Slice]) -> list[tuple[float, str]] | None:
    """:func:`phase_changes` where blocks hold some of the window: the phased rows of
    ``samples`` and of the blocks' slices as (ts_s, id, phase), sorted (C) and walked once.
    A window this short (``PHASE_SAMPLE_SPAN_S``: 27,000 rows at 10 Hz of three sources) is
    cheaper so than decoded into a table for SQL's ``lag()``."""
    q = (select(samples.c.ts_s, samples.c.id, samples.c.phase)
         .where(samples.c.device_id == did, samples.c.ts_s >= start_s,
                samples.c.ts_s <= end_s, samples.c.phase != _UNKNOWN))
    rows: list[tuple[float, int, str]] = [tuple(r) for r in c.execute(q).all()]
    for s in in_blocks:
        rows.extend(r for r in zip(s.column("ts_s")[s.a:s.b], s.column("id")[s.a:s.b],
                                   s.column("phase")[s.a:s.b], strict=True)
                    if r[2] != _UNKNOWN)
    rows.sort()
    out: list[tuple[float, str]] = []
    previous = None
    for ts, _, phase in rows:
        if phase != previous:
            out.append((float(ts), str(phase)))
            if len(out) > limit:
                return None
            previous = phase
    return out


_PHASE_ORDER = ("prefill", "decode", "setup", "idle")  # drawing order of shares, bottom up


def shares_from_counts(counts: dict[int, dict[str, int]], start_s: float, end_s: float,
                       buckets: int) -> dict[str, list[Any]]:
    """Per bucket, each phase's share of the samples that carried a phase:
    ``{"ts": [bucket start...], "<phase>": [share...]}`` (buckets without any are left out)."""
    width = (end_s - start_s) / buckets
    phases = sorted({p for c in counts.values() for p in c if p in BAND_PHASES},
                    key=_PHASE_ORDER.index)
    out: dict[str, list[Any]] = {"ts": [], **{p: [] for p in phases}}
    for b in sorted(counts):
        total = sum(n for p, n in counts[b].items() if p in BAND_PHASES)
        if not total:
            continue
        out["ts"].append(start_s + b * width)
        for p in phases:
            out[p].append(counts[b].get(p, 0) / total)
    return out


def shares_from_bands(bands: list[dict[str, Any]], start_s: float, end_s: float,
                      buckets: int) -> dict[str, list[Any]]:
    """The same shares from phase bands (time held per bucket instead of samples)."""
    width = (end_s - start_s) / buckets
    held: list[dict[str, float]] = [{} for _ in range(buckets)]
    for band in bands:
        _spread(band, start_s, width, held)
    counts = {i: h for i, h in enumerate(held) if h}
    return shares_from_counts(counts, start_s, end_s, buckets)  # type: ignore[arg-type]


def bands_from_events(events: Iterable[Event], end_s: float) -> list[dict[str, Any]]:
    """Phase-change events to bands: each phase lasts until the next change."""
    return bands_from_changes(changes_from_events(events), end_s)


def changes_from_events(events: Iterable[Event]) -> list[tuple[float, str]]:
    """Phase-change events as ``(ts_s, phase)`` changes, to be joined with others."""
    return [(e.ts_s, e.phase.value) for e in events if e.phase is not None]


def changes_from_seconds(rows: Sequence[PhaseSeconds]) -> list[tuple[float, str]]:
    """The per-second tier's seconds (``Store.seconds_phases``) as ``(ts_s, phase)`` changes: a
    second whose phase (its last sample's) differs from the one before, at the second's start,
    so consecutive seconds of one phase make one band. Sources are merged in time order as raw
    samples are (ties by source, so the order is the same on every backend); ``unknown``
    seconds (NVML) say nothing. A change inside a second shows at that second's start: the
    tier keeps no finer time."""
    pairs: Iterable[tuple[float, str]]
    if len({row.source for row in rows}) > 1:
        merged = sorted((ts, row.source, phase)
                        for row in rows for ts, phase in zip(row.starts, row.phases))
        pairs = ((ts, phase) for ts, _, phase in merged)
    else:  # one source: its minute rows are in time order already
        pairs = (pair for row in rows for pair in zip(row.starts, row.phases))
    out: list[tuple[float, str]] = []
    held = None
    for ts, phase in pairs:
        if phase != _UNKNOWN and phase != held:
            out.append((ts, phase))
            held = phase
    return out


def counts_from_seconds(rows: Iterable[PhaseSeconds], start_s: float, end_s: float,
                        buckets: int) -> dict[int, dict[str, int]]:
    """``{bucket: {phase: samples}}`` on the grid of ``phase_shares.phase_counts``, from the
    per-second tier (``Store.seconds_phases``): each second's samples counted in its phase
    (its last sample's)."""
    width, top = (end_s - start_s) / buckets, buckets - 1
    out: dict[int, dict[str, int]] = {}
    for row in rows:
        for ts, n, phase in zip(row.starts, row.counts, row.phases):
            if phase == _UNKNOWN or not start_s <= ts <= end_s:
                continue
            mine = out.setdefault(min(int((ts - start_s) // width), top), {})
            mine[phase] = mine.get(phase, 0) + n
    return out


def add_counts(a: dict[int, dict[str, int]], b: dict[int, dict[str, int]]
               ) -> dict[int, dict[str, int]]:
    """Two ``{bucket: {phase: samples}}`` on one grid, summed (new dicts; neither changed)."""
    out = {k: dict(v) for k, v in a.items()}
    for k, phases in b.items():
        mine = out.setdefault(k, {})
        for phase, n in phases.items():
            mine[phase] = mine.get(phase, 0) + n
    return out


def bands_from_changes(changes: list[tuple[float, str]], end_s: float) -> list[dict[str, Any]]:
    """Bands from ``(ts_s, phase)`` changes (``phase_shares.phase_changes``)."""
    bands: list[dict[str, Any]] = []
    for i, (ts, phase) in enumerate(changes):
        stop = changes[i + 1][0] if i + 1 < len(changes) else end_s
        if phase not in BAND_PHASES or stop <= ts:
            continue
        if bands and bands[-1]["phase"] == phase and bands[-1]["end"] >= ts:
            bands[-1]["end"] = stop
        else:
            bands.append({"phase": phase, "start": ts, "end": stop})
    return bands


def _spread(band: dict[str, Any], start_s: float, width: float,
            held: list[dict[str, float]]) -> None:
    first = max(0, int((band["start"] - start_s) // width))
    last = min(len(held) - 1, int((band["end"] - start_s) // width))
    for i in range(first, last + 1):
        lo = max(band["start"], start_s + i * width)
        hi = min(band["end"], start_s + (i + 1) * width)
        if hi > lo:
            held[i][band["phase"]] = held[i].get(band["phase"], 0.0) + hi - lo
