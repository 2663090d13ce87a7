"""The fleet page and the Overview of a fleet: every device of every host in the order that
needs attention, and the same devices grouped by host.

Nothing here decides. A device's risk level, its time to OOM and its leak are its running
processes' answers as the alert engine stored them (:mod:`vramscope.agent.store.verdicts`,
read for the whole fleet at once by :func:`vramscope.agent.store.reader.fleet`): the process
the engine stored as leading each question (``verdicts.leading``, as on the OOM-risk and Leaks
pages) speaks for the device. Whether
its data is stale is :func:`vramscope.dashboard.verdict.freshness` of its newest sample and
its host's newest agent report. This module only orders and counts them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vramscope.agent.analysis.severity import rank
from vramscope.agent.store import Store, reader
from vramscope.agent.store.verdicts import leading
from vramscope.dashboard.verdict import freshness

# Devices beyond which the Overview groups them by host instead of one row (and two bars)
# each: 4 nodes of 8 GPUs still read as a table; 64 of them do not.
FLEET_OVERVIEW_DEVICES = 32
HOST_AT_RISK_SHOWN = 8  # devices needing attention a host group lists on the Overview


def attention_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """The fleet's reading order, the one place it is decided which device comes first: the
    stored OOM-risk level (critical, warning, ok, none), within a level the soonest time to
    OOM (none last), then a leak, then stale data, then host and index."""
    tto = row["time_to_oom_s"]
    return (-rank(row["level"] or "", "a fleet row's level"), tto is None, tto or 0.0,
            row["leak"] != "leak", not row["stale"], row["host"], row["device"])


def needs_attention(row: Mapping[str, Any]) -> bool:
    return row["level"] in ("warning", "critical") or row["leak"] == "leak" or row["stale"]


def device_row(d: reader.FleetDevice, report: Mapping[str, Any] | None,
               config: Mapping[str, Any], now_s: float) -> dict[str, Any]:
    """One device's fleet row: what it is, its stored answers, how fresh its data is."""
    risk = leading(d.processes, "risk")
    leak = leading(d.processes, "leak")
    fresh = freshness(d.newest_ts_s, now_s, config, report)
    level = risk["risk"]["level"] if risk else None
    return {"host": d.host, "device": d.device, "model": d.name, "uuid": d.uuid,
            "total_bytes": d.total_bytes,
            "level": level or None,
            "time_to_oom_s": risk["risk"]["time_to_oom_s"] if risk else None,
            "cause": risk["risk"]["cause"] if risk else None,
            "cause_text": risk["cause_text"] if risk else None,
            "risk_process": risk["process"] if risk and level else None,
            "leak": leak["leak"]["state"] if leak else None,
            "leak_slope_bytes_per_h": leak["leak"]["slope_bytes_per_h"] if leak else None,
            "leak_process": leak["process"] if leak and leak["leak"]["state"] == "leak"
            else None,
            "verdict_ts_s": max((p["ts"] for p in d.processes), default=None),
            "newest_ts_s": d.newest_ts_s, "last_sample_age_s": fresh["age_s"],
            "freshness": fresh["state"], "stale": fresh["stale"]}


def rows(store: Store, config: Mapping[str, Any], now_s: float) -> list[dict[str, Any]]:
    """Every device of every host, in :func:`attention_key`'s order."""
    read = reader.fleet(store, now_s)
    out = [device_row(d, read.reports.get(d.host), config, now_s) for d in read.devices]
    out.sort(key=attention_key)
    return out


def _counts(devices: list[dict[str, Any]]) -> dict[str, int]:
    return {"devices": len(devices),
            "critical": sum(r["level"] == "critical" for r in devices),
            "warning": sum(r["level"] == "warning" for r in devices),
            "leaking": sum(r["leak"] == "leak" for r in devices),
            "stale": sum(bool(r["stale"]) for r in devices)}


def host_groups(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The devices (in attention order) grouped by host, the host of the first device needing
    attention first: each group's counts and up to ``HOST_AT_RISK_SHOWN`` of its devices that
    need attention, in the same order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in devices:  # attention order: each group's first device is its worst
        groups.setdefault(r["host"], []).append(r)
    out = []
    for host, mine in groups.items():
        flagged = [r for r in mine if needs_attention(r)]
        out.append({"host": host, "models": sorted({r["model"] or "" for r in mine}),
                    **_counts(mine), "worst": mine[0]["level"],
                    "soonest_time_to_oom_s": min((r["time_to_oom_s"] for r in mine
                                                  if r["time_to_oom_s"] is not None),
                                                 default=None),
                    "attention": flagged[:HOST_AT_RISK_SHOWN],
                    "attention_more": max(0, len(flagged) - HOST_AT_RISK_SHOWN)})
    # dict order kept the first device's position: hosts come in their worst device's order,
    # except that a host with nothing to look at never precedes one that has something
    out.sort(key=lambda g: not g["attention"])
    return out


def document(store: Store, config: Mapping[str, Any], now_s: float, host: str | None = None,
             model: str | None = None) -> dict[str, Any]:
    """``/api/v1/fleet``: every device in attention order (``devices``, filtered by ``host``
    and GPU ``model`` when given), the filtered devices grouped by host (``hosts``), the
    counts of the filtered devices and of the whole fleet, and the filters' choices."""
    every = rows(store, config, now_s)
    shown = [r for r in every if (host is None or r["host"] == host)
             and (model is None or r["model"] == model)]
    return {"now_s": now_s, "filters": {"host": host, "model": model},
            "choices": {"hosts": sorted({r["host"] for r in every}),
                        "models": sorted({r["model"] for r in every if r["model"]})},
            "fleet": _counts(every), "counts": _counts(shown),
            "devices": shown, "hosts": host_groups(shown),
            "verdicts_from": "store"}
