"""The stored verdicts (table ``verdicts``, migration 0010): written by whoever runs the alert
engine over records (the agent's writer, ``import``, ``replay``), read by every surface.

A window's answer is, per process, the newest verdict at or before the window's end
(:func:`latest`); its history in the window (:func:`history`) draws the forecast and the
state changes. Neither reads a sample: a page over a week costs a few index lookups.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlalchemy import and_, func, insert, select
from vramscope.agent.alerts.verdicts import HEARTBEAT_S, Verdict, verdict_from_json
from vramscope.agent.store.schema import devices, hosts, verdicts
from vramscope.agent.store.store import stored_json

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from vramscope.agent.store import Store

HISTORY_LIMIT = 20_000  # verdict rows one window's history reads (a week of one process: ~4k)
# A process whose newest verdict is this much older than its device's newest has ended: the
# engine forgets a process after five minutes of silence and writes nothing more for it.
ENDED_AFTER_S = 2 * HEARTBEAT_S


def write(store: Store, rows: Sequence[Verdict], conn: Connection | None = None) -> int:
    """Store ``rows`` (in the caller's transaction when ``conn`` is given)."""
    if not rows:
        return 0
    values = [{"device_id": store.device_id(v.device, v.host, conn), "pid": v.pid,
               "ts_s": v.ts_s, "leak_state": v.leak_state, "risk_level": v.risk_level,
               "doc": json.dumps(v.to_json(), separators=(",", ":"))} for v in rows]
    if conn is not None:
        conn.execute(insert(verdicts), values)
    else:
        with store.engine.begin() as c:
            c.execute(insert(verdicts), values)
    return len(values)


def latest(store: Store, device: int, host: str | None, at_s: float) -> list[Verdict]:
    """Each process's newest verdict at or before ``at_s`` on the device, by pid (the device
    as a whole, ``pid`` None, first)."""
    did = store.known_device_id(device, host)
    if did is None:
        return []
    pid = func.coalesce(verdicts.c.pid, -1)
    newest = (select(pid.label("p"), func.max(verdicts.c.ts_s).label("ts"))
              .where(verdicts.c.device_id == did, verdicts.c.ts_s <= at_s)
              .group_by(pid).subquery())
    q = (select(verdicts.c.doc, verdicts.c.id)
         .join(newest, and_(pid == newest.c.p, verdicts.c.ts_s == newest.c.ts))
         .where(verdicts.c.device_id == did).order_by(verdicts.c.id))
    with store.engine.connect() as c:
        docs = [r[0] for r in c.execute(q)]
    found: dict[int | None, Verdict] = {}
    for doc in docs:  # two rows of one instant: the later written
        v = _verdict(doc)
        if v is not None:
            found[v.pid] = v
    return sorted(found.values(), key=lambda v: (v.pid is not None, v.pid or 0))


def history(store: Store, device: int, host: str | None, start_s: float, end_s: float,
            limit: int = HISTORY_LIMIT) -> list[Verdict]:
    """The device's verdicts in [start_s, end_s], oldest first (at most ``limit``: the newest)."""
    did = store.known_device_id(device, host)
    if did is None:
        return []
    q = (select(verdicts.c.doc).where(verdicts.c.device_id == did,
                                      verdicts.c.ts_s >= start_s, verdicts.c.ts_s <= end_s)
         .order_by(verdicts.c.ts_s.desc(), verdicts.c.id.desc()).limit(limit))
    with store.engine.connect() as c:
        docs = [r[0] for r in c.execute(q)]
    out = [v for v in map(_verdict, reversed(docs)) if v is not None]
    return out


def has_any(store: Store, device: int | None = None, host: str | None = None) -> bool:
    """Whether any verdict is stored (for the device, when given)."""
    q = select(verdicts.c.id).limit(1)
    if device is not None:
        did = store.known_device_id(device, host)
        if did is None:
            return False
        q = q.where(verdicts.c.device_id == did)
    with store.engine.connect() as c:
        return c.execute(q).first() is not None


def newest_all(store: Store, host: str | None = None) -> list[Verdict]:
    """Every device's processes' newest verdicts (``/metrics``, ``status``): per device the
    :func:`latest` at its newest verdict, the ended processes left out."""
    q = (select(devices.c.device_index, hosts.c.name, func.max(verdicts.c.ts_s))
         .join(devices, devices.c.id == verdicts.c.device_id)
         .join(hosts, hosts.c.id == devices.c.host_id)
         .group_by(devices.c.device_index, hosts.c.name))
    if host not in (None, "*"):
        q = q.where(hosts.c.name == host)
    with store.engine.connect() as c:
        tops = [tuple(r) for r in c.execute(q)]
    out: list[Verdict] = []
    for device, host_name, newest in sorted(tops, key=lambda t: (t[1], t[0])):
        out += current(latest(store, device, host_name, newest))
    return out


def current(rows: list[Verdict]) -> list[Verdict]:
    """Of a device's :func:`latest` rows, those of processes that have not ended."""
    return [v for v in rows if not ended(v, rows)]


def ended(v: Verdict, rows: list[Verdict]) -> bool:
    """``v``'s process has ended: its device went on writing verdicts without it."""
    newest = max(r.ts_s for r in rows)
    return v.ts_s < newest - ENDED_AFTER_S


def _verdict(doc: str) -> Verdict | None:
    parsed = stored_json(doc)
    if not isinstance(parsed, dict):
        return None
    try:
        return verdict_from_json(parsed)
    except (KeyError, TypeError, ValueError):
        return None  # a damaged row is not an answer
