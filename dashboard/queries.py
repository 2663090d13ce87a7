"""What the Overview, the timeline and the Capacity peaks show, composed from the store.

Windows of samples are read through the store's reader (:mod:`vramscope.agent.store.reader`),
which chooses the tier (raw samples, the per-second tier, the rollups) and says which answered;
this module shapes what it read (:mod:`vramscope.dashboard.timeline`). The newest values of a
device (the last ``LATEST_WINDOW_S`` of raw samples) and the stored rows (devices, processes,
alerts, agent reports) are read from the store itself; what every device has (the Overview,
the device table, ``/metrics``) through the reader's ``fleet_*`` calls, one statement each
whatever the fleet's size, never a read per device.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from vramscope.agent.analysis.severity import worst
from vramscope.agent.config import Config
from vramscope.agent.store import Store, reader
from vramscope.agent.store import verdicts as stored
from vramscope.dashboard import servers
from vramscope.dashboard import timeline as tl
from vramscope.dashboard.alert_text import metrics_by_rule, value_text
from vramscope.dashboard.latest import LATEST_WINDOW_S, latest_from, latest_values
from vramscope.dashboard.verdict import (
    connected_count,
    device_verdict,
    freshness,
    process_state,
    reading_order,
)

# Capacity's measured peaks cover each device's newest day: over everything stored they would
# read a week of minute rollups per device, a cost growing with the retention
PEAKS_WINDOW_S = 86_400.0


def host_or_none(store: Store, host: str | None) -> str | None:
    return None if host in (None, "", store.host_name) else host


class DeviceReads(NamedTuple):
    """What :func:`device_rows` reads of the devices it shows, before it composes their rows:
    the whole fleet's in a fixed number of statements, or one device's by its own."""

    devices: list[tuple[dict[str, Any], dict[str, Any] | None]]  # devices row, latest values
    verdicts: dict[tuple[str, int], list[dict[str, Any]]]  # (host, index) -> process_verdicts
    reports: dict[str, dict[str, Any]]  # host -> its newest agent report (none: left out)
    starts: dict[tuple[str, int], dict[int | None, int]]  # servers.request_starts'
    procs: dict[str, dict[int, dict[str, Any]]]  # the processes table's rows by host, pid
    # the processes table's rows as Store.processes(host="*") gives them, where read once for
    # all the parts of a page (None: each part reads them)
    listed: list[dict[str, Any]] | None = None


def _fleet_now(store: Store, now_s: float) -> DeviceReads:
    """Every device's reads in one statement each (a fleet of 512 devices was thousands),
    the processes table read once for all of them."""
    listed = store.processes(host="*")
    procs = _processes_by_host(store, listed)
    found = stored.fleet_current(store, now_s, listed)
    devices = [(n.device, latest_from(n.span, n.recent, procs.get(n.device["host"])))
               for n in reader.fleet_samples(store, now_s, LATEST_WINDOW_S)]
    verdicts = {key: [verdict_entry(v) for v in mine] for key, mine in found.items()}
    return DeviceReads(devices, verdicts, reader.fleet_reports(store),
                       servers.request_starts(store, now_s), procs, listed)


def _device_now(store: Store, now_s: float, only: tuple[str, int]) -> DeviceReads:
    """One device's reads (``only``: host name, index), without the others'."""
    procs = _processes_by_host(store)
    devices, verdicts, reports = [], {}, {}
    for d in store.devices(host=only[0]):
        if d["device_index"] != only[1]:
            continue
        host = host_or_none(store, d["host"])
        devices.append((d, latest_values(store, d["device_index"], host, procs.get(d["host"]),
                                         now_s)))
        verdicts[(d["host"], d["device_index"])] = process_verdicts(store, d["device_index"],
                                                                    host, now_s)
        report = store.latest_agent_stats(host)
        if report is not None:
            reports[d["host"]] = report
    starts = servers.request_starts(store, now_s, only) if devices else {}
    return DeviceReads(devices, verdicts, reports, starts, procs)


def device_rows(store: Store, config: Config, now_s: float,
                only: tuple[str, int] | None = None, read: DeviceReads | None = None
                ) -> list[dict[str, Any]]:
    """One row per device of every host, riskiest first: current values, the alert engine's
    verdict (:mod:`vramscope.dashboard.verdict`) and whether the device's data is stale.
    Every device's in a fixed number of statements whatever the fleet's size
    (:func:`_fleet_now`);
    ``only`` (host name, device index): that device's row alone, read without the others' (a
    device page's verdict line in a fleet of 512 must not cost the whole table). ``read``:
    the devices' reads, where the caller has them already (:func:`overview`)."""
    if read is None:
        read = _fleet_now(store, now_s) if only is None else _device_now(store, now_s, only)
    return _device_rows(store, config, now_s, read)


def _device_rows(store: Store, config: Config, now_s: float, now: DeviceReads
                 ) -> list[dict[str, Any]]:
    """:func:`device_rows` from what was read."""
    procs = now.procs
    active = _active_alerts(store)
    rows = []
    for d, latest in now.devices:
        if d["device_index"] < 0 and latest is None:
            continue  # a retired label (NVML renumbered the GPUs) with nothing recent
        key = (d["host"], d["device_index"])
        mine = active.get(key, [])
        verdict = device_verdict(mine)
        writers = connected_count((latest or {}).get("pids") or {}, procs.get(d["host"], {}),
                                  now_s, config)
        fresh = freshness(latest["last_ts_s"] if latest else None, now_s, config,
                          now.reports.get(d["host"]), writers=writers)
        started = sum(now.starts.get(key, {}).values())
        rows.append({**_current_row(d, latest, mine, verdict,
                                    verdicts=now.verdicts.get(key, [])),
                     "last_sample_age_s": fresh["age_s"], "stale": fresh["stale"],
                     "freshness": fresh["state"],
                     **servers.kv_and_requests(latest, started)})
    rows.sort(key=lambda r: reading_order(r["risk"], r["active_alerts"], r["host"], r["device"]))
    return rows


def current_rows(store: Store, now_s: float,
                 listed: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """What :func:`device_rows` says of every device that ``/metrics`` reads (its identity,
    ``latest``, ``risk``, ``verdict`` and ``active_alerts``), in its order, in a fixed number
    of statements whatever the fleet's size: every device's newest samples in one
    (:func:`vramscope.agent.store.reader.fleet_samples`), not two per device (a scrape of 64
    hosts of 8 GPUs was a thousand round trips). ``listed``: the processes table's rows,
    where the caller read them already."""
    active = _active_alerts(store)
    procs = _processes_by_host(store, listed)
    rows = []
    for now in reader.fleet_samples(store, now_s, LATEST_WINDOW_S):
        d = now.device
        latest = latest_from(now.span, now.recent, procs.get(d["host"]))
        if d["device_index"] < 0 and latest is None:
            continue  # a retired label (NVML renumbered the GPUs) with nothing recent
        mine = active.get((d["host"], d["device_index"]), [])
        rows.append(_current_row(d, latest, mine, device_verdict(mine)))
    rows.sort(key=lambda r: reading_order(r["risk"], r["active_alerts"], r["host"], r["device"]))
    return rows


def _current_row(d: dict[str, Any], latest: dict[str, Any] | None,
                 mine: list[dict[str, Any]], verdict: dict[str, Any],
                 **after_verdict: Any) -> dict[str, Any]:
    """A device row's identity, current values and alert verdict (``d``: its devices row,
    ``mine``: its alerts firing now; ``after_verdict``: more keys, in the API's order)."""
    return {"host": d["host"], "device": d["device_index"], "name": d["name"],
            "uuid": d["uuid"], "parent_uuid": d.get("parent_uuid"),
            "physical_index": d.get("physical_index"), "total_bytes": d["total_bytes"],
            "risk": verdict["level"], "verdict": verdict, **after_verdict,
            "active_alerts": len(mine), "latest": latest}


def _active_alerts(store: Store) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """The alerts firing now, by (host, device index)."""
    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for a in store.alerts(active_only=True, host="*"):
        out.setdefault((a["host"], a["device"]), []).append(a)
    return out


def _processes_by_host(store: Store, listed: list[dict[str, Any]] | None = None
                       ) -> dict[str, dict[int, dict[str, Any]]]:
    """The processes table's rows (``listed``, else read) by host name, then pid."""
    procs: dict[str, dict[int, dict[str, Any]]] = {}
    for p in store.processes(host="*") if listed is None else listed:
        procs.setdefault(p["host"], {})[p["pid"]] = p
    return procs


def process_verdicts(store: Store, device: int, host: str | None,
                     now_s: float) -> list[dict[str, Any]]:
    """Each running process's stored verdict (the engine's; the pages show the same rows):
    which process leaks, and how close to an OOM each one is (:func:`verdict_entry`)."""
    from vramscope.agent.store.verdicts import processes

    return [verdict_entry(v) for v in processes(store, device, host, now_s) if not v["ended"]]


def verdict_entry(v: dict[str, Any]) -> dict[str, Any]:
    """A running process's stored answer as a device row lists it (``verdicts``)."""
    from vramscope.agent.analysis.kv_leak import verdict_words

    # a leak's rate, interval and time to OOM in the words `status` and `analyze` use
    return {"pid": v["pid"], "process": v["process"], "leak": v["leak"]["state"],
            "leak_text": (verdict_words(v["leak"]) if v["leak"]["state"] == "leak"
                          else None),
            "leak_slope_bytes_per_h": v["leak"]["slope_bytes_per_h"],
            "leak_estimated_floor": v["leak"]["estimated_floor"],
            "risk": v["risk"]["level"], "cause": v["risk"]["cause"],
            "at_risk_from_pid": v["risk"]["at_risk_from_pid"], "cause_text": v["cause_text"],
            "ts": v["ts"]}


def host_rows(store: Store, reports: dict[str, dict[str, Any]] | None = None
              ) -> list[dict[str, Any]]:
    """Hosts with first and last seen from their samples and agent reports (the hosts table
    keeps only the moment a host was first named), in three statements whatever the fleet's
    size: the hosts, every device's span, every host's newest agent report (or ``reports``:
    those, by host name, already read)."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for (host, _), span in reader.fleet_spans(store).items():
        if span is not None:
            spans.setdefault(host, []).append(span)
    reports = reader.fleet_reports(store) if reports is None else reports
    out = []
    for h in store.hosts():
        seen = spans.get(h["name"], [])
        stats = reports.get(h["name"])
        last = [t for t in (h["last_seen_s"], stats and stats["ts_s"]) if t]
        first = [t for t in (h["first_seen_s"],) if t] + [lo for lo, _ in seen]
        out.append({**h, "first_seen_s": min(first, default=None),
                    "last_seen_s": max(last + [hi for _, hi in seen], default=None),
                    "agent": _stats(stats)})
    return out


def process_rows(store: Store, rows: list[dict[str, Any]] | None = None,
                 config: Config | None = None, now_s: float | None = None,
                 read: DeviceReads | None = None) -> list[dict[str, Any]]:
    """Server processes; ``last_seen_s`` moves with their newest sample (the stored value is
    the last handshake or agent report that listed it as a client). With ``config`` and
    ``now_s``: each one's ``state`` (:func:`~vramscope.dashboard.verdict.process_state`), its
    KV pool now (``kv_blocks_used``, ``kv_blocks_total``, ``kv_usage_ratio``) and the requests
    it started in the last minute (``requests_per_min``): every host's agent report and every
    device's request starts in one statement each, or as ``read`` (``rows``' reads) has them."""
    rows = rows if rows is not None else _latest_only(store)
    recent: dict[tuple[str, int], float] = {}
    for r in rows:
        for pid, ts in ((r["latest"] or {}).get("pids") or {}).items():
            key = (r["host"], pid)
            recent[key] = max(ts, recent.get(key, ts))
    if read is None and config is not None and now_s is not None:
        read = DeviceReads([], {}, reader.fleet_reports(store),
                           servers.request_starts(store, now_s), {})
    extra = servers.process_now(rows, read.starts) if read is not None else {}
    out = []
    listed = read.listed if read is not None else None
    for p in store.processes(host="*") if listed is None else listed:
        row = {**p, "last_seen_s": max(p["last_seen_s"],
                                       recent.get((p["host"], p["pid"]), p["last_seen_s"]))}
        if config is not None and now_s is not None and read is not None:
            row["state"] = process_state(p, now_s, config, read.reports.get(p["host"]))
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
    statement: an indexed look-up each): a row from a wrong clock, ahead of now, would read
    as the newest and turn freshness for all the data on its time instead of the real
    samples'."""
    spans = reader.fleet_spans(store, not_after_s=now_s).values()
    return max((span[1] for span in spans if span), default=None)


def _latest_only(store: Store) -> list[dict[str, Any]]:
    """Every device's ``latest_values`` (its newest samples whatever their time), in one
    statement."""
    return [{"host": n.device["host"], "device": n.device["device_index"],
             "latest": latest_from(n.span, n.recent, None)}
            for n in reader.fleet_samples(store, None, LATEST_WINDOW_S)]


def overview(store: Store, config: Config, now_s: float) -> dict[str, Any]:
    """The Overview document (docs/api.md), in a fixed number of statements whatever the
    fleet's size: every device's reads once (:func:`_fleet_now`), shared by its parts."""
    now = _fleet_now(store, now_s)
    hosts = [{k: h[k] for k in ("name", "first_seen_s", "last_seen_s", "agent")}
             for h in host_rows(store, now.reports)]
    rows = device_rows(store, config, now_s, read=now)
    newest = max((r["latest"]["last_ts_s"] for r in rows if r["latest"]), default=None)
    report = max((h["agent"] for h in hosts if h["agent"]), key=lambda a: a["ts_s"],
                 default=None)
    return {"now_s": now_s,
            "freshness": freshness(newest, now_s, config, report,
                                   servers.connected_clients(store, report, now_s, config,
                                                             now.listed)),
            "level": worst((r["risk"] for r in rows), "device verdicts").label,
            "hosts": hosts, "devices": rows,
            "processes": process_rows(store, rows, config, now_s, read=now),
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
    """The timeline document (docs/api.md): what the reader read for the window
    (:func:`~vramscope.agent.store.reader.timeline`, one call), shaped: the series with their
    derived ratios, phase bands, event markers, request rate, load and prefix-cache hits on
    the series' grid, and each process's allocated and reserved bytes and KV pool where the
    raw samples tell them apart (:func:`~vramscope.dashboard.timeline.process_parts`,
    :func:`~vramscope.dashboard.timeline.kv_pool_parts`)."""
    wanted = tuple(dict.fromkeys(columns + _ratio_inputs(columns)))
    read = reader.timeline(store, reader.Span(device, start_s, end_s, host), max_points,
                           wanted, columns)
    rows, grid_start, bucket_s = read.series.rows, read.series.start_s, read.series.bucket_s
    series = tl.series_from_rows(rows, columns)
    series.update(tl.derived_series(rows))
    markers = sorted(read.rare + read.requests, key=lambda e: e.ts_s)
    return {"device": device, "host": host or store.host_name, "start": start_s, "end": end_s,
            "max_points": max_points,
            "bucket_s": bucket_s,
            "series": series, "phases": read.phases.bands, "phase_shares": read.phases.shares,
            "phase_source": read.phases.tier,
            "events": tl.event_markers(markers), "events_truncated": read.requests_truncated,
            "retries": tl.retry_markers(series),
            "request_rate": read.rate.document(),
            "alerts": [{"ts": a["fired_ts_s"], "severity": a["severity"], "rule": a["rule"],
                        "message": a["message"]} for a in reversed(read.alerts)],
            # running / waiting requests and preemptions (both vLLM sources), per bucket
            "load": tl.load_series(read.load, grid_start, end_s, bucket_s),
            "load_truncated": read.load_truncated,
            # prompt and generated tokens per second (both vLLM sources), per bucket
            "tokens": tl.token_series(read.load, grid_start, end_s, bucket_s),
            "prefix_cache": (None if read.prefix is None else
                             tl.prefix_series(read.prefix, grid_start, end_s, bucket_s)),
            **tl.process_parts(read.processes), **tl.kv_pool_parts(read.kv_pools),
            "floor": judged_floor(store, device, host, start_s, end_s)}


def judged_floor(store: Store, device: int, host: str | None, start_s: float,
                 end_s: float) -> dict[str, Any]:
    """The floor the engine's leak detector judged on in the window, as the Leaks page draws
    it: the points carried by the stored verdict rows of the process whose leak the window's
    answer is (``verdicts.window_leak_lead``, ``verdicts.judged_floor``), never a floor
    drawn here from the series. ``points`` is empty where no process leads or its rows carry
    none (rows written before they did)."""
    lead = stored.window_leak_lead(stored.processes(store, device, host, end_s), start_s)
    if lead is None:
        return {"pid": None, "process": None, "points": []}
    points = stored.judged_floor(store, device, host, lead["pid"], start_s, end_s)
    return {"pid": lead["pid"], "process": lead["process"],
            "points": [[t, b] for t, b in points]}


def _ratio_inputs(columns: tuple[str, ...]) -> tuple[str, ...]:
    """Columns the derived fragmentation series need, even if not asked for themselves."""
    extra: tuple[str, ...] = ()
    if "inactive_split_bytes" in columns or "largest_free_block_bytes" in columns:
        extra += ("allocated_bytes", "reserved_bytes")
    if "kv_tokens_used" in columns:
        extra += ("kv_blocks_used",)
    return extra


def measured_peaks(store: Store, device: int, host: str | None) -> dict[str, Any] | None:
    """Peak allocated / reserved / device used / KV blocks over the device's newest
    ``PEAKS_WINDOW_S`` of data (``first_ts_s``: where the data read began)."""
    span = store.time_range(device, host)
    if span is None:
        return None
    cols = ("allocated_bytes", "reserved_bytes", "device_used_bytes", "device_total_bytes",
            "kv_blocks_used", "kv_blocks_total")
    read = reader.peaks(store, reader.Span(device, max(span[0], span[1] - PEAKS_WINDOW_S),
                                           span[1], host), cols)
    return {"first_ts_s": max(read.from_s, span[0]), "last_ts_s": span[1], **read.values}
