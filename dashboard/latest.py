"""A device now: each process's newest values, the device's NVML view and their sum, from the
samples of the last ``LATEST_WINDOW_S`` of its span, read for one device
(:func:`latest_values`) or for a fleet at once (``queries.current_rows``, :func:`latest_from`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vramscope.agent.records import SAMPLE_COUNTER_FIELDS, Phase, Sample
from vramscope.agent.store import Store
from vramscope.agent.store.verdicts import process_label

LATEST_WINDOW_S = 30.0  # how far back "current" values are looked for


# Per-process counters that add up to the device's; the rest are not summed (max, or NVML's).
_SUMMED = tuple(f for f in SAMPLE_COUNTER_FIELDS
                if f not in ("largest_free_block_bytes", "device_used_bytes", "device_total_bytes"))


def latest_values(store: Store, device: int, host: str | None,
                  procs: dict[int, dict[str, Any]] | None = None,
                  now_s: float | None = None) -> dict[str, Any] | None:
    """The device now: each process's newest values, the device's NVML view, and the rest.

    Several processes on one device (two models, MPS, ranks sharing a GPU) stay apart
    (docs/architecture.md rule 6): ``processes`` holds each one's newest non-null counters in the
    last ``LATEST_WINDOW_S``, with its own limit (``limit_bytes``: its per-process cap, or the
    device total), name, rank and bounded ``process`` label (``procs``: the processes table's
    rows by pid). The device's counters are the processes' sum; ``device_used_bytes`` and
    ``device_total_bytes`` are NVML's; ``unexplained_bytes`` = NVML used − the processes'
    reserved bytes (other users of the GPU, CUDA contexts, memory outside torch).
    With ``now_s``, samples ahead of it are left out: a wrong clock's row is not "now".
    """
    span = store.time_range(device, host, not_after_s=now_s)
    if span is None:
        return None
    recent = store.samples(device, span[1] - LATEST_WINDOW_S, span[1], host=host)
    return latest_from(span, recent, procs)


def latest_from(span: tuple[float, float] | None, recent: Sequence[Sample],
                procs: dict[int, dict[str, Any]] | None) -> dict[str, Any] | None:
    """:func:`latest_values` of a device from its span (``Store.time_range``'s) and its
    samples of the ``LATEST_WINDOW_S`` up to the span's end (in time order), however read:
    one device's by its own statements, or a fleet's at once (:func:`current_rows`)."""
    if span is None:
        return None
    nvml = _Newest(_NVML_FIELDS, {})
    per_pid: dict[int | None, _Newest] = {}
    sources: dict[str, float] = {}
    for s in reversed(recent):  # newest first
        sources.setdefault(s.source or "unknown", s.ts_s)
        if s.source == "nvml":
            nvml.take(s)
        else:
            mine = per_pid.get(s.pid)
            if mine is None:
                mine = per_pid[s.pid] = _Newest(_FIELD_PLACES,
                                                {"pid": s.pid, "last_ts_s": s.ts_s})
            mine.take(s)
    processes = [_process_entry(p, (procs or {}).get(p["pid"]))
                 for p in sorted((n.into for n in per_pid.values()),
                                 key=lambda p: -p["last_ts_s"])]
    return _device_entry(span, sources, nvml.into, processes)


# each field's place in a Sample: read by index, a fleet's newest 30 s are 30,000 samples
_FIELD_PLACES = tuple((name, Sample._fields.index(name)) for name in SAMPLE_COUNTER_FIELDS)
_NVML_FIELDS = tuple((name, Sample._fields.index(name))
                     for name in ("device_used_bytes", "device_total_bytes"))


class _Newest:
    """The newest non-null value of each field over samples given newest first, with the
    moment of each (``into["at"]``: they may differ) and the newest known phase: only the
    fields still without a value are looked at, so a device's older samples cost little."""

    def __init__(self, fields: tuple[tuple[str, int], ...], into: dict[str, Any]) -> None:
        self.into = into
        self.pending = fields
        for name, _ in fields:
            into[name] = None

    def take(self, s: Sample) -> None:
        into = self.into
        if self.pending:
            still = []
            for item in self.pending:
                value = s[item[1]]
                if value is None:
                    still.append(item)
                else:
                    into[item[0]] = value
                    into.setdefault("at", {})[item[0]] = s.ts_s
            self.pending = tuple(still)
        if into.get("phase") is None and s.phase is not Phase.UNKNOWN:
            into["phase"] = s.phase.value


def _process_entry(p: dict[str, Any], row: dict[str, Any] | None) -> dict[str, Any]:
    out = {name: p.get(name) for name in SAMPLE_COUNTER_FIELDS}
    out.update(pid=p["pid"], last_ts_s=p["last_ts_s"], phase=p.get("phase"),
               limit_bytes=p.get("device_total_bytes"),
               name=(row or {}).get("name"), rank=(row or {}).get("rank"),
               process=process_label(row), at=p.get("at", {}))
    return out


def _device_entry(span: tuple[float, float], sources: dict[str, float], nvml: dict[str, Any],
                  processes: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"last_ts_s": span[1], "first_ts_s": span[0], "sources": sources,
                           "phase": next((p["phase"] for p in processes if p["phase"]), None),
                           "pid": processes[0]["pid"] if processes else None,
                           "pids": {p["pid"]: p["last_ts_s"] for p in processes
                                    if p["pid"] is not None},
                           "processes": processes}
    for name in _SUMMED:
        values = [p[name] for p in processes if p[name] is not None]
        out[name] = sum(values) if values else None
    out["largest_free_block_bytes"] = max(
        (p["largest_free_block_bytes"] for p in processes
         if p["largest_free_block_bytes"] is not None), default=None)
    limits = [p["limit_bytes"] for p in processes if p["limit_bytes"]]
    # NVML's used; without NVML, what a wide sample said (a simulator, a trace)
    out["device_used_bytes"] = nvml.get("device_used_bytes") or max(
        (p["device_used_bytes"] for p in processes if p["device_used_bytes"] is not None),
        default=None)
    # NVML's total; without NVML, the processes' limit (the single-process reading of old)
    out["device_total_bytes"] = nvml.get("device_total_bytes") or max(limits, default=None)
    # when each shown value was sampled (the newest non-null one of each may be older than the
    # newest sample): the Overview says so where device used and reserved differ in time
    nvml_at = nvml.get("at", {})
    out["moments"] = {name: nvml_at.get(name) or max(
        (p["at"][name] for p in processes if name in p["at"]), default=None)
        for name in ("allocated_bytes", "reserved_bytes", "device_used_bytes")}
    used, reserved = out["device_used_bytes"], out["reserved_bytes"]
    out["unexplained_bytes"] = None if used is None else max(0, used - (reserved or 0))
    return out
