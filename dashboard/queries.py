"""What the pages and the API read, composed from ``agent``'s store queries.

The only module of the dashboard that calls the store. Long ranges are always downsampled in
SQL (:meth:`vramscope.agent.store.Store.timeline`); raw samples are read only for short, bounded
windows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vramscope.agent.config import Config
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS, Event, Phase, PostMortem, Sample
from vramscope.agent.store import Store
from vramscope.agent.store.reader import (
    SECONDS_READ_MAX_S,
    aligned_grid,
    device_row_id,
    downsample,
    events_at_most,
    first_sample_ts,
    phase_changes,
    phase_counts,
    process_window,
    raw_rows_over,
    request_rate,
    seconds_end,
)
from vramscope.agent.store.schema import ROLLUP_TIER_S
from vramscope.agent.store.seconds import PhaseSeconds
from vramscope.agent.store.verdicts import process_label
from vramscope.dashboard import servers
from vramscope.dashboard import timeline as tl
from vramscope.dashboard.alert_text import metrics_by_rule, value_text
from vramscope.dashboard.verdict import (
    connected_count,
    device_verdict,
    freshness,
    process_state,
)

LATEST_WINDOW_S = 30.0  # how far back "current" values are looked for
PHASE_SAMPLE_LIMIT = 20_000  # phase changes read for phase bands when there are no phase events
PHASE_SAMPLE_SPAN_S = 900.0  # ...and only in windows this short (10 Hz x 3 sources = 27k)
SHARE_BUCKETS = 240  # phase shares per bucket beyond that: one lane, a bar per ~4 pixels
# ...counted over raw samples only up to this span, past which counting them would cost as
# much as the timeline itself; longer windows read rollups, which carry no phase
PHASE_SHARE_SPAN_S = 6 * 3600.0
# Capacity's measured peaks cover each device's newest day: over everything stored they would
# read a week of minute rollups per device, a cost growing with the retention
PEAKS_WINDOW_S = 86_400.0
NAMED_EVENT_LIMIT = 50_000  # phase and rare events one timeline reads
SEVERITY_ORDER = {"ok": 0, "info": 0, "warning": 1, "critical": 2}


def host_or_none(store: Store, host: str | None) -> str | None:
    return None if host in (None, "", store.host_name) else host


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
    nvml: dict[str, Any] = {}
    per_pid: dict[int | None, dict[str, Any]] = {}
    sources: dict[str, float] = {}
    for s in reversed(recent):  # newest first
        sources.setdefault(s.source or "unknown", s.ts_s)
        if s.source == "nvml":
            _newest(nvml, s, ("device_used_bytes", "device_total_bytes"))
        else:
            _newest(per_pid.setdefault(s.pid, {"pid": s.pid, "last_ts_s": s.ts_s}), s,
                    SAMPLE_COUNTER_FIELDS)
    processes = [_process_entry(p, (procs or {}).get(p["pid"]))
                 for p in sorted(per_pid.values(), key=lambda p: -p["last_ts_s"])]
    return _device_entry(span, sources, nvml, processes)


def _newest(into: dict[str, Any], s: Sample, fields: Sequence[str]) -> None:
    for name in fields:
        if into.get(name) is None:
            into[name] = getattr(s, name)
            if into[name] is not None:  # the moment of each value: they may differ
                into.setdefault("at", {})[name] = s.ts_s
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


def device_rows(store: Store, config: Config, now_s: float) -> list[dict[str, Any]]:
    """One row per device of every host, riskiest first: current values, the alert engine's
    verdict (:mod:`vramscope.dashboard.verdict`) and whether the device's data is stale."""
    active = store.alerts(active_only=True, host="*")
    procs: dict[str, dict[int, dict[str, Any]]] = {}
    for p in store.processes(host="*"):
        procs.setdefault(p["host"], {})[p["pid"]] = p
    rows = []
    reports: dict[str, dict[str, Any] | None] = {}  # host -> its newest agent report
    for d in store.devices(host="*"):
        host = host_or_none(store, d["host"])
        latest = latest_values(store, d["device_index"], host, procs.get(d["host"]), now_s)
        if d["device_index"] < 0 and latest is None:
            continue  # a retired label (NVML renumbered the GPUs) with nothing recent
        mine = [a for a in active if a["host"] == d["host"] and a["device"] == d["device_index"]]
        verdict = device_verdict(mine)
        report = reports.setdefault(d["host"], store.latest_agent_stats(host))
        writers = connected_count((latest or {}).get("pids") or {}, procs.get(d["host"], {}),
                                  now_s, config)
        fresh = freshness(latest["last_ts_s"] if latest else None, now_s, config, report,
                          writers=writers)
        rows.append({"host": d["host"], "device": d["device_index"], "name": d["name"],
                     "uuid": d["uuid"], "parent_uuid": d.get("parent_uuid"),
                     "physical_index": d.get("physical_index"),
                     "total_bytes": d["total_bytes"],
                     "risk": verdict["level"], "verdict": verdict,
                     "verdicts": process_verdicts(store, d["device_index"], host, now_s),
                     "active_alerts": len(mine), "latest": latest,
                     "last_sample_age_s": fresh["age_s"], "stale": fresh["stale"],
                     "freshness": fresh["state"],
                     **servers.kv_and_requests(store, d["device_index"], host, latest, now_s)})
    # A fleet's riskiest devices first, then by host and index (the operator's reading order).
    rows.sort(key=lambda r: (-SEVERITY_ORDER.get(r["risk"], 0), -r["active_alerts"], r["host"],
                             r["device"]))
    return rows


def process_verdicts(store: Store, device: int, host: str | None,
                     now_s: float) -> list[dict[str, Any]]:
    """Each running process's stored verdict (the engine's; the pages show the same rows):
    which process leaks, and how close to an OOM each one is."""
    from vramscope.agent.store.verdicts import processes

    return [{"pid": v["pid"], "process": v["process"], "leak": v["leak"]["state"],
             "leak_slope_bytes_per_h": v["leak"]["slope_bytes_per_h"],
             "leak_estimated_floor": v["leak"]["estimated_floor"],
             "risk": v["risk"]["level"], "cause": v["risk"]["cause"], "ts": v["ts"]}
            for v in processes(store, device, host, now_s) if not v["ended"]]


def host_rows(store: Store) -> list[dict[str, Any]]:
    """Hosts with first and last seen from their samples and agent reports (the hosts table
    keeps only the moment a host was first named)."""
    out = []
    for h in store.hosts():
        name = host_or_none(store, h["name"])
        seen = [span for d in store.devices(host=name)
                if (span := store.time_range(d["device_index"], name))]
        stats = store.latest_agent_stats(name)
        last = [t for t in (h["last_seen_s"], stats and stats["ts_s"]) if t]
        first = [t for t in (h["first_seen_s"],) if t] + [lo for lo, _ in seen]
        out.append({**h, "first_seen_s": min(first, default=None),
                    "last_seen_s": max(last + [hi for _, hi in seen], default=None),
                    "agent": _stats(stats)})
    return out


def process_rows(store: Store, rows: list[dict[str, Any]] | None = None,
                 config: Config | None = None, now_s: float | None = None
                 ) -> list[dict[str, Any]]:
    """Server processes; ``last_seen_s`` moves with their newest sample (the stored value is
    the last handshake or agent report that listed it as a client). With ``config`` and
    ``now_s``: each one's ``state`` (:func:`~vramscope.dashboard.verdict.process_state`), its
    KV pool now (``kv_blocks_used``, ``kv_blocks_total``, ``kv_usage_ratio``) and the requests
    it started in the last minute (``requests_per_min``)."""
    rows = rows if rows is not None else _latest_only(store)
    recent: dict[tuple[str, int], float] = {}
    for r in rows:
        for pid, ts in ((r["latest"] or {}).get("pids") or {}).items():
            key = (r["host"], pid)
            recent[key] = max(ts, recent.get(key, ts))
    out = []
    extra = servers.process_now(store, rows, now_s) if now_s is not None else {}
    reports: dict[str, dict[str, Any] | None] = {}
    for p in store.processes(host="*"):
        row = {**p, "last_seen_s": max(p["last_seen_s"],
                                       recent.get((p["host"], p["pid"]), p["last_seen_s"]))}
        if config is not None and now_s is not None:
            report = reports.setdefault(
                p["host"], store.latest_agent_stats(host_or_none(store, p["host"])))
            row["state"] = process_state(p, now_s, config, report)
            row.update(extra.get((p["host"], p["pid"]), servers.NO_KV))
        out.append(row)
    return out


def freshness_now(store: Store, config: Config, now_s: float) -> dict[str, Any]:
    """The freshness of all the data (:func:`~vramscope.dashboard.verdict.freshness`): its
    newest sample, the newest agent report and the server processes connected."""
    report = servers.newest_agent_report(store)
    return freshness(newest_sample_s(store, now_s), now_s, config, report,
                     servers.connected_clients(store, report, now_s, config))


def newest_sample_s(store: Store, now_s: float) -> float | None:
    """The newest sample's time not ahead of ``now_s`` over every device of every host (one
    indexed look-up each): a row from a wrong clock, ahead of now, would read as the newest
    and turn freshness for all the data on its time instead of the real samples'."""
    spans = (store.time_range(d["device_index"], host_or_none(store, d["host"]),
                              not_after_s=now_s)
             for d in store.devices(host="*"))
    return max((span[1] for span in spans if span), default=None)


def _latest_only(store: Store) -> list[dict[str, Any]]:
    return [{"host": d["host"], "device": d["device_index"],
             "latest": latest_values(store, d["device_index"], host_or_none(store, d["host"]))}
            for d in store.devices(host="*")]


def overview(store: Store, config: Config, now_s: float) -> dict[str, Any]:
    hosts = [{k: h[k] for k in ("name", "first_seen_s", "last_seen_s", "agent")}
             for h in host_rows(store)]
    rows = device_rows(store, config, now_s)
    newest = max((r["latest"]["last_ts_s"] for r in rows if r["latest"]), default=None)
    report = max((h["agent"] for h in hosts if h["agent"]), key=lambda a: a["ts_s"],
                 default=None)
    return {"now_s": now_s,
            "freshness": freshness(newest, now_s, config, report,
                                   servers.connected_clients(store, report, now_s, config)),
            "hosts": hosts, "devices": rows,
            "processes": process_rows(store, rows, config, now_s),
            "alerts": _alerts_json(store.alerts(active_only=True, host="*"), config)}


def _alerts_json(alerts: list[dict[str, Any]], config: Config) -> list[dict[str, Any]]:
    metrics = metrics_by_rule(config)
    return [alert_json(a, metrics) for a in alerts]


def _stats(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    keys = ("ts_s", "clients", "rows_per_s", "queue_depth", "dropped_total", "rejected_total",
            "db_size_bytes", "retention_behind_s", "retention_eta_s", "rejected_by_reason")
    return {k: row.get(k) for k in keys}


def alert_json(a: dict[str, Any], metrics: dict[str, str] | None = None) -> dict[str, Any]:
    """An alert for the API; ``value_text`` is its value with the rule metric's unit."""
    keys = ("id", "rule", "severity", "fired_ts_s", "resolved_ts_s", "value", "message",
            "labels", "device", "host")
    out = {k: a.get(k) for k in keys}
    out["value_text"] = value_text(a["rule"], a.get("value"), metrics or {})
    return out


def timeline(store: Store, device: int, host: str | None, start_s: float, end_s: float,
             max_points: int, columns: tuple[str, ...]) -> dict[str, Any]:
    """The timeline document: downsampled series, phase bands and event markers, and each
    process's allocated and reserved bytes where the raw samples tell them apart
    (:func:`~vramscope.dashboard.timeline.process_parts`)."""
    wanted = tuple(dict.fromkeys(columns + _ratio_inputs(columns)))
    # buckets of five minutes or more on the ten-minute grid the rollups are indexed by (a
    # week: 1,008 of ten minutes, grouped without a sort), finer ones as asked
    rows = downsample(store, device, start_s, end_s, max_points, wanted, None, host,
                      aligned=True)
    tier = aligned_grid(start_s, end_s, max_points)
    bucket_s = tier[1] if tier else (end_s - start_s) / max_points
    series = tl.series_from_rows(rows, columns)
    series.update(tl.derived_series(rows))
    # the rare markers and the phase events, each name on the (device, name, time) index
    named = store.events(device, start_s, end_s, host=host,
                         names=tl.RARE_EVENTS + ("phase",), limit=NAMED_EVENT_LIMIT + 1)
    changes = [e for e in named if e.name == "phase"]
    rare = [e for e in named if e.name != "phase"][:max_points]
    bands, shares, band_source = phase_bands(store, device, host, start_s, end_s, max_points,
                                             changes, len(named) > NAMED_EVENT_LIMIT)
    events, truncated = marker_events(store, device, host, start_s, end_s, max_points, rare)
    load = store.events(device, start_s, end_s, host=host, names=tl.LOAD_EVENTS,
                        limit=NAMED_EVENT_LIMIT + 1)
    grid_start = tier[0] if tier else start_s
    prefix = prefix_hits(store, device, host, start_s, end_s, grid_start, bucket_s)
    # each process's allocated / reserved where raw samples keep its pid, on the same grid;
    # and whether the series above mix several processes (the tiers keep no pid)
    processes = tl.process_parts(process_window(store, device, start_s, end_s, max_points,
                                                columns, host))
    return {"device": device, "host": host or store.host_name, "start": start_s, "end": end_s,
            "max_points": max_points,
            "bucket_s": bucket_s,
            "series": series, "phases": bands, "phase_shares": shares,
            "phase_source": band_source,
            "events": tl.event_markers(events), "events_truncated": truncated,
            "retries": tl.retry_markers(series),
            "request_rate": request_rate(store, device, host, start_s, end_s,
                                         bucket_s)._asdict(),
            "alerts": alert_markers(store, device, host, start_s, end_s),
            # running / waiting requests and preemptions (both vLLM sources), per bucket
            "load": tl.load_series(load[:NAMED_EVENT_LIMIT], grid_start, end_s, bucket_s),
            "load_truncated": len(load) > NAMED_EVENT_LIMIT,
            "prefix_cache": prefix, **processes}


PREFIX_EVENT_LIMIT = 20_000  # request allocations a timeline reads for prefix-cache hits


def prefix_hits(store: Store, device: int, host: str | None, start_s: float, end_s: float,
                grid_start_s: float, bucket_s: float) -> dict[str, Any] | None:
    """Prefix-cache hits per bucket (:func:`~vramscope.dashboard.timeline.prefix_series`), or
    None for a window of more than ``PREFIX_EVENT_LIMIT`` allocations (counted on the index
    first: a busy day's are not read to be dropped)."""
    if events_at_most(store, device, start_s, end_s, tl.PREFIX_EVENTS, PREFIX_EVENT_LIMIT,
                      host) > PREFIX_EVENT_LIMIT:
        return None
    events = store.events(device, start_s, end_s, host=host, names=tl.PREFIX_EVENTS,
                          limit=PREFIX_EVENT_LIMIT + 1)
    return tl.prefix_series(events, grid_start_s, end_s, bucket_s)


def marker_events(store: Store, device: int, host: str | None, start_s: float, end_s: float,
                  limit: int, rare: list[Event]) -> tuple[list[Event], bool]:
    """OOMs and orphaned blocks always (``rare``, read by the caller); request boundaries only
    when at most ``limit`` of them fall in the window (the first ``limit`` of a busy day would
    only mislead): counted on the index first, read only when they will be shown."""
    truncated = events_at_most(store, device, start_s, end_s, tl.REQUEST_EVENTS, limit,
                               host) > limit
    requests = [] if truncated else store.events(device, start_s, end_s, host=host,
                                                 names=tl.REQUEST_EVENTS, limit=limit + 1)
    merged = sorted(rare + requests, key=lambda e: e.ts_s)
    return merged, truncated


def alert_markers(store: Store, device: int, host: str | None, start_s: float,
                  end_s: float) -> list[dict[str, Any]]:
    """Alerts of this device that fired in the window (the Alerts page links here)."""
    name = host or store.host_name
    return [{"ts": a["fired_ts_s"], "severity": a["severity"], "rule": a["rule"],
             "message": a["message"]}
            for a in reversed(store.alerts(host=name, device=device, start_s=start_s,
                                           end_s=end_s, limit=10_000))]


def _ratio_inputs(columns: tuple[str, ...]) -> tuple[str, ...]:
    """Columns the derived fragmentation series need, even if not asked for themselves."""
    extra: tuple[str, ...] = ()
    if "inactive_split_bytes" in columns or "largest_free_block_bytes" in columns:
        extra += ("allocated_bytes", "reserved_bytes")
    if "kv_tokens_used" in columns:
        extra += ("kv_blocks_used",)
    return extra


def phase_bands(store: Store, device: int, host: str | None, start_s: float, end_s: float,
                max_bands: int, changes: list[Event], too_many: bool = False
                ) -> tuple[list[dict[str, Any]], dict[str, list[Any]] | None, str]:
    """``(bands, shares, source)``: exact bands from the window's phase events (``changes``),
    or from sample phases in a short window, when at most ``max_bands`` of them; otherwise each
    phase's share per bucket (a 2-second prefill would be narrower than a pixel, and no
    bucket's longest phase). ``too_many``: the events were cut at ``NAMED_EVENT_LIMIT``.

    Phase events and raw samples are gone before the device's first raw sample (retention):
    there the per-second tier's phases stand in (:func:`_stitched_phase_bands`)."""
    if too_many:
        return [], None, "zoom in: too many phase events"
    unread = False  # a part before the raw samples too long to read the tier's phases of
    if changes or end_s - start_s <= PHASE_SHARE_SPAN_S:  # else nothing is drawn either way
        raw_from, seconds = _seconds_before_raw(store, device, host, start_s, end_s)
        early = tl.changes_from_seconds(seconds)
        if early:
            return _stitched_phase_bands(store, device, host, start_s, end_s, max_bands,
                                         changes, raw_from, seconds, early)
        unread = raw_from - start_s > SECONDS_READ_MAX_S
    bands, shares, source = _raw_phase_bands(store, device, host, start_s, end_s, max_bands,
                                             changes)
    if unread and not bands and not (shares and shares["ts"]):
        # not "no phase reported": the tier holds phases there, only not read this far
        return [], None, f"zoom to {SECONDS_READ_MAX_S / 3600:g} h or less"
    return bands, shares, source


def _seconds_before_raw(store: Store, device: int, host: str | None, start_s: float,
                        end_s: float) -> tuple[float, list[PhaseSeconds]]:
    """``(raw_from, seconds)``: where the window's raw samples begin (the device's first one,
    ``end_s`` when there are none, ``start_s`` when none of the window is gone) and the
    per-second tier's seconds before it. Read only where the timeline's downsampling reads the
    tier too: a part of at most ``SECONDS_READ_MAX_S`` (a row per minute and source, unpacked
    in Python); a longer one says nothing rather than unpack days of seconds."""
    first = first_sample_ts(store, device, host)
    raw_from = max(start_s, end_s if first is None else min(first, end_s))
    if raw_from <= start_s or raw_from - start_s > SECONDS_READ_MAX_S:
        return raw_from, []
    return raw_from, store.seconds_phases(device, start_s, raw_from, host=host)


def _stitched_phase_bands(store: Store, device: int, host: str | None, start_s: float,
                          end_s: float, max_bands: int, changes: list[Event], raw_from: float,
                          seconds: list[PhaseSeconds], early: list[tuple[float, str]]
                          ) -> tuple[list[dict[str, Any]], dict[str, list[Any]] | None, str]:
    """:func:`phase_bands` of a window whose part before ``raw_from`` only the per-second tier
    holds: its phase changes (``early``) then those of the phase events or raw samples from
    ``raw_from`` on, made bands as one list, so that a phase held across the horizon is one
    band (and the last one before a phase event lasts until it: events mark every change).
    Past ``max_bands``, or when the raw part is too long to read its changes, shares per
    bucket: the tier's seconds counted in their phase, with the raw samples' counts."""
    after = tl.changes_from_events(e for e in changes if e.ts_s >= raw_from)
    raw_source = "events" if after else "samples"
    source = "per-second tier" + (f", then {raw_source}" if raw_from < end_s else "")
    if after:
        bands = tl.bands_from_changes(early + after, end_s)
        if len(bands) <= max_bands:
            return bands, None, source
        return [], tl.shares_from_bands(bands, start_s, end_s, SHARE_BUCKETS), source
    if end_s - raw_from <= PHASE_SAMPLE_SPAN_S:
        found = (phase_changes(store, device, raw_from, end_s, PHASE_SAMPLE_LIMIT, host)
                 if raw_from < end_s else [])
        bands = [] if found is None else tl.bands_from_changes(early + found, end_s)
        if found is not None and len(bands) <= max_bands:
            return bands, None, source
    counts = tl.counts_from_seconds(seconds, start_s, end_s, SHARE_BUCKETS)
    if raw_from < end_s:
        counts = tl.add_counts(counts, phase_counts(store, device, start_s, end_s,
                                                    SHARE_BUCKETS, host))
    return [], tl.shares_from_counts(counts, start_s, end_s, SHARE_BUCKETS), source


def _raw_phase_bands(store: Store, device: int, host: str | None, start_s: float, end_s: float,
                     max_bands: int, changes: list[Event]
                     ) -> tuple[list[dict[str, Any]], dict[str, list[Any]] | None, str]:
    """:func:`phase_bands` from phase events and raw samples only."""
    if changes:
        bands = tl.bands_from_events(changes, end_s)
        if len(bands) <= max_bands:
            return bands, None, "events"
        return [], tl.shares_from_bands(bands, start_s, end_s, SHARE_BUCKETS), "events"
    if end_s - start_s <= PHASE_SAMPLE_SPAN_S:
        found = phase_changes(store, device, start_s, end_s, PHASE_SAMPLE_LIMIT, host)
        sampled = None if found is None else tl.bands_from_changes(found, end_s)
        if sampled is not None and len(sampled) <= max_bands:
            return sampled, None, "samples"
    if end_s - start_s > PHASE_SHARE_SPAN_S:
        return [], None, "zoom to 6 h or less"
    counts, source = _shares_counts(store, device, host, start_s, end_s)
    shares = tl.shares_from_counts(counts, start_s, end_s, SHARE_BUCKETS)
    return [], shares, source if shares["ts"] else "no phase reported"


def _shares_counts(store: Store, device: int, host: str | None, start_s: float, end_s: float
                   ) -> tuple[dict[int, dict[str, int]], str]:
    """Samples per phase and share bucket, and where they were counted: raw samples, or where
    the window holds more than ``RAW_GROUP_LIMIT`` of them, the per-second tier's seconds
    (their phases only: a tenth of a full unpack) up to the end of its newest minute and the
    raw samples after it. Six hours at 10 Hz: 216,000 raw rows to group, or 360 rows of the
    tier."""
    did = device_row_id(store, device, host)
    rolled = None if did is None else seconds_end(store, did)
    if (did is None or rolled is None or rolled <= start_s
            or not raw_rows_over(store, device, host, start_s, end_s)):
        return phase_counts(store, device, start_s, end_s, SHARE_BUCKETS, host), "samples"
    upto = min(rolled, end_s)
    counts = tl.counts_from_seconds(store.seconds_phases(device, start_s, upto, host=host),
                                    start_s, end_s, SHARE_BUCKETS)
    if upto < end_s:
        counts = tl.add_counts(counts, phase_counts(store, device, start_s, end_s,
                                                    SHARE_BUCKETS, host, from_s=upto))
    return counts, "per-second tier" + (", then samples" if upto < end_s else "")


def measured_peaks(store: Store, device: int, host: str | None) -> dict[str, Any] | None:
    """Peak allocated / reserved / device used / KV blocks over the device's newest
    ``PEAKS_WINDOW_S`` of data, from the ten-minute boundary at or before its start
    (``first_ts_s``: where the data read began)."""
    span = store.time_range(device, host)
    if span is None:
        return None
    cols = ("allocated_bytes", "reserved_bytes", "device_used_bytes", "device_total_bytes",
            "kv_blocks_used", "kv_blocks_total")
    # whole ten-minute groups (a day: 144 rows a metric, read along their key), maxima only;
    # from a group's start, so that no partial group's minutes and raw samples are read at
    # the day's old end (two statements a device of the page's 73 on PostgreSQL)
    first = math.floor(max(span[0], span[1] - PEAKS_WINDOW_S) / ROLLUP_TIER_S) * ROLLUP_TIER_S
    end = span[1] if span[1] > first else first + 1.0
    rows = store.timeline(device, first, end, 1, cols, host=host, lasts=False,
                          width_s=ROLLUP_TIER_S)
    peaks = {c: max((r[f"{c}_max"] for r in rows if r[f"{c}_max"] is not None), default=None)
             for c in cols}
    return {"first_ts_s": max(first, span[0]), "last_ts_s": span[1], **peaks}


def postmortem_json(pm_id: int, pm: PostMortem, default_host: str,
                    snapshot_dir: str) -> dict[str, Any]:
    """The post-mortem for the API; a missing cause or remedies are filled in by the analysis'
    diagnosis, as ``vramscope analyze`` would."""
    from vramscope.agent.analysis.diagnosis import complete_postmortem

    out = complete_postmortem(pm).to_json()
    out["id"] = pm_id
    out["host"] = pm.host or default_host
    out["snapshot_available"] = snapshot_file(pm, snapshot_dir) is not None
    out.pop("snapshot_path", None)  # a server path: not the browser's business
    return out


def snapshot_file(pm: PostMortem, snapshot_dir: str) -> Path | None:
    """The kept PyTorch snapshot, only when it is a file inside ``hooks.snapshot_dir``.

    The path comes from a stored record; without this check anyone able to send the agent a
    post-mortem could make the dashboard serve any file it can read.
    """
    if not pm.snapshot_path or not snapshot_dir:
        return None
    root = Path(snapshot_dir).expanduser().resolve()
    path = Path(pm.snapshot_path).expanduser().resolve()
    if root not in path.parents or not path.is_file():
        return None
    return path
