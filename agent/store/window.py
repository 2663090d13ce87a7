"""Bounded questions about a window, asked before anything is built from it (a private part of
:mod:`vramscope.agent.store.reader`).

``count_at_most(..., N)`` reads an index range of at most N + 1 keys; fetching N + 1 ``Sample``
objects to find out cost a second of CPU for any window over 2.8 hours at 10 Hz.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import ScalarSelect, func, literal, select
from vramscope.agent.durations import MINUTE_S
from vramscope.agent.store import event_blocks
from vramscope.agent.store import sample_blocks as blocks
from vramscope.agent.store.read_once import once
from vramscope.agent.store.schema import devices, events, hosts, samples, seconds

if TYPE_CHECKING:
    from vramscope.agent.store.store import Store


def count_at_most(store: Store, device: int, start_s: float | None, end_s: float | None,
                  limit: int, host: str | None = None) -> int:
    """Samples of device index ``device`` in [start_s, end_s], counted up to ``limit + 1``
    (``limit + 1`` means "more than ``limit``"). Within ``read_once.reading``, once a
    question."""
    return once(("count_at_most", store.engine, device, host or store.host_name, start_s,
                 end_s, limit),
                lambda: _count_at_most(store, device, start_s, end_s, limit, host))


def _count_at_most(store: Store, device: int, start_s: float | None, end_s: float | None,
                   limit: int, host: str | None) -> int:
    did = store.known_device_id(device, host)  # kept by the store: no statement once known
    if did is None:
        return 0
    with store.engine.connect() as c:
        q = select(literal(1)).where(samples.c.device_id == did)
        if start_s is not None:
            q = q.where(samples.c.ts_s >= start_s)
        if end_s is not None:
            q = q.where(samples.c.ts_s <= end_s)
        bounded = q.limit(limit + 1).subquery()
        counted = int(c.execute(select(func.count()).select_from(bounded)).scalar() or 0)
        # the compact raw tier: its blocks' counts, those wholly inside the window as stored,
        # those across an end by their rows
        if counted > limit:
            return limit + 1
        return min(limit + 1, counted + blocks.count_in(c, did, start_s, end_s, limit - counted))


def events_at_most(store: Store, device: int, start_s: float, end_s: float,
                   names: tuple[str, ...], limit: int, host: str | None = None) -> int:
    """Events of device index ``device`` named one of ``names`` in [start_s, end_s], counted up
    to ``limit + 1``: per name a range of the ``(device_id, name, ts_s)`` index of at most
    ``limit + 1`` keys. What a page asks before it reads request markers it would drop past
    ``limit``, so that a busy window's events are not read and built only to be dropped."""
    did = _device_id(store, device, host)
    moved = store.known_device_id(device, host) if event_blocks.compactable(names) else None
    total = 0
    with store.engine.connect() as c:
        for name in dict.fromkeys(names):
            q = (select(literal(1)).where(events.c.device_id == did, events.c.name == name,
                                          events.c.ts_s >= start_s, events.c.ts_s <= end_s)
                 .limit(limit + 1 - total).subquery())
            total += int(c.execute(select(func.count()).select_from(q)).scalar() or 0)
            if total > limit:
                return total
        if moved is not None:  # and those the compact raw tier holds
            total += event_blocks.count_in(c, [moved], start_s, end_s, names)
    return min(total, limit + 1)


def event_groups_at_most(store: Store, device: int, start_s: float, end_s: float,
                         groups: Sequence[tuple[Sequence[str], int]],
                         host: str | None = None) -> list[int]:
    """:func:`events_at_most` of each group (``names``, ``limit``), in one statement: a scalar
    subquery a name, each a range of the ``(device_id, name, ts_s)`` index of at most its
    group's ``limit + 1`` keys (a name's count past that cannot change the group's answer).
    The compact raw tier's events are counted only where a block overlaps the window."""
    did = store.known_device_id(device, host)
    if did is None:
        return [0 for _ in groups]
    counts = [select(func.count()).select_from(
                  select(literal(1)).where(events.c.device_id == did, events.c.name == name,
                                           events.c.ts_s >= start_s, events.c.ts_s <= end_s)
                  .limit(limit + 1).subquery()).scalar_subquery()
              for names, limit in groups for name in dict.fromkeys(names)]
    out = []
    with store.engine.connect() as c:
        found = iter(c.execute(select(*counts)).one() if counts else ())
        blocks_here = event_blocks.any_in_window(c, start_s, end_s)
        for names, limit in groups:
            total = sum(int(next(found)) for _ in dict.fromkeys(names))
            if total <= limit and blocks_here and event_blocks.compactable(names):
                total += event_blocks.count_in(c, [did], start_s, end_s, names)
            out.append(min(total, limit + 1))
    return out


def first_sample_ts(store: Store, device: int, host: str | None = None) -> float | None:
    """The device's first raw sample time: one seek on the ``(device_id, ts_s)`` index.
    Retention deletes raw samples oldest first, so a window that starts before it lives on
    only in the tiers (the per-second tier, the minute rollups). Within
    ``read_once.reading``, read once."""
    return once(first_sample_key(store, device, host),
                lambda: _first_sample_ts(store, device, host))


def first_sample_key(store: Store, device: int, host: str | None) -> tuple[Any, ...]:
    """:func:`first_sample_ts`'s question, as ``read_once`` keeps its answer."""
    return ("first_sample_ts", store.engine, device, host or store.host_name)


def first_sample_columns(did: Any) -> tuple[Any, Any]:
    """The first sample time of device row ``did`` (an id or a scalar subquery) in
    ``samples`` and in the compact raw tier, as two scalar subqueries of one statement
    (:func:`first_of` makes them the answer)."""
    first = (select(samples.c.ts_s).where(samples.c.device_id == did).order_by(samples.c.ts_s)
             .limit(1).scalar_subquery())
    return first, blocks.edge_of(did, False, None)


def first_of(values: Sequence[Any]) -> float | None:
    found = [x for x in values if x is not None]
    return float(min(found)) if found else None


def _first_sample_ts(store: Store, device: int, host: str | None) -> float | None:
    with store.engine.connect() as c:
        return first_of(c.execute(select(
            *first_sample_columns(_device_id(store, device, host)))).one())


def seconds_at_most(store: Store, device: int, start_s: float, end_s: float, limit: int,
                    host: str | None = None) -> int:
    """Seconds the per-second tier holds for device index ``device`` in [start_s, end_s) (every
    source), counted up to ``limit + 1`` from its rows' ``seconds`` column: at most ``limit + 1``
    rows read, each a minute of one source holding at least one second. A minute that straddles
    an end counts whole (an over-count of at most two minutes a source: on the safe side)."""
    q = (select(seconds.c.seconds)
         .where(seconds.c.device_id == _device_id(store, device, host),
                seconds.c.minute_s > start_s - MINUTE_S, seconds.c.minute_s < end_s)
         .limit(limit + 1).subquery())
    with store.engine.connect() as c:
        counted = int(c.execute(select(func.coalesce(func.sum(q.c.seconds), 0))).scalar() or 0)
    return min(counted, limit + 1)


def _device_id(store: Store, device: int, host: str | None) -> ScalarSelect[Any]:
    return (select(devices.c.id).join(hosts, hosts.c.id == devices.c.host_id)
            .where(hosts.c.name == (host or store.host_name), devices.c.device_index == device)
            .scalar_subquery())
