"""The ``vramscope.analysis/1`` document (docs/architecture.md, "Public contracts") and its
readable rendering.

:func:`analysis_document` assembles the document from per-device analysis state and the alert
history; :func:`vramscope.agent.alerts.offline.analyze_records` produces both by feeding a
recording through the live alert engine. This module reads that state through
:class:`DeviceState` and imports nothing of the alerts package (analysis sits below alerts).
Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from vramscope.agent.analysis.diagnosis import KV_REFUSAL_EVENTS, REMEDIES, diagnose
from vramscope.agent.analysis.fragmentation import fragmentation_summary
from vramscope.agent.analysis.kv import KvTracker
from vramscope.agent.analysis.leaks import LeakDetector, LeakResult
from vramscope.agent.analysis.makeup import LAYOUT_EVENT, leak_makeup
from vramscope.agent.analysis.phases import phase_stats
from vramscope.agent.analysis.risk import LEVELS
from vramscope.agent.analysis.windows import Windows
from vramscope.agent.records import Event, PostMortem, Sample
from vramscope.agent.timefmt import iso_utc

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


def analysis_document(devices: Mapping[int, DeviceState], samples: Iterable[Sample],
                      history: Iterable[AlertRecord],
                      postmortems: Sequence[PostMortem] = (), *,
                      events: Iterable[Event] = (), makeup: bool = False) -> dict[str, Any]:
    """The document of ``devices`` (their samples in time order, any device) and the alerts.

    ``events``: the recording's ``memory_layout`` events, from which a detected leak's
    make-up is computed (``makeup=True`` computes it without a leak too), and its ``oom`` and
    request events, from which an OOM without a post-mortem is diagnosed (the failed size and
    phase the ``oom`` event carries, the requests in flight); others are ignored.
    """
    per_device: dict[int, list[Sample]] = {}
    for s in samples:
        per_device.setdefault(s.device, []).append(s)
    events = list(events)
    layouts = [e for e in events if e.name == LAYOUT_EVENT]
    context = [e for e in events if e.name in _OOM_CONTEXT]
    history = list(history)
    kv_warned: dict[int, float] = {}  # the first kv_exhaustion alert of each device
    for ch in history:
        if ch.kind == "fired" and ch.rule == KV_WARNING_RULE:
            kv_warned.setdefault(ch.device, ch.ts_s)
    docs = {str(dev): _device_doc(devices[dev], per_device.get(dev, []),
                                  [p for p in postmortems if p.device == dev], context,
                                  kv_warned.get(dev))
            for dev in sorted(devices)}
    for dev in sorted(devices):
        leak = docs[str(dev)]["leak"]
        if leak["detected"] or makeup:
            leak["makeup"] = leak_makeup(layouts, dev, devices[dev].leak.result.start_ts_s)
    return {"format": FORMAT, "devices": docs, "alerts": _alerts_doc(history)}


def _device_doc(d: DeviceState, samples: list[Sample], postmortems: list[PostMortem],
                context: Sequence[Event] = (), kv_warned_ts: float | None = None
                ) -> dict[str, Any]:
    frag = fragmentation_summary(samples)
    phases = phase_stats(samples)
    return {
        "leak": {**_leak_doc(d.leak.result), "windows": _windows_doc(_windows_of(d))},
        "oom": _oom_doc(d, samples, postmortems, context, kv_warned_ts),
        "fragmentation": {"max_inactive_split_ratio": frag.max_inactive_split_ratio,
                          "max_external_fragmentation": frag.max_external_fragmentation},
        "phases": {p: {"samples": phases[p].samples,
                       "peak_allocated_bytes": phases[p].peak_allocated_bytes}
                   for p in _REPORT_PHASES},
        # peak, total and ratio of one pool (the fullest); "pools" counts the pools seen
        "kv": {"peak_blocks_used": d.kv.peak_blocks_used, "blocks_total": d.kv.peak_blocks_total,
               "peak_usage_ratio": d.kv.peak_usage_ratio, "pools": d.kv.pools},
    }


def _leak_doc(result: LeakResult) -> dict[str, Any]:
    ever = result.first_detected_ts_s is not None
    return {"detected": ever, "slope_bytes_per_s": float(result.slope_bytes_per_s),
            "first_detected_ts": result.first_detected_ts_s, "evidence": result.evidence,
            "makeup": None}


_OOM_CONTEXT = frozenset({"oom", "request_start", "request_end"}) | KV_REFUSAL_EVENTS


def _oom_facts(context: Sequence[Event], oom_ts: float,
               samples: Sequence[Sample]) -> dict[str, Any]:
    """What a live post-mortem would have said, from the recording's events: the failed
    allocation (``failed_alloc_bytes``, else read from its message) and phase of the ``oom``
    event at the OOM; and what only the recording knows:
    the requests in flight over time (the load check, the load-aware floor) and the KV pool's
    refusals. Offline analysis then names the cause from the same facts as the live agent."""
    device = samples[0].device if samples else 0
    out: dict[str, Any] = {}
    oom = next((e for e in context if e.name == "oom" and e.device == device
                and abs(e.ts_s - oom_ts) <= 5.0), None)
    if oom is not None:
        failed = (oom.data or {}).get("failed_alloc_bytes")
        if not isinstance(failed, int) or isinstance(failed, bool) or failed <= 0:
            failed = failed_from_message((oom.data or {}).get("message"))
        if failed is not None:
            out["failed_alloc_bytes"] = failed
        if oom.phase is not None:
            out["phase"] = oom.phase
    series = _in_flight_series(context, device, oom_ts)
    if series:
        out["in_flight_series"] = series
    out["kv_refusals_ts"] = [e.ts_s for e in context if e.name in KV_REFUSAL_EVENTS
                             and e.device == device and e.ts_s <= oom_ts]
    return out


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


def _in_flight_series(context: Sequence[Event], device: int,
                      oom_ts: float) -> list[tuple[float, int]]:
    """``(ts_s, requests in flight from then on)`` at every request event up to the OOM."""
    open_ids: set[str] = set()
    series: list[tuple[float, int]] = []
    for e in context:
        if e.ts_s > oom_ts or e.request_id is None or e.device != device:
            continue
        if e.name == "request_start":
            open_ids.add(e.request_id)
        elif e.name == "request_end":
            open_ids.discard(e.request_id)
        else:
            continue
        series.append((e.ts_s, len(open_ids)))
    return series


def _windows_of(d: DeviceState) -> Windows | None:
    """The reported detector's windows, else any process's (one that has not found a leak
    is not the reported one, but it chose windows all the same)."""
    if d.leak.windows is not None:
        return d.leak.windows
    detectors = getattr(d, "leaks", {}).values()
    return next((x.windows for x in detectors if x.windows is not None), None)


def _windows_doc(w: Windows | None) -> dict[str, Any] | None:
    """The windows the analysis chose from the data (None: too few records to choose)."""
    if w is None:
        return None
    return {"floor_s": w.floor_s, "trend_s": w.trend_s, "warmup_s": w.warmup_s,
            "sample_interval_s": w.dt_s, "cycle_s": w.cycle_s, "cycle_from": w.cycle_from}


def _oom_doc(d: DeviceState, samples: list[Sample], postmortems: list[PostMortem],
             context: Sequence[Event] = (), kv_warned_ts: float | None = None
             ) -> dict[str, Any]:
    """The OOM part of a device's document. The first warning is the risk model's, or the
    ``kv_exhaustion`` alert's when sooner: a pool running out warns of its own OOM."""
    first_oom = d.oom_ts_s[0] if d.oom_ts_s else None
    if first_oom is None and postmortems:
        first_oom = postmortems[0].ts_s
    cause = None
    if first_oom is not None:
        pm = next((p for p in postmortems if abs(p.ts_s - first_oom) <= 5.0), None)
        facts = _oom_facts(context, first_oom, samples)
        if pm is not None:  # its own size, phase and requests; the history from the events
            facts = {k: v for k, v in facts.items()
                     if k in ("in_flight_series", "kv_refusals_ts")}
        cause, _ = diagnose(pm, samples, ts_s=first_oom, **facts)
    warned = [t for t in (d.first_warning_ts_s, kv_warned_ts) if t is not None]
    return {"occurred": first_oom is not None, "first_oom_ts": first_oom,
            "first_warning_ts": min(warned) if warned else None,
            "max_risk": LEVELS[d.max_level],
            "min_time_to_oom_s": d.min_time_to_oom_s, "cause": cause}


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


# --- readable report -------------------------------------------------------------------------
def render_text(doc: Mapping[str, Any]) -> str:
    """The analysis document as text for a terminal (MiB/GiB and ISO 8601 UTC times only
    here; the JSON document keeps bytes and Unix seconds)."""
    lines = []
    for dev, d in doc["devices"].items():
        lines += [f"device {dev}", *_leak_lines(d["leak"]), *_makeup_lines(d["leak"]),
                  *_oom_lines(d["oom"]),
                  *_frag_lines(d["fragmentation"]), *_phase_lines(d["phases"]),
                  *_kv_lines(d["kv"]), ""]
    lines.append(f"alerts: {len(doc['alerts'])}")
    for a in doc["alerts"]:
        resolved = ("still firing" if a["resolved_ts"] is None
                    else f"resolved {iso_utc(a['resolved_ts'])}")
        lines.append(f"  {a['severity']:8} {a['rule']:20} device {a['device']} "
                     f"fired {iso_utc(a['fired_ts'])}, {resolved}")
    return "\n".join(lines) + "\n"


def _gib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def _leak_lines(leak: Mapping[str, Any]) -> list[str]:
    if not leak["detected"]:
        return [f"  leak: none ({leak['evidence']})"]
    rate = leak["slope_bytes_per_s"] * 3600 / 2**20
    return [f"  leak: DETECTED at {iso_utc(leak['first_detected_ts'])}, {rate:.1f} MiB/h",
            f"        {leak['evidence']}"]


def _makeup_lines(leak: Mapping[str, Any]) -> list[str]:
    """The make-up table: what the growth between two idle points is made of."""
    m = leak.get("makeup")
    if m is None:
        return ["  make-up: no two idle-point layouts to compare (memory_layout events)"] \
            if leak["detected"] else []
    lines = [f"  make-up: {m['summary']}"]
    for kind in ("blocks", "segments"):
        for r in m[kind][:8]:
            where = f"  phase {r['phase']}" if r["phase"] else ""
            lines.append(f"    {r['bytes'] / 2**20:>10.1f} MiB  {r['description']}{where}")
            lines += [f"{'':20}at {frame}" for frame in r["stack"][:4]]
    if m["diagnosis"]:
        lines += [f"  diagnosis: {m['diagnosis']}", f"    - {m['remedy']}"]
    if m["incomplete"]:
        lines.append("    (a layout left small groups out: the rows may miss some)")
    return lines


def _oom_lines(oom: Mapping[str, Any]) -> list[str]:
    tto = oom["min_time_to_oom_s"]
    warn = oom["first_warning_ts"]
    out = [f"  OOM risk: max {oom['max_risk']}"
           + ("" if warn is None else f", first warning {iso_utc(warn)}")
           + ("" if tto is None else f", shortest forecast time to OOM {tto:.0f} s")]
    if oom["occurred"]:
        lead = "" if warn is None or warn > oom["first_oom_ts"] \
            else f" (warned {oom['first_oom_ts'] - warn:.0f} s before)"
        out.append(f"  OOM at {iso_utc(oom['first_oom_ts'])}{lead}; likely cause: "
                   f"{oom['cause']}")
        out += [f"    - {r}" for r in REMEDIES[oom["cause"]]]
    return out


def _frag_lines(frag: Mapping[str, Any]) -> list[str]:
    ext = frag["max_external_fragmentation"]
    lines = [f"  fragmentation: max inactive split {frag['max_inactive_split_ratio']:.1%}, "
             f"max external {'n/a' if ext is None else f'{ext:.1%}'}"]
    if ext is not None:  # a high share alone is common and harmless: say what would matter
        lines.append("    (external: the share of cached free memory outside the largest free "
                     "block; a risk only when the largest request fits neither that block nor "
                     "new memory, which the OOM-risk line above includes)")
    return lines


def _phase_lines(phases: Mapping[str, Any]) -> list[str]:
    return [f"  {p:8} {v['samples']:>9} samples, peak allocated {_gib(v['peak_allocated_bytes'])}"
            for p, v in phases.items()]


def _kv_lines(kv: Mapping[str, Any]) -> list[str]:
    if kv["blocks_total"] is None:
        return ["  KV pool: not observed"]
    pools = kv.get("pools") or 1
    which = "" if pools == 1 else f" (the fullest of {pools} pools)"
    return [f"  KV pool: peak {kv['peak_blocks_used']} of {kv['blocks_total']} blocks "
            f"({kv['peak_usage_ratio']:.1%}){which}"]
