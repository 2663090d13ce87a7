"""Downsampling in SQL: N time buckets, min / max / last per bucket, so peaks survive.

24 hours at 10 Hz is 864k rows per series; the dashboard asks for ~2,000 points. Grouping in the
database sends ``buckets`` rows instead of the raw range.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Integer, and_, cast, func, select

from agent.records import SAMPLE_COUNTER_FIELDS
from agent.store.schema import devices, hosts, samples

if TYPE_CHECKING:
    from agent.store.store import Store


def downsample(store: Store, device: int, start_s: float, end_s: float, buckets: int,
               columns: Sequence[str], source: str | None,
               host: str | None) -> list[dict[str, Any]]:
    bad = [c for c in columns if c not in SAMPLE_COUNTER_FIELDS]
    if bad:
        known = ", ".join(SAMPLE_COUNTER_FIELDS)
        raise ValueError(f"unknown sample column(s) {bad}; known: {known}")
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    if not end_s > start_s:
        raise ValueError(f"end ({end_s}) must be after start ({start_s})")
    width = (end_s - start_s) / buckets
    did = _device_row_id(store, device, host)
    if did is None:
        return []
    ratio = (samples.c.ts_s - start_s) / width
    # CAST truncates toward zero in SQLite (ts >= start, so that is floor); PostgreSQL rounds.
    bucket = (func.floor(ratio) if store.dialect == "postgresql" else cast(ratio, Integer))
    bucket = bucket.label("bucket")
    where = [samples.c.device_id == did, samples.c.ts_s >= start_s, samples.c.ts_s <= end_s]
    if source is not None:
        where.append(samples.c.source == source)
    agg = [bucket, func.max(samples.c.ts_s).label("last_ts_s")]
    for col in columns:
        agg += [func.min(samples.c[col]).label(f"{col}_min"),
                func.max(samples.c[col]).label(f"{col}_max")]
    grouped = select(*agg).where(and_(*where)).group_by(bucket).subquery()
    # "last": the row at the bucket's latest timestamp (joined back on device and time).
    last = samples.alias("last_row")
    join_on = [last.c.device_id == did, last.c.ts_s == grouped.c.last_ts_s]
    if source is not None:
        join_on.append(last.c.source == source)
    q = (select(grouped, *(func.max(last.c[c]).label(f"{c}_last") for c in columns))
         .join(last, and_(*join_on))
         .group_by(*grouped.c)
         .order_by(grouped.c.bucket))
    with store.engine.connect() as c:
        rows = [dict(r._mapping) for r in c.execute(q)]
    for r in rows:
        b = int(r.pop("bucket"))
        r["ts_s"] = start_s + min(b, buckets - 1) * width
    return rows


def _device_row_id(store: Store, device: int, host: str | None) -> int | None:
    q = (select(devices.c.id).join(hosts, hosts.c.id == devices.c.host_id)
         .where(hosts.c.name == (host or store.host_name), devices.c.device_index == device))
    with store.engine.connect() as c:
        return c.execute(q).scalar()
