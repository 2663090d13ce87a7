"""The offline driver: a recording through the live alert engine, into the analysis document.

``vramscope analyze`` (and the dashboard's analysis view, and the benchmarks) call
:func:`analyze_records`. It feeds every record, in time order, through the same
:class:`~vramscope.agent.alerts.engine.AlertEngine` the live agent runs, so the leak verdict,
the first warning and the alerts are exactly what the agent would have said at the time; the
document itself is assembled by :mod:`vramscope.agent.analysis.report`. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vramscope.agent.alerts.config_check import attach_to_document
from vramscope.agent.alerts.engine import AlertEngine
from vramscope.agent.analysis.diagnosis import KV_REFUSAL_EVENTS
from vramscope.agent.analysis.merge import merged
from vramscope.agent.analysis.report import analysis_document
from vramscope.agent.records import Event, PostMortem, Sample


def analyze_records(samples: Iterable[Sample], events: Iterable[Event] = (),
                    config: Mapping[str, Any] | None = None, *,
                    postmortems: Sequence[PostMortem] = (),
                    device: int | None = None, makeup: bool = False) -> dict[str, Any]:
    """The ``vramscope.analysis/1`` document of a recording (optionally of one device);
    ``makeup=True`` adds each device's leak make-up even without a leak."""
    records = merged(samples, events)
    if device is not None:
        records = [r for r in records if r.device == device]
    engine = AlertEngine.from_config(config)
    engine.feed(records)
    in_order = [r for r in records if isinstance(r, Sample)]
    # layouts (a leak's make-up); oom, request and KV-refusal events (an OOM's cause: the
    # failed size, the requests in flight over time, a pool that ran out)
    kept = {"memory_layout", "oom", "request_start", "request_end", *KV_REFUSAL_EVENTS}
    context = [r for r in records if isinstance(r, Event) and r.name in kept]
    doc = analysis_document(engine.devices, in_order, engine.history, postmortems,
                            events=context, makeup=makeup)
    attach_to_document(doc, engine.devices)  # the [server] check, when configured
    return doc
