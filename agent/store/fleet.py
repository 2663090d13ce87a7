"""Every device of every host at once, for the fleet page and the Overview of a fleet: what
each device is (host, index, model), its newest sample and its host's newest agent report, in
a fixed number of statements whatever the fleet's size (one statement per device is 512 round
trips to PostgreSQL for 64 nodes of 8 GPUs).

Each per-device (or per-host) newest value is a correlated scalar subquery: one seek on the
``(device_id, ts_s)`` (``(host_id, ts_s)``) index per row inside one statement, never a GROUP
BY, which would read every row of the history (a day of raw samples, 90 days of rollups) on
every request. Read through :func:`vramscope.agent.store.reader.fleet`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, func, select
from vramscope.agent.store.schema import agent_stats, devices, hosts, rollups, samples
from vramscope.agent.store.store import ROLLUP_BUCKET_S, stored_reasons

if TYPE_CHECKING:
    from vramscope.agent.store import Store

def devices_now(store: Store, not_after_s: float) -> list[dict[str, Any]]:
    """Every device row with its host and ``newest_ts_s``: its newest sample not ahead of
    ``not_after_s``, from the minute rollups where raw samples are gone (as
    ``Store.time_range`` gives it for one device; None: nothing stored). By host, then index."""
    here = samples.c.device_id == devices.c.id
    raw = (select(func.max(samples.c.ts_s)).where(here, samples.c.ts_s <= not_after_s)
           .scalar_subquery())
    minute = (select(func.max(rollups.c.bucket_s))
              .where(rollups.c.device_id == devices.c.id, rollups.c.bucket_s <= not_after_s)
              .scalar_subquery())
    q = (select(hosts.c.name.label("host"), devices.c.device_index, devices.c.name,
                devices.c.uuid, devices.c.total_bytes, raw.label("raw"),
                minute.label("minute"))
         .join(hosts, hosts.c.id == devices.c.host_id)
         .order_by(hosts.c.name, devices.c.device_index))
    with store.engine.connect() as c:
        rows = [dict(r._mapping) for r in c.execute(q)]
    for r in rows:
        raw_s, minute_s = r.pop("raw"), r.pop("minute")
        r["newest_ts_s"] = (float(raw_s) if raw_s is not None else
                            None if minute_s is None else float(minute_s) + ROLLUP_BUCKET_S)
    return rows


def agent_reports(store: Store) -> dict[str, dict[str, Any]]:
    """Each host's newest agent report (``agent_stats``' row, as
    ``Store.latest_agent_stats`` gives it), by host name; hosts without one are left out."""
    inner = agent_stats.alias("newer")
    newest = (select(func.max(inner.c.ts_s)).where(inner.c.host_id == hosts.c.id)
              .correlate(hosts).scalar_subquery())
    q = (select(hosts.c.name.label("host"), agent_stats).select_from(hosts)
         .join(agent_stats, and_(agent_stats.c.host_id == hosts.c.id,
                                 agent_stats.c.ts_s == newest))
         .order_by(agent_stats.c.id))
    with store.engine.connect() as c:
        rows = [dict(r._mapping) for r in c.execute(q)]
    out: dict[str, dict[str, Any]] = {}
    for r in rows:  # two reports of one instant: the later written
        r["rejected_by_reason"] = stored_reasons(r["rejected_by_reason"])
        out[r.pop("host")] = r
    return out
