"""Samples and events in one time order, cheaply when they already are (the usual case); and the
split of a device's records into per-process series (docs/architecture.md rule 6)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from operator import attrgetter
from typing import Generic, TypeVar, cast

from vramscope.agent.records import Event, Sample

_TS = attrgetter("ts_s")
SeriesKey = tuple[int, "int | None"]  # (device, pid); pid None: the device as a whole
S = TypeVar("S")


def merged(samples: Iterable[Sample], events: Iterable[Event]) -> list[Sample | Event]:
    """Time order; an event sorts before a sample of the same instant, ties keep input order.

    Events first, then a stable sort on time: Timsort merges the two sorted runs in linear time.
    """
    records: list[Sample | Event] = list(events)
    records.extend(samples)
    records.sort(key=_TS)
    return records


def iter_merged(samples: Iterable[Sample], events: Iterable[Event]
                ) -> Iterator[Sample | Event]:
    """:func:`merged` lazily, for inputs each already in time order (a store's queries): one
    record of each in memory at a time. The same order: ``heapq.merge`` takes the earlier
    iterable first on a tie, so an event comes before a sample of the same instant."""
    return heapq.merge(events, samples, key=_TS)


Batch = tuple[list[Sample], list[Event]]


def time_batches(samples: Iterable[Sample], events: Iterable[Event], size: int
                 ) -> Iterator[Batch]:
    """Samples and events (each in time order) cut into consecutive batches of ``size`` samples
    and the events up to the batch's last sample: each batch :func:`merged` follows the one
    before it in the order of the whole, so a consumer that merges each batch (the engine's
    ``feed_batch``) sees the order of the whole recording, one batch in memory at a time
    (and no merge here: the events are few, the samples only counted)."""
    s_it, e_it = iter(samples), iter(events)
    pending = next(e_it, None)
    while chunk := list(islice(s_it, size)):
        last, evs = chunk[-1].ts_s, []
        while pending is not None and pending.ts_s <= last:  # a tie: the event goes first
            evs.append(pending)
            pending = next(e_it, None)
        yield chunk, evs
    while pending is not None:  # events after the last sample, a batch at a time
        evs = [pending, *islice(e_it, size - 1)]
        pending = next(e_it, None)
        yield [], evs


class OutOfOrder(Exception):
    """A recording is further out of time order than :func:`in_time_order` holds back for."""


# (ts_s, 0 for an event / 1 for a sample, source index, seq, record): the order merged() gives,
# events first on a tie and each kind in input order; seq is unique, so records never compare
Keyed = tuple[float, int, int, int, "Sample | Event"]


def in_time_order(chunks: Iterable[Batch], slack_s: float, source: int = 0,
                  name: str = "the recording") -> Iterator[Keyed]:
    """The records of ``chunks`` (one recording's ``(samples, events)`` in the order it was
    written: ``trace.iter_trace``) in :func:`merged`'s order, holding back only the records
    within ``slack_s`` of the newest seen: a recording written in time order give or take
    ``slack_s`` (threads that write a little late) is sorted in bounded memory. Raises
    :class:`OutOfOrder` at a record that belongs before one already given out."""
    heap: list[Keyed] = []
    seq, newest = 0, -math.inf
    out = (-math.inf, 0)  # (ts_s, kind) of the last record given out
    for samples, events in chunks:
        for kind, records in ((0, events), (1, samples)):
            for r in records:
                ts = r.ts_s
                if (ts, kind) < out:
                    raise OutOfOrder(f"{name}: a record at {ts:.3f} s comes after one at "
                                     f"{out[0]:.3f} s, more than {slack_s:g} s out of time "
                                     f"order")
                heapq.heappush(heap, (ts, kind, source, seq, r))
                seq += 1
                if ts > newest:
                    newest = ts
        while heap and heap[0][0] < newest - slack_s:
            item = heapq.heappop(heap)
            out = (item[0], item[1])
            yield item
    while heap:
        yield heapq.heappop(heap)


def record_batches(records: Iterable[Sample | Event], size: int) -> Iterator[Batch]:
    """Records in :func:`merged`'s order cut into consecutive ``(samples, events)`` batches of
    ``size`` records: merged again (as the engine's ``feed_batch`` does), each gives back its
    own order, which is the whole's."""
    it = iter(records)
    while chunk := list(islice(it, size)):
        # type(r) is faster than isinstance, and mypy cannot narrow it: hence the casts
        yield (cast("list[Sample]", [r for r in chunk if type(r) is not Event]),
               cast("list[Event]", [r for r in chunk if type(r) is Event]))


def by_device(records: Sequence[Sample | Event]) -> dict[int, list[Sample | Event]]:
    out: dict[int, list[Sample | Event]] = {}
    for r in records:
        out.setdefault(r.device, []).append(r)
    return out


def is_device_wide(r: Sample | Event) -> bool:
    """A reading of the whole device (NVML: used and total, all processes), not of one process.

    Such a sample belongs to every process series of its device: a process's risk needs what
    the others use. Anything with a pid, or with allocator or KV counters, is one process's.
    """
    return (isinstance(r, Sample) and r.pid is None and r.allocated_bytes is None
            and r.reserved_bytes is None and r.kv_blocks_used is None
            and (r.device_used_bytes is not None or r.source == "nvml"))


class SeriesSplit(Generic[S]):
    """Routes records, in time order, to one state per ``(device, pid)`` series.

    A process's record goes to its own series, opened on first sight (``make()``) and primed
    with the device's latest device-wide sample; a device-wide sample goes to every process
    series of its device, or to the device's own ``(device, None)`` series while the device has
    no process series yet (an NVML-only recording). Events without a pid go to every series of
    their device.
    """

    def __init__(self, make: Callable[[], S]) -> None:
        self._make = make
        self.series: dict[SeriesKey, S] = {}
        self._procs: dict[int, list[SeriesKey]] = {}  # device -> its process series
        self._wide: dict[int, Sample] = {}  # device -> latest device-wide sample

    def route(self, r: Sample | Event) -> list[tuple[SeriesKey, S, bool]]:
        """The series ``r`` belongs to, as ``(key, state, fresh)``: ``fresh`` when just opened
        (feed it ``primer(key)`` first)."""
        device = r.device
        if is_device_wide(r) or (isinstance(r, Event) and r.pid is None):
            if isinstance(r, Sample):
                self._wide[device] = r
            keys = self._procs.get(device) or [(device, None)]
            return [self._get(k) for k in keys]
        return [self._get((device, r.pid))]

    def primer(self, key: SeriesKey) -> Sample | None:
        """The device-wide sample a freshly opened process series starts from."""
        return self._wide.get(key[0]) if key[1] is not None else None

    def _get(self, key: SeriesKey) -> tuple[SeriesKey, S, bool]:
        state = self.series.get(key)
        if state is not None:
            return key, state, False
        state = self.series[key] = self._make()
        if key[1] is not None:
            self._procs.setdefault(key[0], []).append(key)
        return key, state, True


def by_series(records: Iterable[Sample | Event]) -> dict[SeriesKey, list[Sample | Event]]:
    """Records (in time order) split per ``(device, pid)``, as :class:`SeriesSplit` routes them:
    each process's series holds its own records plus its device's device-wide ones."""
    split: SeriesSplit[list[Sample | Event]] = SeriesSplit(list)
    for r in records:
        for key, out, fresh in split.route(r):
            primer = split.primer(key) if fresh else None
            if primer is not None and primer is not r:
                out.append(primer)
            out.append(r)
    return split.series
