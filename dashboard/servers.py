"""What the Overview says of each server now: its KV pool, the requests it started in the last
minute, and who is connected to the agent (an idle vLLM server sends nothing, so whether it is
still there comes from the agent's reports, not from its samples). Store reads bounded by one
minute and one row per host or process, the whole fleet's in one statement each;
:mod:`vramscope.dashboard.queries` composes them.
"""

from __future__ import annotations

from typing import Any

from vramscope.agent.config import Config
from vramscope.agent.store import Store, reader
from vramscope.dashboard.verdict import connected

NO_KV = {"kv_blocks_used": None, "kv_blocks_total": None, "kv_usage_ratio": None,
         "kv_at_s": None, "requests_per_min": None}
RATE_WINDOW_S = 60.0  # "requests per minute" of a process: those it started in the last minute
RATE_LIMIT = 100_000  # request starts counted a minute, at most


def kv_and_requests(latest: dict[str, Any] | None, started: int) -> dict[str, Any]:
    """A device's KV pools now and the requests started on it in the last minute
    (``started``: :func:`request_starts`' of the device, summed): what a vLLM server's Overview
    row shows.

    ``kv_pools``: each process's pool (its newest reading: the vLLM plugin's or the Prometheus
    source's), by pid; ``kv_usage_ratio``: the fullest pool's share used, the pool the
    agent's KV rules read. Never the sum over pools: a full 63-block pool beside a
    16,384-block one at 3 % would read 3 %. A device whose readings carry no process (a
    trace) has its summed reading as its one pool."""
    pools = [{"pid": p["pid"], "process": p.get("process"),
              "kv_blocks_used": p["kv_blocks_used"], "kv_blocks_total": p["kv_blocks_total"],
              "kv_usage_ratio": p["kv_blocks_used"] / p["kv_blocks_total"]}
             for p in sorted((latest or {}).get("processes") or (),
                             key=lambda p: (p["pid"] is None, p["pid"] or 0))
             if p.get("kv_blocks_used") is not None and p.get("kv_blocks_total")]
    used, total = (latest or {}).get("kv_blocks_used"), (latest or {}).get("kv_blocks_total")
    if not pools and used is not None and total:
        pools = [{"pid": None, "process": None, "kv_blocks_used": used,
                  "kv_blocks_total": total, "kv_usage_ratio": used / total}]
    return {"kv_usage_ratio": max((p["kv_usage_ratio"] for p in pools), default=None),
            "kv_pools": pools,
            "requests_per_min": (0 if latest is None else min(started, RATE_LIMIT))
            * 60.0 / RATE_WINDOW_S}


def request_starts(store: Store, now_s: float, only: tuple[str, int] | None = None
                   ) -> dict[tuple[str, int], dict[int | None, int]]:
    """The requests each device's processes started in the last minute, by (host, device
    index), then pid: of at most ``RATE_LIMIT`` a device (the first, in time order). Every
    device's in one statement (:func:`~vramscope.agent.store.reader.fleet_event_counts`);
    ``only`` (host name, device index): that device's alone, read without the others'."""
    start_s = now_s - RATE_WINDOW_S
    if only is None:
        return reader.fleet_event_counts(store, start_s, now_s, "request_start", RATE_LIMIT)
    host = None if only[0] == store.host_name else only[0]
    counts: dict[int | None, int] = {}
    for e in store.events(only[1], start_s, now_s, host=host, names=("request_start",),
                          limit=RATE_LIMIT):
        counts[e.pid] = counts.get(e.pid, 0) + 1
    return {only: counts} if counts else {}


def process_now(rows: list[dict[str, Any]],
                starts: dict[tuple[str, int], dict[int | None, int]]
                ) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (host, pid): its newest KV pool reading (the device row's process entry) with the
    moment it was read in the server (``kv_at_s``: "now" is the newest reading the agent has
    committed, so it is as of then, not of the page's time), and the requests it started on
    the row's device in the last minute (``starts``: :func:`request_starts`')."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        entries = (r.get("latest") or {}).get("processes") or []
        mine = starts.get((r["host"], r["device"]), {})
        for p in entries:
            if p["pid"] is None:
                continue
            used, total = p.get("kv_blocks_used"), p.get("kv_blocks_total")
            out[(r["host"], p["pid"])] = {
                "kv_blocks_used": used, "kv_blocks_total": total,
                "kv_usage_ratio": used / total if used is not None and total else None,
                "kv_at_s": (p.get("at") or {}).get("kv_blocks_used"),
                "requests_per_min": mine.get(p["pid"], 0) * 60.0 / RATE_WINDOW_S}
    return out


def connected_clients(store: Store, report: dict[str, Any] | None, now_s: float,
                      config: Config, listed: list[dict[str, Any]] | None = None) -> int | None:
    """Server processes connected now, every host: the agent's count, or more where process
    rows say so (a server in the agent's own process, as ``vramscope demo``'s, has no socket
    connection but names itself); None without an agent report. ``listed``: the processes
    table's rows, where the caller read them already."""
    if report is None:
        return None
    every = store.processes(host="*") if listed is None else listed
    rows = sum(1 for p in every if connected(p, now_s, config))
    return max(int(report["clients"]), rows)


def newest_agent_report(store: Store) -> dict[str, Any] | None:
    """The newest agent report of any host (``agent_stats``), for the freshness of all data:
    each host's newest in one statement (:func:`~vramscope.agent.store.reader.fleet_reports`)."""
    return max(reader.fleet_reports(store).values(), key=lambda r: r["ts_s"], default=None)
