"""Per-process allocator series of a window, where the store can tell the processes apart.

A private part of the store's reader (:mod:`vramscope.agent.store.reader`). Only the raw
samples keep the pid: where the tiers answer, a bucket's range is over every process's samples
(docs/api.md, "The timeline document"). :func:`process_window` gives each process's series from
the raw samples (at most ``PROCESS_RAW_LIMIT`` rows, counted on the index first), and which
processes sent allocator samples in the rest of the window as far as the store can tell: the
stored verdicts' pids (one a process at least every ``HEARTBEAT_S``), the processes table, and
the raw rows at either end of the window.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, or_, select
from vramscope.agent.alerts.verdicts import HEARTBEAT_S
from vramscope.agent.store import block_grid
from vramscope.agent.store.downsample import (
    RAW_GROUP_LIMIT,
    any_minute,
    device_row_id,
    grid_index,
    timeline_grid,
)
from vramscope.agent.store.read_once import once
from vramscope.agent.store.reads import (
    KV_PROCESS_COLUMNS,
    PROCESS_COLUMNS,
    UNREAD_LIMIT,
    UNREAD_TIERS,
    ProcessSeries,
    ProcessWindow,
)
from vramscope.agent.store.sample_blocks import edge_span, window_rows, window_slices
from vramscope.agent.store.schema import rollups, samples, verdicts
from vramscope.agent.store.window import count_at_most, first_sample_ts

if TYPE_CHECKING:
    from vramscope.agent.store.store import Store

# Raw rows of a window grouped by process, at most (all sources counted, on the index): the
# limit under which the downsampling groups raw rows itself, so that a window past it reads a
# tier instead.
PROCESS_RAW_LIMIT = RAW_GROUP_LIMIT
PROCESS_SERIES_LIMIT = 8  # processes drawn apart, at most: the newest (restarts make many pids)
EDGE_ROWS = 500  # raw rows read at either end of a window not grouped by process


def process_window(store: Store, device: int, start_s: float, end_s: float, buckets: int,
                   columns: Sequence[str] = PROCESS_COLUMNS, host: str | None = None,
                   pools: bool = False) -> ProcessWindow:
    """The window's per-process allocator series on the grid ``downsample(..., aligned=True)``
    draws ``buckets`` on, and the processes known to have sent allocator samples in it (see
    the module's docstring). ``columns``: which of :data:`PROCESS_COLUMNS` to read; with
    ``pools``, of :data:`KV_PROCESS_COLUMNS` instead (each process's KV pool, read the same
    way, apart: a window's processes with a pool are not those with an allocator)."""
    cols = tuple(c for c in (KV_PROCESS_COLUMNS if pools else PROCESS_COLUMNS) if c in columns)
    listed = once(("processes", store.engine, host or store.host_name),
                  lambda: store.processes(host=host or store.host_name))
    names = {p["pid"]: p for p in listed}
    did = device_row_id(store, device, host)
    if did is None or not cols or not end_s > start_s:
        return ProcessWindow([], False, None, None, [], None, None, names, PROCESS_RAW_LIMIT)
    horizon = first_sample_ts(store, device, host)
    raw_lo = None if horizon is None or horizon > end_s else max(start_s, horizon)
    series: list[ProcessSeries] = []
    newest = None
    from_s = None
    unread = None
    if raw_lo is None:
        unread = UNREAD_TIERS
    # counted from start_s: none lies before raw_lo (the device's first raw sample), and the
    # series' own count asked the same (read_once)
    elif count_at_most(store, device, start_s, end_s, PROCESS_RAW_LIMIT, host) > PROCESS_RAW_LIMIT:
        unread = UNREAD_LIMIT
    else:
        series, newest = _grouped(store, did, start_s, end_s, buckets, raw_lo, cols)
        from_s = raw_lo
        # the part before the raw samples: the tiers' alone, where a minute was rolled up
        # (retention deletes raw samples only once their minutes are rolled up)
        if raw_lo > start_s and any_minute(store, rollups.c.bucket_s, did, start_s, raw_lo):
            unread = UNREAD_TIERS
    pids: dict[int | None, None] = dict.fromkeys(s.pid for s in series)
    if unread is not None:
        # the part without per-process series: [start, from_s) where the tiers alone hold
        # it, else the whole window
        hi = end_s if from_s is None else from_s
        edge = raw_lo if unread == UNREAD_LIMIT else None
        if pools:
            # only the raw rows tell which processes have a pool (a verdict or a process row
            # may be a worker's without one): one pool counted as two would hide it
            pids.update(dict.fromkeys(_edge_pids(store, did, edge, hi, cols)))
        else:
            pids.update(dict.fromkeys(_pids_elsewhere(store, did, device, start_s, hi, names,
                                                      edge, cols)))
    # the newest processes, in the order of their pids: a process keeps its place (and the
    # figure its colour) from one refresh to the next, whichever sampled last
    kept = sorted(sorted(series, key=lambda s: -s.last_ts_s)[:PROCESS_SERIES_LIMIT],
                  key=lambda s: _by_pid(s.pid))
    return ProcessWindow(kept, len(series) > len(kept), from_s, newest,
                         sorted(pids, key=_by_pid), unread, horizon, names,
                         PROCESS_RAW_LIMIT)


def _by_pid(pid: int | None) -> tuple[bool, int]:
    return pid is None, pid or 0


def _grouped(store: Store, did: int, start_s: float, end_s: float, buckets: int,
             lo_s: float, cols: tuple[str, ...]
             ) -> tuple[list[ProcessSeries], float | None]:
    """Raw allocator rows in [lo_s, end_s] grouped by (pid, bucket) in one statement, and the
    device's newest sample of any source in [lo_s, end_s] (one seek)."""
    g_start, width, count = timeline_grid(start_s, end_s, buckets)
    bucket = grid_index(store, samples.c.ts_s, g_start, width).label("bucket")
    aggs = [agg(samples.c[col]) for col in cols for agg in (func.min, func.max)]
    q = (select(samples.c.pid, bucket, func.max(samples.c.ts_s), *aggs)
         .where(samples.c.device_id == did, samples.c.ts_s >= lo_s, samples.c.ts_s <= end_s,
                or_(*(samples.c[col].is_not(None) for col in cols)))
         .group_by(samples.c.pid, bucket))
    newest_q = (select(samples.c.ts_s)
                .where(samples.c.device_id == did, samples.c.ts_s >= lo_s,
                       samples.c.ts_s <= end_s)
                .order_by(samples.c.ts_s.desc()).limit(1))
    with store.engine.connect() as c:
        grouped = c.execute(q).all()
        # the allocators' and the KV pools' reads ask it alike: once (read_once)
        newest = once(("process_series.newest", store.engine, did, lo_s, end_s),
                      lambda: c.execute(newest_q).scalar())
        # the compact raw tier's rows, grouped from their decoded blocks
        in_blocks = window_slices(c, [did], lo_s, end_s)
    by_group: dict[Any, list[Any]] = {(r[0], int(r[1])): list(r[2:]) for r in grouped}
    block_grid.min_max_per_pid(in_blocks, cols, g_start, width, by_group)
    newest = max((x for x in (newest, *(s.column("ts_s")[s.b - 1] for s in in_blocks))
                  if x is not None), default=None)
    per_pid: dict[int | None, dict[int, list[Any]]] = {}
    for (pid, b), values in by_group.items():  # the end's clamped bucket: two groups in one
        block_grid.merge_group(per_pid.setdefault(pid, {}), min(max(b, 0), count - 1), values,
                               len(cols), lasts=False)
    out = []
    keys = [f"{col}_{stat}" for col in cols for stat in ("min", "max")]
    for pid, by_bucket in per_pid.items():
        rows = [{"ts_s": g_start + k * width, **dict(zip(keys, by_bucket[k][1:], strict=True))}
                for k in sorted(by_bucket)]
        out.append(ProcessSeries(pid, float(max(v[0] for v in by_bucket.values())), rows))
    return out, None if newest is None else float(newest)


def _edge_pids(store: Store, did: int, raw_lo: float | None, hi_s: float,
               cols: tuple[str, ...]) -> list[int | None]:
    """The pids of the rows with any of ``cols`` among the first and the last ``EDGE_ROWS``
    raw rows of any source in [raw_lo, hi_s] (an index range each, however few of them carry
    ``cols``); none where ``raw_lo`` is None."""
    if raw_lo is None or hi_s < raw_lo:
        return []
    found: dict[int | None, None] = {}
    with store.engine.connect() as c:
        for newest in (False, True):
            # only the blocks that hold this end's rows are decoded
            lo, hi = edge_span(c, did, raw_lo, hi_s, EDGE_ROWS, newest)
            rows = window_rows(c, [did], lo, hi, ("pid", *cols), newest_first=newest,
                               limit=EDGE_ROWS)
            found.update(dict.fromkeys(r[2] for r in rows
                                       if any(v is not None for v in r[3:])))
    return list(found)


def _pids_elsewhere(store: Store, did: int, device: int, lo_s: float, hi_s: float,
                    names: dict[int, dict[str, Any]], raw_lo: float | None,
                    cols: tuple[str, ...]) -> list[int | None]:
    """Processes that sent allocator samples in [lo_s, hi_s], where no per-process series were
    read: the stored verdicts' pids (one at least every ``HEARTBEAT_S`` while a process sends),
    the processes table's rows of this device seen then, and where raw samples exist
    (``raw_lo``: from then on) the pids of the ``EDGE_ROWS`` allocator rows at either end.
    Errs on the side of more: a process counted that sent no allocator sample only makes the
    figure say "all processes" of one."""
    if hi_s < lo_s:
        return []
    found: dict[int | None, None] = {}
    q = (select(verdicts.c.pid)
         .where(verdicts.c.device_id == did, verdicts.c.pid.is_not(None),
                verdicts.c.ts_s >= lo_s - HEARTBEAT_S, verdicts.c.ts_s <= hi_s)
         .group_by(verdicts.c.pid))
    with store.engine.connect() as c:
        found.update(dict.fromkeys(int(r[0]) for r in c.execute(q)))
    found.update(dict.fromkeys(_edge_pids(store, did, raw_lo, hi_s, cols)))
    for pid, p in names.items():
        on_device = str(device) in (p.get("devices") or "").split(",")
        if on_device and p["first_seen_s"] <= hi_s and p["last_seen_s"] >= lo_s:
            found[pid] = None
    return list(found)
