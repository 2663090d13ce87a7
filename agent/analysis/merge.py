"""Samples and events in one time order, cheaply when they already are (the usual case)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from agent.records import Event, Sample


def merged(samples: Iterable[Sample], events: Iterable[Event]) -> list[Sample | Event]:
    """Time order; an event sorts before a sample of the same instant, ties keep input order."""
    s_list = _sorted(list(samples))
    e_list = _sorted(list(events))
    if not e_list:
        return s_list
    if not s_list:
        return e_list
    keyed_e = ((e.ts_s, 0, e) for e in e_list)
    keyed_s = ((s.ts_s, 1, s) for s in s_list)
    return [r for _, _, r in heapq.merge(keyed_e, keyed_s, key=lambda t: (t[0], t[1]))]


def _sorted(records: list) -> list:
    if all(records[i].ts_s <= records[i + 1].ts_s for i in range(len(records) - 1)):
        return records
    return sorted(records, key=lambda r: r.ts_s)  # stable: ties keep input order


def by_device(records: Sequence[Sample | Event]) -> dict[int, list[Sample | Event]]:
    out: dict[int, list[Sample | Event]] = {}
    for r in records:
        out.setdefault(r.device, []).append(r)
    return out
