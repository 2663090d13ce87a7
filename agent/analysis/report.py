"""The ``vramscope.analysis/1`` document (docs/architecture.md, "Public contracts"); its
readable rendering is ``report_text.py``.

:func:`document_of` assembles the document from per-device analysis state, per-device
summaries of the samples (:class:`DeviceSummary`) and the alert history, and reads a device's
records again only for its OOM (:class:`OomWitness`, bounded).
:func:`vramscope.agent.alerts.offline.analyze_stream` produces the state by feeding a recording
through the live alert engine a batch at a time. This module reads that
state through :class:`DeviceState` and imports nothing of the alerts package (analysis sits
below alerts). :func:`summaries_document` is the document of records without any such state:
the summaries only, every verdict field left unanswered for a reader of the stored verdicts
(the dashboard's: ``vramscope.agent.store.window_verdicts.attach_window``) to fill.
Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from vramscope.agent.analysis.diagnosis import (
    KV_REFUSAL_EVENTS,
    KV_REFUSAL_WINDOW_S,
    REMEDIES,
    complete_postmortem,
    diagnose,
)
from vramscope.agent.analysis.fragmentation import FragAccumulator
from vramscope.agent.analysis.growth import GROWTH_KEYS
from vramscope.agent.analysis.kv import KvTracker, observe_process
from vramscope.agent.analysis.leaks import LeakDetector, LeakResult
from vramscope.agent.analysis.makeup import leak_makeup
from vramscope.agent.analysis.phases import PhaseAccumulator
from vramscope.agent.analysis.severity import LEVELS
from vramscope.agent.analysis.windows import Windows, windows_json
from vramscope.agent.records import Event, Phase, PostMortem, Sample

FORMAT = "vramscope.analysis/1"
_REPORT_PHASES = ("prefill", "decode", "idle", "setup")
KV_WARNING_RULE = "kv_exhaustion"  # its first firing is a warning of the OOM too


class DeviceState(Protocol):
    """What the document reads of one device's analysis (the alert engine's ``DeviceAnalysis``)."""

    leak: LeakDetector
    kv: KvTracker
    oom_ts_s: list[float]
    first_warning_ts_s: float | None
    max_level: int
    min_time_to_oom_s: float | None


class AlertRecord(Protocol):
    """What the document reads of one alert change (the alert engine's ``AlertChange``)."""

    @property
    def kind(self) -> str: ...

    @property
    def rule(self) -> str: ...

    @property
    def severity(self) -> str: ...

    @property
    def device(self) -> int: ...

    @property
    def ts_s(self) -> float: ...


class DeviceSummary:
    """What the document reads of a device's samples besides the OOM: fed one sample at a
    time, it keeps the fragmentation maxima and the per-phase counts and peaks, not samples."""

    def __init__(self) -> None:
        self.frag = FragAccumulator()
        self.phases = PhaseAccumulator()

    def add(self, s: Sample) -> None:
        self.frag.add(s)
        self.phases.add(s)


class WindowSummary(DeviceSummary):
    """A device's summaries from its records alone, without the alert engine's state: besides
    :class:`DeviceSummary`'s, its KV pools' peaks (a tracker per process, as the engine keeps
    them) and its first OOM (an ``oom`` event, or a rise of a source's ``num_ooms``)."""

    def __init__(self) -> None:
        super().__init__()
        self.kvs: dict[int | None, KvTracker] = {}
        self.kv = KvTracker()  # the pool the document speaks for: chosen as the engine does
        self.first_oom_ts_s: float | None = None
        self._num_ooms: dict[tuple[int | None, str | None], int] = {}  # per (pid, source)

    def add(self, s: Sample) -> None:
        super().add(s)
        if s.kv_blocks_used is not None:
            _, self.kv = observe_process(self.kvs, self.kv, s)
        if s.num_ooms is not None:
            before = self._num_ooms.get((s.pid, s.source))
            if before is not None and s.num_ooms > before:
                self.oom(s.ts_s)
            self._num_ooms[(s.pid, s.source)] = s.num_ooms

    def oom(self, ts_s: float) -> None:
        if self.first_oom_ts_s is None or ts_s < self.first_oom_ts_s:
            self.first_oom_ts_s = ts_s


# The leak evidence :func:`summaries_document` leaves where no verdict was given it
UNANSWERED = "no verdict: this document summarises the records; verdicts come from the store"


def summaries_document(samples: Iterable[Sample], events: Iterable[Event] = (),
                       postmortems: Sequence[PostMortem] = (), device: int | None = None
                       ) -> dict[str, Any]:
    """The document of records (of ``device``, which is in it even without any; else of every
    device they name) from their summaries alone: no alert engine runs. Per device its
    fragmentation, phases and KV peaks, whether and when it had an OOM and, where a
    post-mortem of that OOM is given, its cause (the post-mortem's, or completed from its own
    fields, as the post-mortems page shows it). Every verdict field is left unanswered (leak
    ``insufficient_data`` with :data:`UNANSWERED`, ``max_risk``, ``first_warning_ts``,
    ``min_time_to_oom_s`` and ``leak.windows`` null, no ``processes``, no ``alerts``) for the
    stored verdicts to fill (``vramscope.agent.store.window_verdicts.attach_window``)."""
    summaries: dict[int, WindowSummary] = {} if device is None else {device: WindowSummary()}

    def summary(dev: int) -> WindowSummary | None:
        if device is not None and dev != device:
            return None
        acc = summaries.get(dev)
        if acc is None:
            acc = summaries[dev] = WindowSummary()
        return acc

    for s in samples:
        acc = summary(s.device)
        if acc is not None:
            acc.add(s)
    for e in events:
        acc = summary(e.device) if e.name == "oom" else None
        if acc is not None:
            acc.oom(e.ts_s)
    docs = {}
    for dev in sorted(summaries):
        acc = summaries[dev]
        first, pm = first_oom_of(acc.first_oom_ts_s, [p for p in postmortems if p.device == dev])
        docs[str(dev)] = {
            "leak": {"detected": False, "state": "insufficient_data", "slope_bytes_per_s": 0.0,
                     "first_detected_ts": None, "span_s": 0.0, "evidence": UNANSWERED,
                     "makeup": None, "windows": None, "estimated_floor": False,
                     **dict.fromkeys(GROWTH_KEYS), "orphaned_blocks": 0, "kv_pool": None},
            "oom": {"occurred": first is not None, "first_oom_ts": first,
                    "first_warning_ts": None, "max_risk": None, "min_time_to_oom_s": None,
                    "cause": complete_postmortem(pm).cause if pm is not None else None},
            **_summary_doc(acc, acc.kv), "processes": []}
    return {"format": FORMAT, "devices": docs, "alerts": []}


Replay = Callable[[int, float], Iterable["Sample | Event"]]


def document_of(devices: Mapping[int, DeviceState], summaries: Mapping[int, DeviceSummary],
                history: Iterable[AlertRecord], postmortems: Sequence[PostMortem] = (), *,
                layouts: Sequence[Event] = (), replay: Replay, makeup: bool = False
                ) -> dict[str, Any]:
    """The document from per-device summaries (:class:`DeviceSummary`), without the samples.

    ``replay(device, until_s)``: the device's records up to ``until_s`` in time order again
    (its samples and its ``oom``, request and KV-refusal events, others ignored), read only
    for a device that had an OOM, through an :class:`OomWitness` that keeps what the diagnosis
    reads, bounded."""
    history = list(history)
    kv_warned: dict[int, float] = {}  # the first kv_exhaustion alert of each device
    for ch in history:
        if ch.kind == "fired" and ch.rule == KV_WARNING_RULE:
            kv_warned.setdefault(ch.device, ch.ts_s)
    docs = {str(dev): _device_doc(dev, devices[dev], summaries.get(dev) or DeviceSummary(),
                                  [p for p in postmortems if p.device == dev], replay,
                                  kv_warned.get(dev))
            for dev in sorted(devices)}
    for dev in sorted(devices):
        leak = docs[str(dev)]["leak"]
        if leak["detected"] or makeup:
            leak["makeup"] = leak_makeup(layouts, dev, devices[dev].leak.result.start_ts_s)
    return {"format": FORMAT, "devices": docs, "alerts": _alerts_doc(history)}


def _device_doc(dev: int, d: DeviceState, summary: DeviceSummary,
                postmortems: list[PostMortem], replay: Replay,
                kv_warned_ts: float | None = None) -> dict[str, Any]:
    return {
        "leak": {**_leak_doc(d.leak.result), "windows": windows_json(_windows_of(d))},
        "oom": _oom_doc(dev, d, postmortems, replay, kv_warned_ts),
        **_summary_doc(summary, d.kv),
    }


def _summary_doc(summary: DeviceSummary, kv: KvTracker) -> dict[str, Any]:
    """A device's fragmentation, phases and KV parts (descriptive: no verdict among them)."""
    frag = summary.frag.summary()
    phases = summary.phases.stats()
    return {
        "fragmentation": {"max_inactive_split_ratio": frag.max_inactive_split_ratio,
                          "max_external_fragmentation": frag.max_external_fragmentation},
        "phases": {p: {"samples": phases[p].samples,
                       "peak_allocated_bytes": phases[p].peak_allocated_bytes}
                   for p in _REPORT_PHASES},
        # peak, total and ratio of one pool (the fullest); "pools" counts the pools seen
        "kv": {"peak_blocks_used": kv.peak_blocks_used, "blocks_total": kv.peak_blocks_total,
               "peak_usage_ratio": kv.peak_usage_ratio, "pools": kv.pools},
    }


def _leak_doc(result: LeakResult) -> dict[str, Any]:
    ever = result.first_detected_ts_s is not None
    return {"detected": ever, "state": "leak" if ever else result.state,
            "slope_bytes_per_s": float(result.slope_bytes_per_s),
            "first_detected_ts": result.first_detected_ts_s, "span_s": result.span_s,
            "evidence": result.evidence, "makeup": None,
            "estimated_floor": result.estimated_floor,
            "rate_low_bytes_per_s": result.rate_low_bytes_per_s,
            "rate_high_bytes_per_s": result.rate_high_bytes_per_s,
            "time_to_oom_s": result.time_to_oom_s,
            "time_to_oom_low_s": result.time_to_oom_low_s,
            "time_to_oom_high_s": result.time_to_oom_high_s,
            "orphaned_blocks": result.orphaned_blocks,
            "kv_pool": None if result.kv is None else result.kv.to_json()}


_TRIED = re.compile(r"tried to allocate ([0-9]+(?:\.[0-9]+)?) ?(bytes|B|KiB|MiB|GiB|TiB)\b",
                    re.IGNORECASE)
_UNIT_BYTES = {"bytes": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def failed_from_message(message: Any) -> int | None:
    """The failed allocation of an OOM message: torch's "Tried to allocate 2.00 GiB" (rounded
    as torch prints it) or the hooks' "tried to allocate 1453326336 bytes"; None without one."""
    m = _TRIED.search(message) if isinstance(message, str) else None
    if m is None:
        return None
    size = int(float(m.group(1)) * _UNIT_BYTES[m.group(2).lower()])
    return size if size > 0 else None


def _windows_of(d: DeviceState) -> Windows | None:
    """The reported detector's windows, else any process's (one that has not found a leak
    is not the reported one, but it chose windows all the same)."""
    if d.leak.windows is not None:
        return d.leak.windows
    detectors = getattr(d, "leaks", {}).values()
    return next((x.windows for x in detectors if x.windows is not None), None)


def _oom_doc(dev: int, d: DeviceState, postmortems: list[PostMortem], replay: Replay,
             kv_warned_ts: float | None = None) -> dict[str, Any]:
    """The OOM part of a device's document. The first warning is the risk model's, or the
    ``kv_exhaustion`` alert's when sooner: a pool running out warns of its own OOM."""
    first_oom, pm = first_oom_of(d.oom_ts_s[0] if d.oom_ts_s else None, postmortems)
    cause = None
    if first_oom is not None:
        witness = OomWitness(dev, first_oom, pm.ts_s if pm is not None else first_oom)
        for r in replay(dev, witness.until_s):
            witness.add(r)
        before, facts = witness.facts()
        if pm is not None:  # its own size, phase and requests; the history from the events
            facts = {k: v for k, v in facts.items()
                     if k in ("in_flight_series", "kv_refusals_ts")}
        cause, _ = diagnose(pm, before, ts_s=first_oom, **facts)
        if pm is not None and pm.cause in REMEDIES:  # the agent's, stored with it
            cause = pm.cause
    warned = [t for t in (d.first_warning_ts_s, kv_warned_ts) if t is not None]
    return {"occurred": first_oom is not None, "first_oom_ts": first_oom,
            "first_warning_ts": min(warned) if warned else None,
            "max_risk": LEVELS[d.max_level],
            "min_time_to_oom_s": d.min_time_to_oom_s, "cause": cause}


def first_oom_of(oom_ts_s: float | None, postmortems: Sequence[PostMortem]
                 ) -> tuple[float | None, PostMortem | None]:
    """A device's first OOM (``oom_ts_s``, the first its records showed, else its first
    post-mortem's time) and the post-mortem of it (within 5 s); None and None without one."""
    first = oom_ts_s if oom_ts_s is not None or not postmortems else postmortems[0].ts_s
    if first is None:
        return None, None
    return first, next((p for p in postmortems if abs(p.ts_s - first) <= 5.0), None)


class OomWitness:
    """What :func:`~vramscope.agent.analysis.diagnosis.diagnose` reads of a device's records
    up to its first OOM, kept bounded however long the recording (docs/analysis.md, "Memory").

    Fed the device's records in time order up to :attr:`until_s`, it keeps every sample of the
    last ``TAIL_S`` at full resolution, the earlier ones evenly thinned (all up to
    ``HISTORY_MAX``, then every 2nd, 4th...: what the growth and load checks' quarter medians and
    fit read, exact up to that bound), the first serving sample (the startup check), the requests
    in flight at each kept sample instead of the request events, the KV refusals within
    ``KV_REFUSAL_WINDOW_S`` of the OOM and its first ``oom`` event. ``oom_ts``: the first OOM (the
    request and refusal history is cut there); ``diag_ts``: the diagnosis time (a post-mortem's,
    within 5 s of it), where the samples end."""

    HISTORY_MAX = 200_000
    TAIL_S = 300.0

    def __init__(self, device: int, oom_ts: float, diag_ts: float, *,
                 history_max: int | None = None) -> None:
        self.device = device
        self.oom_ts, self.diag_ts = oom_ts, diag_ts
        self.until_s = max(diag_ts, oom_ts + 5.0)  # the oom event may come up to 5 s late
        self._max = history_max or self.HISTORY_MAX
        self._history: list[tuple[Sample, int]] = []  # (sample, requests in flight then)
        self._tail: list[tuple[Sample, int]] = []
        self._stride, self._skipped = 1, 0
        self._served: tuple[Sample, int] | None = None  # the first prefill/decode sample
        self._open: set[str] = set()  # requests in flight (up to the OOM)
        self._requests = False  # a request event up to the OOM
        self._refusals: list[float] = []
        self._oom: Event | None = None
        self.peak_held = 0  # the most samples held at once (a test reads it)

    def add(self, r: Sample | Event) -> None:
        if r.device != self.device or r.ts_s > self.until_s:
            return
        if isinstance(r, Event):
            self._add_event(r)
        elif r.ts_s <= self.diag_ts:
            self._add_sample(r)

    def _add_event(self, e: Event) -> None:
        if e.name == "oom" and self._oom is None and abs(e.ts_s - self.oom_ts) <= 5.0:
            self._oom = e
        if e.ts_s > self.oom_ts:
            return
        if e.name in KV_REFUSAL_EVENTS and e.ts_s >= self.oom_ts - KV_REFUSAL_WINDOW_S - 5.0:
            self._refusals.append(e.ts_s)
        elif e.request_id is not None and e.name in ("request_start", "request_end"):
            self._requests = True
            if e.name == "request_start":
                self._open.add(e.request_id)
            else:
                self._open.discard(e.request_id)

    def _add_sample(self, s: Sample) -> None:
        kept = (s, len(self._open))
        if self._served is None and s.phase in (Phase.PREFILL, Phase.DECODE):
            self._served = kept
        if s.ts_s >= self.diag_ts - self.TAIL_S:
            self._tail.append(kept)
        elif self._skipped + 1 >= self._stride:
            self._skipped = 0
            self._history.append(kept)
            if len(self._history) >= self._max:  # thin out: every second one, from the first
                self._history = self._history[::2]
                self._stride *= 2
        else:
            self._skipped += 1
        held = len(self._history) + len(self._tail)
        if held > self.peak_held:
            self.peak_held = held

    def facts(self) -> tuple[list[Sample], dict[str, Any]]:
        """``(samples before the OOM, diagnose's keyword facts)``, as the whole recording gives
        them (up to the thinning above)."""
        kept = self._history + self._tail
        serving = (Phase.PREFILL, Phase.DECODE)
        if self._served is not None and not any(s.phase in serving for s, _ in kept):
            kept = sorted([*kept, self._served], key=lambda x: x[0].ts_s)
        before = [s for s, _ in kept]
        out: dict[str, Any] = {}
        oom = self._oom
        if oom is not None:
            failed = (oom.data or {}).get("failed_alloc_bytes")
            if not isinstance(failed, int) or isinstance(failed, bool) or failed <= 0:
                failed = failed_from_message((oom.data or {}).get("message"))
            if failed is not None:
                out["failed_alloc_bytes"] = failed
            if oom.phase is not None:
                out["phase"] = oom.phase
        if self._requests:  # the in-flight steps the diagnosis reads: at each sample, the OOM
            steps = [(s.ts_s, n) for s, n in kept]
            steps.append((self.oom_ts, len(self._open)))
            out["in_flight_series"] = sorted(steps, key=lambda x: x[0])
        out["kv_refusals_ts"] = self._refusals
        return before, out


def _alerts_doc(history: Iterable[AlertRecord]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    open_index: dict[tuple[str, int], int] = {}
    for ch in history:
        key = (ch.rule, ch.device)
        if ch.kind == "fired":
            open_index[key] = len(out)
            out.append({"rule": ch.rule, "severity": ch.severity, "device": ch.device,
                        "fired_ts": ch.ts_s, "resolved_ts": None})
        elif key in open_index:
            out[open_index.pop(key)]["resolved_ts"] = ch.ts_s
    return out
