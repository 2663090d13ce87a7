"""The offline driver: a recording through the live alert engine, into the analysis document.

:func:`analyze_records` (or :func:`analyze_stream` for records read lazily) feeds every record,
in time order, through the engine the live agent runs, so the verdict, the first warning and the
alerts are what the agent would have said; :mod:`vramscope.agent.analysis.report` assembles the
document. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from vramscope.agent.alerts.config_check import attach_to_document
from vramscope.agent.alerts.engine import AlertChange, AlertEngine
from vramscope.agent.alerts.verdicts import Verdict, processes_of
from vramscope.agent.analysis.makeup import LAYOUT_EVENT
from vramscope.agent.analysis.merge import Batch, merged, record_batches
from vramscope.agent.analysis.report import DeviceSummary, document_of
from vramscope.agent.event_kinds import Role, names_with
from vramscope.agent.records import Event, PostMortem, Sample

# oom, request and KV-refusal events: an OOM's cause (the failed size, the requests in flight
# over time, a pool that ran out)
OOM_CONTEXT = frozenset(names_with(Role.OOM) + names_with(Role.REQUEST)
                        + names_with(Role.KV_REFUSAL))
CHUNK = 4096  # samples (or records) handed to the engine at a time, then dropped

Reopen = Callable[[int, float], Iterable["Sample | Event"]]


def analyze_records(samples: Iterable[Sample], events: Iterable[Event] = (),
                    config: Mapping[str, Any] | None = None, *,
                    postmortems: Sequence[PostMortem] = (),
                    device: int | None = None, makeup: bool = False) -> dict[str, Any]:
    """The ``vramscope.analysis/1`` document of a recording (optionally of one device);
    ``makeup=True`` adds each device's leak make-up even without a leak."""
    records = merged(samples, events)
    if device is not None:
        records = [r for r in records if r.device == device]

    def reopen(dev: int, until_s: float) -> Iterable[Sample | Event]:
        return (r for r in records if r.device == dev and r.ts_s <= until_s)

    return analyze_stream(record_batches(records, CHUNK), reopen, config,
                          postmortems=postmortems, makeup=makeup)


def analyze_stream(batches: Iterable[Batch], reopen: Reopen,
                   config: Mapping[str, Any] | None = None, *,
                   postmortems: Sequence[PostMortem] = (), makeup: bool = False
                   ) -> dict[str, Any]:
    """:func:`analyze_records` of a recording in consecutive batches of samples and events (each
    batch, merged, follows the one before in time order:
    :func:`~vramscope.agent.analysis.merge.time_batches`), read once and not kept: memory is
    bounded by a batch and the engine's state, not by the recording. ``reopen(device,
    until_s)`` gives a device's records up to ``until_s`` again, in time order; it is read only
    for a device that had an OOM, up to it, for the diagnosis
    (:class:`~vramscope.agent.analysis.report.OomWitness`)."""
    engine = AlertEngine.from_config(config)
    summaries: dict[int, DeviceSummary] = {}
    layouts: list[Event] = []  # a leak's make-up (few: taken at idle points)
    # every change, taken batch by batch: the engine's own history keeps only the newest
    # HISTORY_MAX (the live agent's bound), and the document lists every alert of the recording
    changes: list[AlertChange] = []
    for samples, events in batches:
        for s in samples:
            acc = summaries.get(s.device)
            if acc is None:
                acc = summaries[s.device] = DeviceSummary()
            acc.add(s)
        layouts += [e for e in events if e.name == LAYOUT_EVENT]
        changes += engine.feed_batch(samples, events)  # merges the batch: events first on a tie

    def replay(dev: int, until_s: float) -> Iterator[Sample | Event]:
        for r in reopen(dev, until_s):
            if type(r) is not Event or r.name in OOM_CONTEXT:
                yield r

    doc = document_of(engine.devices, summaries, changes, postmortems,
                      layouts=layouts, replay=replay, makeup=makeup)
    attach_to_document(doc, engine.devices)  # the [server] check, when configured
    attach_verdicts(doc, [v for v in engine.verdicts.latest.values()
                          if v.pid in processes_of(engine.devices[v.device])])
    return doc


def attach_verdicts(doc: dict[str, Any], verdicts: Iterable[Verdict]) -> None:
    """Each device's per-process verdicts (``processes``: the newest row of each process the
    engine still follows, as the store keeps them) into the document; every surface shows
    these rows, so the slopes and first detections printed here are the pages'."""
    by_device: dict[str, list[dict[str, Any]]] = {}
    for v in sorted(verdicts, key=lambda v: (v.device, v.pid is not None, v.pid or 0)):
        by_device.setdefault(str(v.device), []).append(v.to_json())
    for dev, d in doc["devices"].items():
        d["processes"] = by_device.get(dev, [])
