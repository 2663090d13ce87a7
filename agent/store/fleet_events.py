"""Every device's events of some names in a window, for the fleet's reads (``/metrics``' OOM
and phase counts, the Overview's request rates): one statement per read whatever the fleet's
size, each device a range of ``ix_events_device_name_ts``; through the compact raw tier's
blocks a device at a time where they hold some. Read through
:func:`~vramscope.agent.store.reader.fleet_events` and its counts."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from sqlalchemy import and_, func, select, true, union_all
from vramscope.agent.records import PHASE_OF, Event
from vramscope.agent.store import event_blocks
from vramscope.agent.store.fleet import connection
from vramscope.agent.store.schema import devices, events, hosts
from vramscope.agent.store.store import stored_json

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vramscope.agent.store import Store


def event_counts(store: Store, start_s: float, end_s: float, name: str,
                 limit: int) -> dict[tuple[str, int], dict[int | None, int]]:
    """Every device's events named ``name`` in [start_s, end_s], at most its first ``limit``
    of them (in time order, ties by id: those ``Store.events(..., limit=limit)`` reads of
    one device), counted per pid, by (host name, device index); devices without any are
    left out. One statement: per device a range of ``ix_events_device_name_ts`` of at most
    ``limit`` keys, never the events themselves sent back (a busy minute is thousands)."""
    if _blocks_hold_some(store, start_s, end_s, [name]):
        out: dict[tuple[str, int], dict[int | None, int]] = {}
        for host, index in _every_device(store):
            pids = Counter(e.pid for e in store.events(index, start_s, end_s, host=host,
                                                       names=[name], limit=limit))
            if pids:
                out[(host, index)] = dict(pids)
        return out
    in_window = and_(events.c.name == name, events.c.ts_s >= start_s, events.c.ts_s <= end_s)
    if store.dialect == "postgresql":
        # each device's own range, as in device_events (a LIMIT keeps it from being pulled up)
        first = (select(events.c.pid).where(events.c.device_id == devices.c.id, in_window)
                 .order_by(events.c.ts_s, events.c.id).limit(limit).lateral("first"))
        q = (select(hosts.c.name, devices.c.device_index, first.c.pid, func.count())
             .select_from(devices.join(hosts, hosts.c.id == devices.c.host_id)
                          .join(first, true()))
             .group_by(hosts.c.name, devices.c.device_index, first.c.pid))
    else:
        # the devices' ids as an IN list: SQLite seeks each device's range (device_events);
        # each device's first ``limit`` by their place in its time order
        nth = func.row_number().over(partition_by=events.c.device_id,
                                     order_by=(events.c.ts_s, events.c.id))
        ranked = (select(events.c.device_id, events.c.pid, nth.label("nth"))
                  .where(events.c.device_id.in_(select(devices.c.id)), in_window)
                  .subquery("ranked"))
        q = (select(hosts.c.name, devices.c.device_index, ranked.c.pid, func.count())
             .select_from(ranked.join(devices, devices.c.id == ranked.c.device_id)
                          .join(hosts, hosts.c.id == devices.c.host_id))
             .where(ranked.c.nth <= limit)
             .group_by(hosts.c.name, devices.c.device_index, ranked.c.pid))
    out = {}
    with connection(store) as c:
        for host, index, pid, n in c.execute(q):
            out.setdefault((host, index), {})[pid] = int(n)
    return out


def device_events(store: Store, start_s: float, end_s: float,
                  names: Sequence[str]) -> dict[tuple[str, int], list[Event]]:
    """Every device's events named one of ``names`` in [start_s, end_s], by (host name,
    device index), each device's in time order (ties by id), as ``Store.events`` gives one
    device's; devices without any are left out. One statement: per device a range of
    ``ix_events_device_name_ts`` for each name, never the window's other events (requests)."""
    if _blocks_hold_some(store, start_s, end_s, names):
        each = {(host, index): store.events(index, start_s, end_s, host=host, names=names)
                for host, index in _every_device(store)}
        return {key: evs for key, evs in each.items() if evs}
    in_window = and_(events.c.ts_s >= start_s, events.c.ts_s <= end_s)
    columns = (events.c.ts_s, events.c.name, events.c.pid, events.c.phase,
               events.c.request_id, events.c.data, events.c.id)
    if store.dialect == "postgresql":
        # as in newest_samples: each device's own ranges, one per name (with ``name IN``
        # PostgreSQL read the device's every name in the window and filtered them)
        found = union_all(*(select(*columns).where(events.c.device_id == devices.c.id,
                                                   events.c.name == name, in_window)
                            for name in sorted(set(names)))).lateral("found")
        q = select(hosts.c.name, devices.c.device_index, devices.c.uuid, found).select_from(
            devices.join(hosts, hosts.c.id == devices.c.host_id).join(found, true()))
        by_time = (found.c.ts_s, found.c.id)
    else:
        # the devices' ids as an IN list on the index's first column: SQLite seeks each
        # device's range per name (joined on the device, it walked every event stored)
        q = (select(hosts.c.name, devices.c.device_index, devices.c.uuid, *columns)
             .select_from(events).join(devices, devices.c.id == events.c.device_id)
             .join(hosts, hosts.c.id == devices.c.host_id)
             .where(events.c.device_id.in_(select(devices.c.id)),
                    events.c.name.in_(sorted(set(names))), in_window))
        by_time = (events.c.ts_s, events.c.id)
    q = q.order_by(hosts.c.name, devices.c.device_index, *by_time)
    out: dict[tuple[str, int], list[Event]] = {}
    with connection(store) as c:
        for host, index, uuid, ts, name, pid, phase, request_id, data, _ in c.execute(q):
            out.setdefault((host, index), []).append(
                Event(ts, name, index, pid, PHASE_OF.get(phase) if phase else None, request_id,
                      stored_json(data), host, uuid))
    return out


def _blocks_hold_some(store: Store, start_s: float, end_s: float, names: Sequence[str]) -> bool:
    """Whether the compact raw tier holds events of ``names`` in the window (of any device):
    then the fleet's event reads go a device at a time through ``Store.events``, which merges
    them (a view of the last minutes, the fleet pages', finds none: blocks are closed
    intervals)."""
    if not event_blocks.compactable(names):
        return False
    with connection(store) as c:
        return event_blocks.any_blocks(c, None, start_s, end_s)


def _every_device(store: Store) -> list[tuple[str, int]]:
    q = (select(hosts.c.name, devices.c.device_index)
         .join(hosts, hosts.c.id == devices.c.host_id)
         .order_by(hosts.c.name, devices.c.device_index))
    with connection(store) as c:
        return [(str(h), int(i)) for h, i in c.execute(q).all()]
