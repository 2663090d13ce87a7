"""The store's one reader of windows, and the only place that chooses which tier answers one.

A caller asks about a :class:`~.reads.Span` (a device, its host, a window and optionally one
process) at a resolution, and each answer says which tier gave it (``tier``): raw samples, the
per-second tier, the minute rollups or their ten-minute groups, the event counts. The tier
modules behind it (:data:`TIER_MODULES`) are its private parts: nothing outside
``vramscope.agent.store`` imports them or uses their names (``tests/test_import_graph.py``).
The calls and the tiers each chooses among: docs/architecture.md, "The reader".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vramscope.agent.durations import SECOND_S
from vramscope.agent.event_kinds import Role, names_with
from vramscope.agent.records import Event, Phase, Sample
from vramscope.agent.store import downsample as _ds
from vramscope.agent.store import event_rate as _rate
from vramscope.agent.store import fleet as _fleet
from vramscope.agent.store import fleet_events as _fleet_events
from vramscope.agent.store import phase_shares as _ph
from vramscope.agent.store import process_series as _procs
from vramscope.agent.store import read_once as _once
from vramscope.agent.store import window as _bounded
from vramscope.agent.store.reads import (
    KV_PROCESS_COLUMNS,
    PROCESS_COLUMNS,
    UNREAD_LIMIT,
    UNREAD_TIERS,
    Bands,
    DeviceNow,
    Fleet,
    FleetDevice,
    Peaks,
    ProcessSeries,
    ProcessWindow,
    RequestRate,
    Series,
    Span,
    Timeline,
    Window,
)
from vramscope.agent.store.schema import ROLLUP_TIER_S

if TYPE_CHECKING:
    from vramscope.agent.store.seconds import PhaseSeconds, Second
    from vramscope.agent.store.store import Store

# the modules behind the reader: imported by the store's own modules only
TIER_MODULES = ("vramscope.agent.store.downsample", "vramscope.agent.store.window",
                "vramscope.agent.store.event_rate", "vramscope.agent.store.phase_shares",
                "vramscope.agent.store.process_series", "vramscope.agent.store.fleet",
                "vramscope.agent.store.fleet_events", "vramscope.agent.store.block_grid",
                "vramscope.agent.store.read_once")


class WindowTooLong(ValueError):
    """A window longer than the widest bucket of the ladder covers in the buckets asked for."""


def _every_process(span: Span, call: str) -> None:
    """The tiers keep no pid: a call that reads them answers for every process or not at all."""
    if span.process is not None:
        raise ValueError(f"reader.{call}: answers for every process of device {span.device} "
                         f"(the tiers keep no pid); got process {span.process}")


# --- the width ladder --------------------------------------------------------------------------
# Bucket widths a model or a chart reads a long window in: per-minute buckets (the rollups the
# agent keeps, or raw rows grouped in SQL where none are kept yet), coarser when a window would
# need more than the buckets asked for (7 days in 2,100: 5-minute buckets). From two minutes on,
# each a multiple of the two-minute rollup group, so that a bucket holds whole indexed groups
# (downsample.width_grid: 7 days of 5-minute buckets were a sort of the week's minutes on
# SQLite; of ten-minute ones, a walk along the index).
WIDTHS_S = (60.0, 120.0, 240.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14_400.0, 43_200.0,
            86_400.0)
TIER_BUCKETS = 2_100


def width_for(span_s: float, max_buckets: int = TIER_BUCKETS) -> float:
    """The narrowest width of the ladder that keeps ``span_s`` within ``max_buckets``."""
    for width in WIDTHS_S:
        if span_s / width <= max_buckets:
            return width
    raise WindowTooLong(f"a window of {span_s:.0f} s is longer than the dashboard analyses "
                        f"({WIDTHS_S[-1] * max_buckets:.0f} s)")


# --- series ------------------------------------------------------------------------------------
def series(store: Store, span: Span, points: int, columns: Sequence[str]) -> Series:
    """``columns`` in at most ``points`` buckets, on the grid the rollups are indexed by where
    buckets are five minutes or more (a week: 1,008 of ten minutes, grouped without a sort),
    on whole seconds where the per-second tier merges exactly, finer ones as asked."""
    _every_process(span, "series")
    rows, tier = _ds.downsampled(store, span.device, span.start_s, span.end_s, points,
                                 columns, None, span.host, aligned=True)
    grid = _ds.timeline_grid(span.start_s, span.end_s, points)
    return Series(rows, grid[0], grid[1], tier)


def extrema(store: Store, span: Span, columns: Sequence[str], points: int,
            ladder: bool = True) -> Series:
    """Per-bucket minima and maxima of ``columns`` (no last values: a query of their own) for
    a chart of at most ``points`` buckets: on the width ladder (``ladder``: a minute at least,
    as a leak chart's floor point is the minimum over a request cycle), else on the timeline's
    grid where buckets are two minutes or wider and ``points`` buckets as asked below (a risk
    chart's headroom keeps its short peaks)."""
    _every_process(span, "extrema")
    if ladder:
        width: float | None = width_for(span.end_s - span.start_s, points)
    else:
        grid = _ds.tier_grid(span.start_s, span.end_s, points)
        width = grid[1] if grid else None
    rows, tier = _ds.downsampled(store, span.device, span.start_s, span.end_s, points,
                                 columns, None, span.host, lasts=False, width_s=width)
    if width is None:
        return Series(rows, span.start_s, (span.end_s - span.start_s) / points, tier)
    on = _ds.width_grid(span.start_s, span.end_s, width)
    return Series(rows, on[0] if on else span.start_s, width, tier)


def peaks(store: Store, span: Span, columns: Sequence[str]) -> Peaks:
    """Each column's greatest value over ``span``, from the ten-minute boundary at or before
    its start: whole ten-minute groups (a day: 144 rows a metric, read along their key), so
    that no partial group's minutes and raw samples are read at the old end (two statements a
    device on PostgreSQL)."""
    _every_process(span, "peaks")
    first = math.floor(span.start_s / ROLLUP_TIER_S) * ROLLUP_TIER_S
    end = span.end_s if span.end_s > first else first + 1.0
    rows, tier = _ds.downsampled(store, span.device, first, end, 1, columns, None, span.host,
                                 lasts=False, width_s=ROLLUP_TIER_S)
    values = {c: max((r[f"{c}_max"] for r in rows if r[f"{c}_max"] is not None), default=None)
              for c in columns}
    return Peaks(values, first, tier)


# --- records -----------------------------------------------------------------------------------
# Raw samples one request may analyse: building a Sample and running the models over it is
# Python work per sample, so the count is held to what fits well within the 300 ms a page may
# take (`vramscope bench dashboard`), and a longer window goes a tier up. Counted before
# anything is built (window.count_at_most: an index range of at most N + 1 keys).
RAW_SAMPLE_LIMIT = 4_000
# The span of the per-second tier one request may analyse second by second. Not the samples
# but the floor windows set the leak detector's cost (a fit each): 4,000 raw samples at 10 Hz
# are 7 minutes, 4,000 seconds over an hour (60 fits). A longer old window goes a tier up, as
# a longer raw one does.
PER_SECOND_MAX_S = 1_200.0
TIER_EVENTS = names_with(Role.TIER)  # the events a tier window reads (requests are averaged out)
TIER_EVENT_LIMIT = 1_000
RAW = "raw samples"
PER_SECOND = "per-second tier"


def records(store: Store, span: Span, columns: Sequence[str], peaks: bool,
            max_buckets: int = TIER_BUCKETS) -> Window:
    """Raw samples and events (stitched after the per-second tier where retention deleted
    them: :func:`_one_by_one`) when the window holds at most ``RAW_SAMPLE_LIMIT``; else one
    sample per bucket of the width ladder (at most ``max_buckets``) carrying the bucket's
    minima at its start (phase idle: the minimum of allocated over a minute is the floor the
    leak detector takes) and, with ``peaks``, one in its middle carrying its maxima (the peaks
    the risk model trends)."""
    _every_process(span, "records")
    window = _one_by_one(store, span, peaks)
    if window is not None:
        return window
    device, host, start, end = span.device, span.host, span.start_s, span.end_s
    width = width_for(end - start, max_buckets)
    rows = _ds.downsample(store, device, start, end, 1, columns, None, host, lasts=False,
                          width_s=width)
    events = store.events(device, start, end, host=host, names=TIER_EVENTS,
                          limit=TIER_EVENT_LIMIT)
    tier = f"{_ds.read_from(store, device, start, end, width, host)}, {width:.3g} s buckets"
    return Window(_bucket_samples(rows, device, width, columns, peaks), events, tier, width)


def _bucket_samples(rows: list[dict[str, Any]], device: int, width: float,
                    columns: Sequence[str], peaks: bool) -> list[Sample]:
    """Downsampled rows as samples: see :func:`records`."""
    out = []
    for r in rows:
        low = {c: r[f"{c}_min"] for c in columns}
        if low.get("allocated_bytes") is None and low.get("device_used_bytes") is None:
            continue
        out.append(Sample(r["ts_s"], device, Phase.IDLE, "tier", None, **low))
        if peaks:
            high = {c: r[f"{c}_max"] for c in columns}
            out.append(Sample(r["ts_s"] + width / 2, device, Phase.DECODE, "tier", None, **high))
    return out


def _one_by_one(store: Store, span: Span, peaks: bool) -> Window | None:
    """The window's records one by one: raw samples, and before the device's first raw sample
    (retention deleted the older ones) the per-second tier's seconds (:func:`_second_samples`);
    None when that would build more than ``RAW_SAMPLE_LIMIT`` samples (counted, not built:
    :func:`records` takes a tier up). Events are all the window's: the frequent ones are gone
    with the raw samples, the rare ones (OOMs, orphaned blocks) kept with the rollups."""
    device, host, start, end = span.device, span.host, span.start_s, span.end_s
    horizon = _bounded.first_sample_ts(store, device, host)
    old_end = end if horizon is None else min(horizon, end)
    n_seconds = (_bounded.seconds_at_most(store, device, start, old_end, RAW_SAMPLE_LIMIT, host)
                 if old_end > start else 0)
    n_raw = _bounded.count_at_most(store, device, start, end, RAW_SAMPLE_LIMIT, host)
    if (n_seconds and old_end - start > PER_SECOND_MAX_S
            or n_seconds * (2 if peaks else 1) + n_raw > RAW_SAMPLE_LIMIT):
        return None
    events = store.events(device, start, end, host=host)
    if not n_seconds:
        return Window(store.samples(device, start, end, host=host), events, RAW)
    samples = _second_samples(store.seconds(device, start, old_end, host=host), device, peaks)
    if not n_raw:
        return Window(samples, events, PER_SECOND, SECOND_S)
    samples += store.samples(device, old_end, end, host=host)
    return Window(samples, events, f"{PER_SECOND}, then {RAW}", SECOND_S)


def _second_samples(seconds: list[tuple[str, Second]], device: int,
                    peaks: bool) -> list[Sample]:
    """Seconds of the tier (``Store.seconds``) as samples, in the spirit of
    :func:`_bucket_samples`: each second's minima at its start and, with ``peaks``, its maxima
    half a second on, both with the second's phase (that of its last sample) and source."""
    out = []
    for source, second in seconds:
        out.append(second.sample(device, "min", source or None))
        if peaks:
            out.append(second.sample(device, "max", source or None)
                       ._replace(ts_s=second.ts_s + SECOND_S / 2))
    out.sort(key=lambda s: s.ts_s)  # several sources' seconds interleave (a stable sort)
    return out


# --- phase bands -------------------------------------------------------------------------------
PHASE_SAMPLE_LIMIT = 20_000  # phase changes read for phase bands when there are no phase events
PHASE_SAMPLE_SPAN_S = 900.0  # ...and only in windows this short (10 Hz x 3 sources = 27k)
SHARE_BUCKETS = 240  # phase shares per bucket beyond that: one lane, a bar per ~4 pixels
# ...counted over raw samples only up to this span, past which counting them would cost as
# much as the timeline itself; longer windows read rollups, which carry no phase
PHASE_SHARE_SPAN_S = 6 * 3600.0


def phase_bands(store: Store, span: Span, max_bands: int, changes: list[Event],
                too_many: bool = False) -> Bands:
    """Exact bands from the window's phase events (``changes``), or from sample phases in a
    short window, when at most ``max_bands`` of them; otherwise each phase's share per bucket
    (a 2-second prefill would be narrower than a pixel, and no bucket's longest phase).
    ``too_many``: the events were cut at the caller's limit.

    Phase events and raw samples are gone before the device's first raw sample (retention):
    there the per-second tier's phases stand in (:func:`_stitched_phase_bands`)."""
    _every_process(span, "phase_bands")
    start_s, end_s = span.start_s, span.end_s
    if too_many:
        return Bands([], None, "zoom in: too many phase events")
    unread = False  # a part before the raw samples too long to read the tier's phases of
    if changes or end_s - start_s <= PHASE_SHARE_SPAN_S:  # else nothing is drawn either way
        raw_from, seconds = _seconds_before_raw(store, span)
        early = _ph.changes_from_seconds(seconds)
        if early:
            return _stitched_phase_bands(store, span, max_bands, changes, raw_from, seconds,
                                         early)
        unread = raw_from - start_s > _ds.SECONDS_READ_MAX_S
    found = _raw_phase_bands(store, span, max_bands, changes)
    if unread and not found.bands and not (found.shares and found.shares["ts"]):
        # not "no phase reported": the tier holds phases there, only not read this far
        return Bands([], None, f"zoom to {_ds.SECONDS_READ_MAX_S / 3600:g} h or less")
    return found


def _seconds_before_raw(store: Store, span: Span) -> tuple[float, list[PhaseSeconds]]:
    """``(raw_from, seconds)``: where the window's raw samples begin (the device's first one,
    the end when there are none, the start when none of the window is gone) and the
    per-second tier's seconds before it. Read only where the timeline's downsampling reads the
    tier too: a part of at most ``SECONDS_READ_MAX_S`` (a row per minute and source, unpacked
    in Python); a longer one says nothing rather than unpack days of seconds."""
    start_s, end_s = span.start_s, span.end_s
    first = _bounded.first_sample_ts(store, span.device, span.host)
    raw_from = max(start_s, end_s if first is None else min(first, end_s))
    if raw_from <= start_s or raw_from - start_s > _ds.SECONDS_READ_MAX_S:
        return raw_from, []
    return raw_from, store.seconds_phases(span.device, start_s, raw_from, host=span.host)


def _stitched_phase_bands(store: Store, span: Span, max_bands: int, changes: list[Event],
                          raw_from: float, seconds: list[PhaseSeconds],
                          early: list[tuple[float, str]]) -> Bands:
    """:func:`phase_bands` of a window whose part before ``raw_from`` only the per-second tier
    holds: its phase changes (``early``) then those of the phase events or raw samples from
    ``raw_from`` on, made bands as one list, so that a phase held across the horizon is one
    band (and the last one before a phase event lasts until it: events mark every change).
    Past ``max_bands``, or when the raw part is too long to read its changes, shares per
    bucket: the tier's seconds counted in their phase, with the raw samples' counts."""
    device, host, start_s, end_s = span.device, span.host, span.start_s, span.end_s
    after = _ph.changes_from_events(e for e in changes if e.ts_s >= raw_from)
    raw_source = "events" if after else "samples"
    source = "per-second tier" + (f", then {raw_source}" if raw_from < end_s else "")
    if after:
        bands = _ph.bands_from_changes(early + after, end_s)
        if len(bands) <= max_bands:
            return Bands(bands, None, source)
        return Bands([], _ph.shares_from_bands(bands, start_s, end_s, SHARE_BUCKETS), source)
    if end_s - raw_from <= PHASE_SAMPLE_SPAN_S:
        found = (_ph.phase_changes(store, device, raw_from, end_s, PHASE_SAMPLE_LIMIT, host)
                 if raw_from < end_s else [])
        bands = [] if found is None else _ph.bands_from_changes(early + found, end_s)
        if found is not None and len(bands) <= max_bands:
            return Bands(bands, None, source)
    counts = _ph.counts_from_seconds(seconds, start_s, end_s, SHARE_BUCKETS)
    if raw_from < end_s:
        counts = _ph.add_counts(counts, _ph.phase_counts(store, device, start_s, end_s,
                                                         SHARE_BUCKETS, host))
    return Bands([], _ph.shares_from_counts(counts, start_s, end_s, SHARE_BUCKETS), source)


def _raw_phase_bands(store: Store, span: Span, max_bands: int, changes: list[Event]) -> Bands:
    """:func:`phase_bands` from phase events and raw samples only."""
    device, host, start_s, end_s = span.device, span.host, span.start_s, span.end_s
    if changes:
        bands = _ph.bands_from_events(changes, end_s)
        if len(bands) <= max_bands:
            return Bands(bands, None, "events")
        return Bands([], _ph.shares_from_bands(bands, start_s, end_s, SHARE_BUCKETS), "events")
    if end_s - start_s <= PHASE_SAMPLE_SPAN_S:
        found = _ph.phase_changes(store, device, start_s, end_s, PHASE_SAMPLE_LIMIT, host)
        sampled = None if found is None else _ph.bands_from_changes(found, end_s)
        if sampled is not None and len(sampled) <= max_bands:
            return Bands(sampled, None, "samples")
    if end_s - start_s > PHASE_SHARE_SPAN_S:
        return Bands([], None, "zoom to 6 h or less")
    counts, source = _shares_counts(store, span)
    shares = _ph.shares_from_counts(counts, start_s, end_s, SHARE_BUCKETS)
    return Bands([], shares, source if shares["ts"] else "no phase reported")


def _shares_counts(store: Store, span: Span) -> tuple[dict[int, dict[str, int]], str]:
    """Samples per phase and share bucket (``SHARE_BUCKETS`` over the span), and where they
    were counted: raw samples, or where the window holds more than ``RAW_GROUP_LIMIT`` of them,
    the per-second tier's seconds (their phases only: a tenth of a full unpack) up to the end
    of its newest minute and the raw samples after it. Six hours at 10 Hz: 216,000 raw rows
    to group, or 360 rows of the tier."""
    device, host, start_s, end_s = span.device, span.host, span.start_s, span.end_s
    did = _ds.device_row_id(store, device, host)
    rolled = None if did is None else _ds.seconds_end(store, did)
    if (did is None or rolled is None or rolled <= start_s
            or not _ds.raw_rows_over(store, device, host, start_s, end_s)):
        return _ph.phase_counts(store, device, start_s, end_s, SHARE_BUCKETS, host), "samples"
    upto = min(rolled, end_s)
    counts = _ph.counts_from_seconds(store.seconds_phases(device, start_s, upto, host=host),
                                     start_s, end_s, SHARE_BUCKETS)
    if upto < end_s:
        counts = _ph.add_counts(counts, _ph.phase_counts(store, device, start_s, end_s,
                                                         SHARE_BUCKETS, host, from_s=upto))
    return counts, "per-second tier" + (", then samples" if upto < end_s else "")


# --- requests, processes -----------------------------------------------------------------------
def requests(store: Store, span: Span, bucket_s: float) -> RequestRate:
    """Requests started per minute in buckets of ``bucket_s`` rounded up to whole minutes,
    on a grid of that width from the bucket at or before the span's start: the minutes
    retention has counted from the event counts, the newest ones from the raw events."""
    _every_process(span, "requests")
    return _rate.request_rate(store, span.device, span.host, span.start_s, span.end_s,
                              bucket_s)


def process_series(store: Store, span: Span, points: int,
                   columns: Sequence[str] = PROCESS_COLUMNS, pools: bool = False
                   ) -> ProcessWindow:
    """Each process's allocated and reserved bytes on the grid :func:`series` draws ``points``
    on, where raw samples keep the pid, and the processes known to have sent allocator
    samples in the window (``ProcessWindow``); with ``pools``, each process's KV pool
    (:data:`KV_PROCESS_COLUMNS`) and the processes that sent KV samples. ``span.process``:
    that process's series only."""
    window = _procs.process_window(store, span.device, span.start_s, span.end_s, points,
                                   columns, span.host, pools)
    if span.process is None:
        return window
    return window._replace(series=[s for s in window.series if s.pid == span.process])


# --- one timeline request ----------------------------------------------------------------------
# the timeline's reads, from the event table (agent/event_kinds.py)
REQUEST_EVENTS = names_with(Role.REQUEST)  # markers while they fit, else the rate
RARE_EVENTS = tuple(n for n in names_with(Role.MARKER) if n not in REQUEST_EVENTS)  # always
PHASE_EVENTS = names_with(Role.PHASE)
LOAD_EVENTS = names_with(Role.LOAD)
PREFIX_EVENTS = names_with(Role.PREFIX)
NAMED_EVENT_LIMIT = 50_000  # phase and rare events one timeline reads
PREFIX_EVENT_LIMIT = 20_000  # request allocations a timeline reads for prefix-cache hits
ALERT_LIMIT = 10_000


def timeline(store: Store, span: Span, points: int, columns: Sequence[str],
             process_columns: Sequence[str] = PROCESS_COLUMNS) -> Timeline:
    """What one timeline request shows, read in one call: the series (:func:`series`), each
    process's (:func:`process_series`) on the same grid, the phases (:func:`phase_bands`, from
    the window's phase events), the request rate (:func:`requests`) and the window's events
    and alerts: OOMs and orphaned blocks always (at most ``points``); request boundaries only
    when at most ``points`` of them fall in the window (the first ``points`` of a busy day
    would only mislead); prefix-cache allocations only when at most ``PREFIX_EVENT_LIMIT``
    (both counted on the index first: a busy day's are not read to be dropped); each
    process's KV pool (``kv_pools``) where the device has a pool in the window."""
    # its parts ask some questions alike (where raw samples begin, how many the window
    # holds...): each read once (read_once)
    with _once.reading():
        return _timeline(store, span, points, columns, process_columns)


def _timeline(store: Store, span: Span, points: int, columns: Sequence[str],
              process_columns: Sequence[str]) -> Timeline:
    device, host, start_s, end_s = span.device, span.host, span.start_s, span.end_s
    _ds.read_edges(store, device, host)  # asked by most parts below: in one statement
    drawn = series(store, span, points, columns)
    # request boundaries and prefix-cache allocations counted first (one statement), then
    # the window's events read in one: the rare markers and the phase events, the load,
    # and of the other two those that fit (each name on the (device, name, time) index)
    n_requests, n_prefix = _bounded.event_groups_at_most(
        store, device, start_s, end_s,
        [(REQUEST_EVENTS, points), (PREFIX_EVENTS, PREFIX_EVENT_LIMIT)], host)
    truncated, with_prefix = n_requests > points, n_prefix <= PREFIX_EVENT_LIMIT
    groups = [(RARE_EVENTS + PHASE_EVENTS, NAMED_EVENT_LIMIT + 1),
              (LOAD_EVENTS, NAMED_EVENT_LIMIT + 1)]
    if not truncated:
        groups.append((REQUEST_EVENTS, points + 1))
    if with_prefix:
        groups.append((PREFIX_EVENTS, PREFIX_EVENT_LIMIT + 1))
    read = iter(store.event_groups(device, start_s, end_s, groups, host=host))
    named, load = next(read), next(read)
    marked = [] if truncated else next(read)
    prefix = next(read) if with_prefix else None
    changes = [e for e in named if e.name in PHASE_EVENTS]
    phases = phase_bands(store, span, points, changes, len(named) > NAMED_EVENT_LIMIT)
    alerts = store.alerts(host=host or store.host_name, device=device, start_s=start_s,
                          end_s=end_s, limit=ALERT_LIMIT)
    # each process's KV pool, only where the device has one in the window (a read saved
    # on every device without)
    has_pool = any(r.get("kv_blocks_total_max") is not None for r in drawn.rows)
    return Timeline(drawn, phases, requests(store, span, drawn.bucket_s),
                    process_series(store, span, points, process_columns),
                    [e for e in named if e.name not in PHASE_EVENTS][:points], marked, truncated,
                    load[:NAMED_EVENT_LIMIT], len(load) > NAMED_EVENT_LIMIT, prefix, alerts,
                    process_series(store, span, points, KV_PROCESS_COLUMNS, pools=True)
                    if has_pool
                    else None)


# --- bounded counts ----------------------------------------------------------------------------
def count_samples(store: Store, span: Span, limit: int) -> int:
    """Raw samples in the span, counted up to ``limit + 1`` on the index."""
    return _bounded.count_at_most(store, span.device, span.start_s, span.end_s, limit,
                                  span.host)


def count_events(store: Store, span: Span, names: tuple[str, ...], limit: int) -> int:
    """Events named one of ``names`` in the span, counted up to ``limit + 1`` on the index."""
    return _bounded.events_at_most(store, span.device, span.start_s, span.end_s, names, limit,
                                   span.host)


def raw_from(store: Store, device: int, host: str | None = None) -> float | None:
    """The device's first raw sample time (one seek): retention deletes raw samples oldest
    first, so what is older lives on only in the per-second tier and the rollups."""
    return _bounded.first_sample_ts(store, device, host)


def fleet(store: Store, at_s: float) -> Fleet:
    """Every device of every host at ``at_s``: what it is, its newest sample not ahead of
    ``at_s``, its running processes' stored verdicts (the alert engine's answers,
    :func:`~vramscope.agent.store.verdicts.fleet_current`), and each host's newest agent
    report. Four statements whatever the fleet's size (:mod:`~vramscope.agent.store.fleet`),
    none of which reads more than each device's newest rows."""
    from vramscope.agent.store.verdicts import fleet_current

    answers = fleet_current(store, at_s)
    rows = [FleetDevice(d["host"], d["device_index"], d["name"], d["uuid"], d["total_bytes"],
                        d["newest_ts_s"], answers.get((d["host"], d["device_index"]), []))
            for d in _fleet.devices_now(store, at_s) if d["device_index"] >= 0]
    return Fleet(rows, _fleet.agent_reports(store))


def fleet_samples(store: Store, at_s: float | None, window_s: float) -> list[DeviceNow]:
    """Every device of every host (by host, then index): its row, its span not ahead of
    ``at_s`` (``Store.time_range``'s; ``at_s`` None: to its newest sample whatever its time)
    and, of its raw samples of the ``window_s`` up to the span's end (``Store.samples``'),
    those that hold each (source, pid)'s newest values (``fleet.newest_values``): in two
    statements whatever the fleet's size."""
    return _fleet.newest_samples(store, at_s, window_s)


def fleet_events(store: Store, start_s: float, end_s: float,
                 names: Sequence[str]) -> dict[tuple[str, int], list[Event]]:
    """Every device's events named one of ``names`` in [start_s, end_s] by (host, device
    index), each device's in time order as ``Store.events`` gives them, in one statement."""
    return _fleet_events.device_events(store, start_s, end_s, names)


def fleet_spans(store: Store, not_after_s: float | None = None
                ) -> dict[tuple[str, int], tuple[float, float] | None]:
    """Every device's first and newest sample (``Store.time_range``'s span, the newest not
    ahead of ``not_after_s`` when given; None where there is none) by (host, device index),
    in one statement."""
    return _fleet.device_spans(store, not_after_s)


def fleet_event_counts(store: Store, start_s: float, end_s: float, name: str,
                       limit: int) -> dict[tuple[str, int], dict[int | None, int]]:
    """Every device's events named ``name`` in [start_s, end_s] counted per pid, of at most
    its first ``limit`` (those ``Store.events(..., limit=limit)`` reads), by (host, device
    index); devices without any left out. One statement whatever the fleet's size."""
    return _fleet_events.event_counts(store, start_s, end_s, name, limit)


def fleet_reports(store: Store) -> dict[str, dict[str, Any]]:
    """Each host's newest agent report (``Store.latest_agent_stats``'), by host name, in one
    statement; hosts without one are left out."""
    return _fleet.agent_reports(store)


__all__ = ["KV_PROCESS_COLUMNS", "PROCESS_COLUMNS", "TIER_MODULES", "UNREAD_LIMIT",
           "UNREAD_TIERS", "WIDTHS_S",
           "Bands", "DeviceNow", "Fleet", "FleetDevice", "Peaks", "ProcessSeries", "ProcessWindow",
           "RequestRate", "Series", "Span", "Timeline", "Window", "WindowTooLong",
           "count_events", "count_samples", "extrema", "fleet", "fleet_event_counts",
           "fleet_events", "fleet_reports", "fleet_samples", "fleet_spans", "peaks", "phase_bands",
           "process_series", "raw_from", "records", "requests", "series", "timeline",
           "width_for"]
