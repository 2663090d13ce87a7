"""Samples and events in one time order, cheaply when they already are (the usual case)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter

from vramscope.agent.records import Event, Sample

_TS = attrgetter("ts_s")


def merged(samples: Iterable[Sample], events: Iterable[Event]) -> list[Sample | Event]:
    """Time order; an event sorts before a sample of the same instant, ties keep input order.

    Events first, then a stable sort on time: Timsort merges the two sorted runs in linear time.
    """
    records: list[Sample | Event] = list(events)
    records.extend(samples)
    records.sort(key=_TS)
    return records


def by_device(records: Sequence[Sample | Event]) -> dict[int, list[Sample | Event]]:
    out: dict[int, list[Sample | Event]] = {}
    for r in records:
        out.setdefault(r.device, []).append(r)
    return out
