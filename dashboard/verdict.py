"""One verdict per device, decided once, shown everywhere; and whether the data is still live.

The dashboard keeps no domain rules of its own: a device's verdict is what the agent's alert
engine decided, the worst severity among the device's active alerts with those alerts as its
reasons; ``vramscope analyze`` runs the same engine, so the Overview,
``/api/v1/alerts?active=true`` and the analysis agree.

Freshness: an old newest sample is not by itself a fault (an idle vLLM server sends nothing).
Stale means that whoever should report stopped: the agent, or its clients. The states
(``no_data``, ``live``, ``idle``, ``catching_up``, ``stale``) are defined in docs/api.md
(``/freshness``); when stale every page says so in a banner and drops "live".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from vramscope.agent.analysis.severity import rank, worst

STALE_INTERVALS = 5  # intervals without a new sample before the data counts as stale
STALE_MIN_S = 15.0  # never stale sooner: a batch and a page refresh may both be in flight
_INTERVAL_KEYS = ("sampling.device_interval_s", "sampling.allocator_interval_s",
                  "agent.batch_interval_s", "dashboard.refresh_s")


def device_verdict(alerts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``{"level", "reasons"}`` from one device's active alerts, most severe first."""
    mine = sorted(alerts, key=lambda a: (-rank(a["severity"], a["rule"]), a["fired_ts_s"]))
    return {"level": worst((a["severity"] for a in mine), "alerts").label,
            "reasons": [{"rule": a["rule"], "severity": a["severity"],
                         "message": a.get("message"), "fired_ts_s": a["fired_ts_s"]}
                        for a in mine]}


def reading_order(level: str, active_alerts: int, host: str,
                  device: int) -> tuple[int, int, str, int]:
    """The Overview's order of devices, to sort by: the riskiest verdict first, then the most
    active alerts, then host and index (the operator's reading order)."""
    return -rank(level, f"device {device} of host {host!r}"), -active_alerts, host, device


def stale_after_s(config: Mapping[str, Any]) -> float:
    """How old the newest sample may be before the data is stale: ``STALE_INTERVALS`` of the
    slowest step between a sample and the page (sampling, batching, page refresh)."""
    slowest = max(float(config[k]) for k in _INTERVAL_KEYS if k in config) if config else 1.0
    return max(STALE_MIN_S, STALE_INTERVALS * slowest)


def freshness(newest_ts_s: float | None, now_s: float, config: Mapping[str, Any],
              agent: Mapping[str, Any] | None = None, clients: int | None = None,
              writers: int | None = None) -> dict[str, Any]:
    """``{"now_s", "newest_ts_s", "age_s", "stale_after_s", "state", "stale", "why",
    "agent_age_s", "clients"}``.

    ``agent``: the newest agent report (``agent_stats``: ``ts_s``, ``clients``, ``rows_per_s``,
    ``queue_depth``) of the host the data comes from, or None when the agent never reported.
    ``clients``: server processes connected now (default: the report's count). ``writers``:
    those of them that write this data (a device's processes), when known: connected and
    silent, they make it idle even while the agent writes other rows.
    No data is not stale (there is nothing to mistake for live), but ``newest_ts_s`` is None.
    ``why`` names who stopped reporting when stale: ``"agent"`` or ``"clients"``.
    ``newest_ts_s`` is the newest sample not ahead of ``now_s`` (``Store.time_range``'s
    ``not_after_s``): a row from a wrong clock, ahead of now, is not the newest real sample.
    """
    limit = stale_after_s(config)
    age = None if newest_ts_s is None else max(0.0, now_s - newest_ts_s)
    agent_age = None if agent is None else max(0.0, now_s - float(agent["ts_s"]))
    if clients is None and agent is not None:
        clients = int(agent["clients"])
    if writers is not None:
        clients = writers
    state, why = _state(age, limit, agent, agent_age, clients or 0, writers is not None)
    return {"now_s": now_s, "newest_ts_s": newest_ts_s, "age_s": age, "stale_after_s": limit,
            "state": state, "stale": state == "stale", "why": why, "agent_age_s": agent_age,
            "clients": clients}


def _state(age: float | None, limit: float, agent: Mapping[str, Any] | None,
           agent_age: float | None, clients: int, own: bool) -> tuple[str, str | None]:
    if age is None:
        return "no_data", None
    if age <= limit:
        return "live", None
    if agent is None or agent_age is None or agent_age > limit:
        return "stale", "agent"  # the agent stopped reporting (or never did, here)
    if own and clients > 0:
        return "idle", None  # this data's writers are connected and silent: no requests
    if float(agent.get("rows_per_s") or 0.0) > 0 or int(agent.get("queue_depth") or 0) > 0:
        return "catching_up", None  # rows are being written (or queued), none of them of now
    if clients > 0:
        return "idle", None  # connected and silent: a server without requests
    return "stale", "clients"  # the agent runs, but no server process reports to it


def connected(process: Mapping[str, Any], now_s: float, config: Mapping[str, Any]) -> bool:
    """Whether a server process is connected to the agent now: the agent moves a connected
    client's ``last_seen_s`` with each of its reports (every few seconds), so a row older than
    ``stale_after_s`` is a process that disconnected or ended."""
    return now_s - float(process["last_seen_s"]) <= stale_after_s(config)


def connected_count(pids: Iterable[int], processes: Mapping[int, Mapping[str, Any]],
                    now_s: float, config: Mapping[str, Any]) -> int | None:
    """How many of ``pids`` (a device's recent writers) are connected; None when none of them
    has a process row (NVML's view, a trace): then the agent's own count decides."""
    known = [processes[p] for p in pids if p in processes]
    if not known:
        return None
    return sum(1 for p in known if connected(p, now_s, config))


def process_state(process: Mapping[str, Any], now_s: float, config: Mapping[str, Any],
                  agent: Mapping[str, Any] | None) -> str:
    """``connected``, ``ended`` (the agent reports and this process is not among its clients
    any more: a restarted server's old pid) or ``unknown`` (no fresh agent report to tell)."""
    if connected(process, now_s, config):
        return "connected"
    if agent is not None and now_s - float(agent["ts_s"]) <= stale_after_s(config):
        return "ended"
    return "unknown"
