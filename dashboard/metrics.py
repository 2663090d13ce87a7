"""``/metrics``: the store's current state in Prometheus text format, read at scrape time.

A collector of the app's own (:class:`StoreCollector`), so two apps never share series; its
families are :mod:`vramscope.dashboard.exposition`'s, which write the text
``prometheus_client.generate_latest`` writes at a fraction of its cost (a fleet's scrape is
16,000 series). Labels are bounded by design:
``host``, ``device``, ``process`` (a name, with its rank), ``pid`` (on the per-process series
only, which exist while their process runs), ``phase`` and ``source``, plus the identity labels
of ``vramscope_device_info``; never a request id. Device series are the device's (allocator
counters summed over its processes, NVML's used and total, the ``unexplained`` rest);
``vramscope_process_*`` series keep each server process apart. docs/metrics.md, "The
dashboard's /metrics".
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from flask import Flask, Response
from prometheus_client import CONTENT_TYPE_LATEST
from vramscope.agent.alerts.verdicts import DeviceVerdict
from vramscope.agent.analysis.severity import Severity
from vramscope.agent.clock import Clock
from vramscope.agent.config import Config
from vramscope.agent.records import Phase
from vramscope.agent.store import Store, reader
from vramscope.dashboard import exposition
from vramscope.dashboard.exposition import Family

# name -> (field, help). Gauges of the newest value per device; allocator and KV values are
# the sum over the device's processes (each one is a vramscope_process_* series too).
DEVICE_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("vramscope_allocated_bytes", "allocated_bytes", "Bytes the caching allocators handed to "
     "tensors (all processes of the device)."),
    ("vramscope_reserved_bytes", "reserved_bytes", "Bytes the caching allocators hold from the "
     "driver (all processes of the device)."),
    ("vramscope_inactive_split_bytes", "inactive_split_bytes", "Free bytes inside partially "
     "used segments (all processes of the device)."),
    ("vramscope_largest_free_block_bytes", "largest_free_block_bytes", "Largest free block in "
     "the last allocator snapshot of any process of the device."),
    ("vramscope_device_used_bytes", "device_used_bytes", "Device memory in use, all processes "
     "(NVML)."),
    ("vramscope_device_limit_bytes", "device_total_bytes", "Device total memory (NVML); a "
     "process's own cap is vramscope_process_limit_bytes."),
    ("vramscope_unexplained_bytes", "unexplained_bytes", "NVML used minus the reserved bytes "
     "of the device's observed processes: other users, CUDA contexts, memory outside torch."),
    ("vramscope_kv_blocks_used", "kv_blocks_used", "KV pool blocks referenced by live requests "
     "(all pools of the device; each server's is vramscope_process_kv_blocks_used)."),
    ("vramscope_kv_blocks_cached", "kv_blocks_cached", "KV pool blocks kept for prefix reuse "
     "(all pools of the device)."),
    ("vramscope_kv_blocks_capacity", "kv_blocks_total", "KV pool blocks in the pool (all pools "
     "of the device; each server's is vramscope_process_kv_blocks_capacity)."),
    ("vramscope_kv_tokens_used", "kv_tokens_used", "Tokens whose KV the device's processes hold "
     "for requests in flight (pools' used blocks, or per-request caches)."),
)
DEVICE_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("vramscope_alloc_retries", "num_alloc_retries", "Allocator cache flushes and retries "
     "(cumulative, all processes of the device)."),
    ("vramscope_ooms", "num_ooms", "OOMs raised by the allocators (cumulative)."),
)
# Per server process on a device: labels host, device, process, pid.
PROCESS_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("vramscope_process_allocated_bytes", "allocated_bytes", "Bytes this process's caching "
     "allocator handed to tensors."),
    ("vramscope_process_reserved_bytes", "reserved_bytes", "Bytes this process's caching "
     "allocator holds from the driver."),
    ("vramscope_process_inactive_split_bytes", "inactive_split_bytes", "Free bytes inside "
     "this process's partially used segments."),
    ("vramscope_process_limit_bytes", "limit_bytes", "What this process may use: its "
     "per-process cap (set_per_process_memory_fraction), else the device total."),
    ("vramscope_process_kv_blocks_used", "kv_blocks_used", "This process's KV blocks "
     "referenced by live requests."),
    ("vramscope_process_kv_blocks_capacity", "kv_blocks_total", "Blocks in this process's KV "
     "pool."),
)
PROCESS_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("vramscope_process_alloc_retries", "num_alloc_retries", "This process's allocator cache "
     "flushes and retries (cumulative)."),
    ("vramscope_process_ooms", "num_ooms", "OOMs this process's allocator raised (cumulative)."),
)
# The stored verdict of each running process, a series per pid as the process gauges
VERDICT_GAUGES: tuple[tuple[str, str], ...] = (
    ("vramscope_process_risk_level", "The stored OOM-risk verdict of the process (0 ok, "
     "1 warning, 2 critical)."),
    ("vramscope_process_leak_state", "The stored leak verdict of the process (1 leak, 0 no "
     "leak, -1 not enough data yet)."),
    ("vramscope_process_leak_slope_bytes_per_second", "The stored leak verdict's slope, where "
     "it found a leak: the idle floor's, or the KV pool's orphaned blocks' bytes per second."),
    ("vramscope_process_kv_orphaned_blocks", "The stored leak verdict's orphaned KV blocks: the "
     "pool check's latest count."),
    ("vramscope_process_kv_orphaned_blocks_per_second", "The stored leak verdict's rate of "
     "orphaned KV blocks, once its checks give one."),
)
# kv_saturation's value and figures per device
SATURATION_GAUGES: tuple[tuple[str, str], ...] = (
    ("vramscope_kv_saturated", "1 while the fullest KV pool is at least 95 % used with "
     "requests waiting, or a request was preempted in the last 60 s."),
    ("vramscope_requests_waiting", "Requests waiting, summed over the device's servers (each "
     "one's newest count)."),
    ("vramscope_requests_running", "Requests running, summed over the device's servers (each "
     "one's newest count)."),
    ("vramscope_kv_preemptions_recent", "Requests preempted in the last 60 s."),
)
DEVICE_LABELS = ("host", "device")
PROCESS_LABELS = ("host", "device", "process", "pid")
INFO_LABELS = ("host", "device", "uuid", "name", "index", "parent_uuid")


class StoreCollector:
    """Reads the store on each scrape; one failure gives ``vramscope_up 0``, never a 500."""

    def __init__(self, store: Store, config: Config, clock: Clock) -> None:
        self.store, self.config, self.clock = store, config, clock

    def collect(self) -> Iterator[Family]:
        t0 = time.perf_counter()
        up = Family("vramscope_up", "1 when the database answered this scrape.")
        try:
            families = list(self._families())
            up.add_metric([], 1)
        except Exception:  # a database error must not fail the whole scrape
            families = []
            up.add_metric([], 0)
        yield from families
        yield up
        took = Family("vramscope_scrape_duration_seconds",
                                 "Time this scrape spent reading the database.")
        took.add_metric([], time.perf_counter() - t0)
        yield took

    def _families(self) -> Iterator[Family]:
        """Every family, read in a fixed number of statements whatever the fleet's size (each
        read covers every device at once: a scrape of 64 hosts of 8 GPUs must not be a few
        thousand round trips to PostgreSQL)."""
        from vramscope.dashboard.queries import current_rows

        now_s = self.clock.time_s()
        listed = self.store.processes(host="*")  # read once, for every part of the scrape
        rows = current_rows(self.store, now_s, listed)
        yield from _device_families(rows)
        yield from _per_process_families(rows)
        yield _info_family(rows)
        yield from _source_families(rows, now_s)
        yield from _process_families(listed)
        from vramscope.agent.store.verdicts import fleet_verdicts

        stored = fleet_verdicts(self.store, now_s, listed)
        yield from _verdict_families(stored.processes)
        yield _config_family(stored.devices)
        yield from _saturation_families(self.store, rows, now_s)
        yield from _agent_families(self.store)


def _gauges(specs: tuple[tuple[str, str], ...],
            labels: tuple[str, ...]) -> list[Family]:
    """An empty gauge family per ``(name, help)`` of ``specs``, each with ``labels``."""
    return [Family(name, help_text, labels=labels) for name, help_text in specs]


def _labels(row: dict[str, Any]) -> list[str]:
    return [str(row["host"]), str(row["device"])]


def _device_families(rows: list[dict[str, Any]]) -> Iterator[Family]:
    for kind, specs in (("gauge", DEVICE_GAUGES), ("counter", DEVICE_COUNTERS)):
        for name, field, help_text in specs:
            fam = Family(name, help_text, labels=DEVICE_LABELS, kind=kind)
            for r in rows:
                value = (r["latest"] or {}).get(field)
                if value is not None:
                    fam.add_metric(_labels(r), value)
            yield fam
    risk = Family("vramscope_risk_level", "The device verdict: the worst level among "
                             "its firing alerts (0 ok, 1 warning, 2 critical).",
                             labels=DEVICE_LABELS)
    alerts = Family("vramscope_alerts_active", "Alerts firing now.",
                               labels=DEVICE_LABELS)
    phase = Family("vramscope_phase", "1 for the phase of the newest sample.",
                              labels=(*DEVICE_LABELS, "phase"))
    for r in rows:
        risk.add_metric(_labels(r), int(Severity.parse(r["risk"], "device risk")))
        alerts.add_metric(_labels(r), r["active_alerts"])
        current = (r["latest"] or {}).get("phase") or Phase.UNKNOWN.value
        for p in Phase:
            phase.add_metric([*_labels(r), p.value], 1 if p.value == current else 0)
    yield from (risk, alerts, phase)


def _per_process_families(rows: list[dict[str, Any]]) -> Iterator[Family]:
    """Each process of each device, one series per pid: two servers of one name (two vLLM
    processes, no rank) stay two series instead of one sum."""
    for kind, specs in (("gauge", PROCESS_GAUGES), ("counter", PROCESS_COUNTERS)):
        for name, field, help_text in specs:
            fam = Family(name, help_text, labels=PROCESS_LABELS, kind=kind)
            for labels, value in sorted(_process_values(rows, field).items()):
                fam.add_metric(list(labels), value)
            yield fam


def _process_values(rows: list[dict[str, Any]], field: str) -> dict[tuple[str, ...], int]:
    out: dict[tuple[str, ...], int] = {}
    for r in rows:
        for p in (r["latest"] or {}).get("processes") or ():
            if p.get(field) is not None:
                key = tuple(_labels(r)) + (p["process"], _pid(p["pid"]))
                out[key] = p[field]
    return out


def _pid(pid: int | None) -> str:
    """The ``pid`` label: empty for a process-less source (Prometheus reads an empty label as
    no label)."""
    return "" if pid is None else str(pid)


LEAK_VALUE = {"leak": 1, "no_leak": 0, "insufficient_data": -1}


def _verdict_families(fleet: Mapping[tuple[str, int], list[dict[str, Any]]]
                      ) -> Iterator[Family]:
    """The alert engine's stored verdict of each running process (``vramscope.verdict/1``: the
    answer the pages show, the fleet page's too), labelled as the per-process series."""
    risk, leak, slope, orphans, kv_rate = _gauges(VERDICT_GAUGES, PROCESS_LABELS)
    seen: set[tuple[str, ...]] = set()
    for (host, device), answers in fleet.items():
        for v in answers:
            labels = (host, str(device), v["label"], _pid(v["pid"]))
            if labels in seen:
                continue  # one answer a process (a label set is unique)
            seen.add(labels)
            if v["risk"]["level"]:
                risk.add_metric(list(labels),
                                int(Severity.parse(v["risk"]["level"], "risk level")))
            leak.add_metric(list(labels), LEAK_VALUE.get(v["leak"]["state"], -1))
            if v["leak"]["state"] == "leak":
                slope.add_metric(list(labels), v["leak"]["slope_bytes_per_s"])
            kv = v["leak"].get("kv_pool")
            if kv is not None:
                orphans.add_metric(list(labels), kv["orphaned_blocks"])
                if kv["blocks_per_s"] is not None:
                    kv_rate.add_metric(list(labels), kv["blocks_per_s"])
    yield from (risk, leak, slope, orphans, kv_rate)


def _config_family(answers: Mapping[tuple[str, int], DeviceVerdict]) -> Family:
    """``config_oom``'s value (the ``[server]`` section's worst admissible request against each
    device's limit), as the agent's engine made it and stored it with the device's answer, so
    the exported Prometheus rule alerts on the agent's number (never one made again here with
    the dashboard's config). No series where the agent stored no check (no ``[server]``
    section) or no limit was known."""
    fam = Family("vramscope_config_headroom_bytes", "The device's limit less what "
                            "the worst request the [server] section admits needs (negative: "
                            "it cannot fit).", labels=DEVICE_LABELS)
    for (host, device), answer in sorted(answers.items()):
        check = answer.config_check or {}
        if isinstance(check.get("headroom_bytes"), (int, float)):
            fam.add_metric([host, str(device)], check["headroom_bytes"])
    return fam


def _saturation_families(store: Store, rows: list[dict[str, Any]],
                         now_s: float) -> Iterator[Family]:
    """``kv_saturation``'s value and its figures per device, from the stored ``server_load``
    and ``kv_preempted`` events of the last ``LOAD_WINDOW_S`` read through the agent's own
    tracker (:mod:`vramscope.agent.alerts.saturation`), so the exported Prometheus rule and
    the agent's alert judge the same numbers."""
    from vramscope.agent.alerts.saturation import EVENTS, LOAD_WINDOW_S, Saturation

    saturated, waiting, running, preempted = _gauges(SATURATION_GAUGES, DEVICE_LABELS)
    recent = reader.fleet_events(store, now_s - LOAD_WINDOW_S, now_s, sorted(EVENTS))
    for r in rows:
        events = recent.get((r["host"], r["device"]))
        if not events:
            continue
        sat = Saturation()
        for e in events:
            sat.on_event(e)
        usage, total = _fullest_pool((r["latest"] or {}).get("processes") or ())
        value = sat.value(usage, total, now_s)
        if value is None:
            continue
        saturated.add_metric(_labels(r), value)
        figures = sat.figures
        for fam, key in ((waiting, "waiting"), (running, "running"), (preempted, "preempted")):
            if figures.get(key) is not None:
                fam.add_metric(_labels(r), figures[key])
    yield from (saturated, waiting, running, preempted)


def _fullest_pool(processes: Any) -> tuple[float | None, int | None]:
    """The usage ratio and size of the fullest KV pool of the device's processes (the pool the
    agent's rules read)."""
    pools = [(p["kv_blocks_used"] / p["kv_blocks_total"], p["kv_blocks_total"])
             for p in processes if p.get("kv_blocks_used") is not None and p.get("kv_blocks_total")]
    return max(pools) if pools else (None, None)


def _info_family(rows: list[dict[str, Any]]) -> Family:
    """1 per device, with its identity: joins with dcgm-exporter's series (``UUID``)."""
    info = Family("vramscope_device_info", "Device identity: UUID, name, physical "
                             "index and, for a MIG slice, its GPU's UUID. Always 1.",
                             labels=INFO_LABELS)
    for r in rows:
        index = r.get("physical_index")
        info.add_metric([*_labels(r), r.get("uuid") or "", r.get("name") or "",
                         str(r["device"] if index is None else index),
                         r.get("parent_uuid") or ""], 1)
    return info


def _source_families(rows: list[dict[str, Any]], now_s: float) -> Iterator[Family]:
    age = Family("vramscope_last_sample_age_seconds",
                            "Seconds since the newest sample of each source.",
                            labels=(*DEVICE_LABELS, "source"))
    for r in rows:
        for source, ts in sorted(((r["latest"] or {}).get("sources") or {}).items()):
            age.add_metric([*_labels(r), source], max(0.0, now_s - ts))
    yield age


def _process_families(processes: list[dict[str, Any]]) -> Iterator[Family]:
    seen = Family("vramscope_process_last_seen_timestamp_seconds",
                             "When a server process was last seen (Unix time).",
                             labels=("host", "process"))
    newest: dict[tuple[str, str], float] = {}
    for p in processes:  # several pids may share a name: keep the newest
        key = (str(p["host"]), str(p["name"] or "unknown"))
        newest[key] = max(newest.get(key, 0.0), p["last_seen_s"])
    for (host, name), ts in sorted(newest.items()):
        seen.add_metric([host, name], ts)
    yield seen


def _agent_families(store: Store) -> Iterator[Family]:
    dropped = Family("vramscope_agent_dropped_records",
                     "Records lost before the database: dropped by the agent "
                     "(queue full) plus those hook clients reported dropped.",
                     labels=("host",), kind="counter")
    queue = Family("vramscope_agent_queue_depth", "Agent writer queue depth.",
                              labels=("host",))
    for host, stats in sorted(reader.fleet_reports(store).items()):
        dropped.add_metric([host], stats["dropped_total"])
        queue.add_metric([host], stats["queue_depth"])
    yield from (dropped, queue)


def init_app(app: Flask) -> None:
    st = app.extensions["vramscope"]
    collector = StoreCollector(st.store, st.config, st.clock)
    app.extensions["vramscope_collector"] = collector

    def metrics() -> Response:
        return Response(exposition.text(collector.collect()), content_type=CONTENT_TYPE_LATEST)

    app.add_url_rule("/metrics", "metrics", metrics)
