"""The request rate of a window: requests started per minute, on a grid of whole minutes.

A private part of the store's reader (:mod:`vramscope.agent.store.reader`). Request events go
with the raw samples after ``retention.raw_s``, their counts per minute stay (``event_counts``):
rolled-up minutes are read as counts, the newest few from raw ``request_start`` events, and a
store no retention rolled up (an imported trace) from its raw events alone.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING

from sqlalchemy import func, select, union_all
from vramscope.agent.durations import MINUTE_S
from vramscope.agent.store import event_blocks
from vramscope.agent.store.downsample import grid_index, minutes_end, seconds_end
from vramscope.agent.store.reads import RequestRate
from vramscope.agent.store.schema import event_counts, events

if TYPE_CHECKING:
    from vramscope.agent.store.store import Store

RATE_EVENT = "request_start"
COUNTED, RAW = "event counts", "raw events"  # the two tiers a rate is read from


def request_rate(store: Store, device: int, host: str | None, start_s: float, end_s: float,
                 bucket_s: float) -> RequestRate:
    """Requests started per minute in buckets of ``bucket_s`` rounded up to whole minutes
    (the timeline's buckets, or a minute where those are finer), on a grid of that width,
    from the bucket at or before ``start_s`` to ``end_s``."""
    if not end_s > start_s or not bucket_s > 0:
        raise ValueError(f"bad window: start {start_s}, end {end_s}, bucket_s {bucket_s}")
    width = MINUTE_S * max(1, math.ceil(bucket_s / MINUTE_S - 1e-9))
    grid_start = math.floor(start_s / width) * width
    n = max(1, math.ceil((end_s - grid_start) / width))
    counts = [0] * n
    tier = RAW
    did = store.known_device_id(device, host)
    if did is not None:
        rolled = _counted_end(store, did)
        upto = grid_start if rolled is None else min(max(rolled, grid_start), end_s)
        minute = event_counts.c.minute_s
        # each part grouped in SQL (a row a bucket), both in one statement
        bucket = grid_index(store, minute, grid_start, width)
        counted = (select(bucket.label("bucket"), func.sum(event_counts.c.count).label("n"))
                   .where(event_counts.c.device_id == did, event_counts.c.name == RATE_EVENT,
                          minute >= grid_start, minute < upto)
                   .group_by(bucket))
        bucket = grid_index(store, events.c.ts_s, grid_start, width)
        raw = (select(bucket.label("bucket"), func.count().label("n"))
               .where(events.c.device_id == did, events.c.name == RATE_EVENT,
                      events.c.ts_s >= upto, events.c.ts_s <= end_s)
               .group_by(bucket))
        with store.engine.connect() as c:
            parts = c.execute(union_all(counted, raw)).all()
            # and those the compact raw tier holds, on the same grid (none where no block
            # of any device overlaps the timeline's window, asked once: read_once)
            none_kept = upto >= start_s and not event_blocks.any_in_window(c, start_s, end_s)
            moved = Counter() if none_kept else Counter(
                math.floor((r[2] - grid_start) / width)
                for r in event_blocks.window_rows(c, [did], upto, end_s, [RATE_EVENT]))
        for index, count in [*parts, *moved.items()]:
            counts[min(n - 1, int(index))] += int(count)
        if upto > grid_start:
            tier = COUNTED if upto >= end_s else f"{COUNTED}, then {RAW}"
    minutes = width / MINUTE_S
    return RequestRate(width, [grid_start + i * width for i in range(n)],
                       [count / minutes for count in counts], tier)


def _counted_end(store: Store, did: int) -> float | None:
    """The end of the minutes retention has counted for the device, or None: the later of its
    per-second tier's end and its newest counted minute's end (two seeks). Retention rolls up
    and counts every device over the same minutes, so the per-second tier says how far counting
    went; for a device that sent events but no samples (its per-second tier ends before them,
    or is empty) the counts themselves say it. Minutes between the newest counted one and the
    per-second tier's end held no frequent event when counted; a late one is counted again."""
    ends = [seconds_end(store, did), minutes_end(store, event_counts.c.minute_s, did)]
    found = [e for e in ends if e is not None]
    return max(found) if found else None
