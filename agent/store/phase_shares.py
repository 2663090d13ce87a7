"""Phase shares per time bucket, counted in SQL: what a long timeline shows instead of bands.

At an hour or more, a 2-second prefill in every 30-second request is far narrower than a
pixel, and "the phase that held each bucket longest" would never be prefill. The share of
samples in each phase per bucket keeps it visible. Counted here over raw samples only (rollups
carry no phase; before the raw horizon the dashboard counts the per-second tier's seconds
itself, ``dashboard.queries.phase_bands``); ``unknown`` samples (NVML) say nothing and are not
counted. One indexed range scan of the window, grouped in the database.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Integer, cast, func, or_, select
from vramscope.agent.store.downsample import device_row_id
from vramscope.agent.store.schema import samples

if TYPE_CHECKING:
    from vramscope.agent.store.store import Store


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
    ratio = (samples.c.ts_s - start_s) / ((end_s - start_s) / buckets)
    # CAST truncates toward zero in SQLite (ts >= start, so that is floor); PostgreSQL rounds
    grid: ColumnElement[Any] = (func.floor(ratio) if store.dialect == "postgresql"
                                else cast(ratio, Integer))
    bucket = grid.label("bucket")
    q = (select(bucket, samples.c.phase, func.count().label("n"))
         .where(samples.c.device_id == did,
                samples.c.ts_s >= (start_s if from_s is None else max(start_s, from_s)),
                samples.c.ts_s <= end_s,
                samples.c.phase != "unknown")
         .group_by(bucket, samples.c.phase))
    out: dict[int, dict[str, int]] = {}
    with store.engine.connect() as c:
        for b, phase, n in c.execute(q):
            k = min(int(b), buckets - 1)
            out.setdefault(k, {})[phase] = out.get(k, {}).get(phase, 0) + int(n)
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
    previous = func.lag(samples.c.phase).over(order_by=(samples.c.ts_s, samples.c.id))
    phased = (select(samples.c.ts_s, samples.c.phase, previous.label("previous"))
              .where(samples.c.device_id == did, samples.c.ts_s >= start_s,
                     samples.c.ts_s <= end_s, samples.c.phase != "unknown")
              .subquery())
    q = (select(phased.c.ts_s, phased.c.phase)
         .where(or_(phased.c.previous.is_(None), phased.c.previous != phased.c.phase))
         .order_by(phased.c.ts_s).limit(limit + 1))
    with store.engine.connect() as c:
        rows = [(float(ts), str(phase)) for ts, phase in c.execute(q)]
    return rows if len(rows) <= limit else None
