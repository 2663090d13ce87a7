"""The Leaks and OOM risk views: the alert engine's stored verdicts for a window, beside the
series a chart draws.

Nothing here decides. The answers (leak state, slope, first detection; risk level, time to OOM
with its range, cause) are the rows the engine wrote as it evaluated every record
(:mod:`vramscope.agent.store.verdicts`: the live agent, ``import``): a window's answer is each
process's newest verdict at or before the window's end, and its history in the window draws
the forecast. The floor and headroom lines are downsampled series, drawn, never judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vramscope.agent.alerts.verdicts import Verdict
from vramscope.agent.store import Store
from vramscope.agent.store import verdicts as stored
from vramscope.agent.store.downsample import tier_grid
from vramscope.dashboard import figures, queries

Settings = Mapping[str, Any] | None
CHART_BUCKETS = 600  # floor points a leak chart draws (its minima per bucket)
RISK_BUCKETS = 2000
RISK_COLUMNS = ("allocated_bytes", "reserved_bytes", "device_used_bytes", "device_total_bytes")
FROM_STORE = "the alert engine's stored verdicts"
NO_VERDICTS = ("no verdict stored for this device up to the window's end: the agent writes "
               "them as it runs, `vramscope import` as it loads a trace")
_LEVEL_RANK = {"": -1, "ok": 0, "warning": 1, "critical": 2}


def processes(store: Store, device: int, host: str | None, end: float) -> list[dict[str, Any]]:
    """Each process's answer at ``end`` (``vramscope.verdict/1`` plus its name and whether it
    has ended), the device-wide one first."""
    rows = stored.latest(store, device, host, end)
    if not rows:
        return []
    names = {p["pid"]: p for p in store.processes(host=host or store.host_name)}
    out = []
    for v in rows:
        doc = v.to_json()
        p = names.get(v.pid) if v.pid is not None else None
        doc.update(name=(p or {}).get("name"), model=(p or {}).get("model"),
                   process=_who(v, p), ended=stored.ended(v, rows))
        out.append(doc)
    return out


def _who(v: Verdict, p: Mapping[str, Any] | None) -> str:
    if v.pid is None:
        return "the device (no process)"
    label = queries.process_label(dict(p)) if p else "unknown"
    return f"{label} (pid {v.pid})"


def leading(procs: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    """The process a page's headline speaks for: for ``leak``, a leak, then one ever
    detected, then the steepest; for ``risk``, the riskiest level, then the soonest OOM. Live
    processes before ended ones (the engine's own order: alerts name the same process)."""
    if not procs:
        return None
    if kind == "leak":
        return max(procs, key=lambda d: (not d["ended"], d["leak"]["state"] == "leak",
                                         d["leak"]["first_detected_ts"] is not None,
                                         d["leak"]["slope_bytes_per_s"]))
    return max(procs, key=lambda d: (not d["ended"], _LEVEL_RANK.get(d["risk"]["level"], -1),
                                     -(d["risk"]["time_to_oom_s"] or float("inf"))))


def leak_result(v: Mapping[str, Any] | None) -> dict[str, Any]:
    """The leak answer of one process in the page's form (a stored verdict, never refit)."""
    if v is None:
        return {"detected": False, "state": "no_verdict", "span_s": 0.0, "slope_bytes_per_s": 0.0,
                "slope_bytes_per_h": 0.0, "start_ts_s": None, "first_detected_ts_s": None,
                "evidence": NO_VERDICTS, "trend_line": None, "pid": None, "process": None,
                "verdict_ts_s": None}
    leak = v["leak"]
    return {"detected": leak["state"] == "leak", "state": leak["state"], "span_s": leak["span_s"],
            "slope_bytes_per_s": leak["slope_bytes_per_s"],
            "slope_bytes_per_h": leak["slope_bytes_per_h"], "start_ts_s": leak["start_ts"],
            "first_detected_ts_s": leak["first_detected_ts"], "evidence": leak["evidence"],
            "trend_line": leak["trend_line"], "pid": v["pid"], "process": v["process"],
            "verdict_ts_s": v["ts"]}


def leaks_view(store: Store, config: Settings, device: int, host: str | None, start: float,
               end: float) -> dict[str, Any]:
    """The idle floor drawn (per-bucket minima of allocated) and the stored leak verdicts:
    the leading process's in ``result``, every process's in ``processes``."""
    from vramscope.dashboard.views import leak_makeup_view, orphan_events, tier_width

    procs = processes(store, device, host, end)
    lead = leading(procs, "leak")
    result = leak_result(lead)
    # a floor point a minute at least (the minimum over a request cycle), more for long windows
    width = tier_width(end - start, CHART_BUCKETS)
    rows = store.timeline(device, start, end, CHART_BUCKETS,
                          ("allocated_bytes", "device_total_bytes"), host=host, lasts=False,
                          width_s=width)
    floor = [(r["ts_s"], r["allocated_bytes_min"]) for r in rows
             if r["allocated_bytes_min"] is not None]
    limit = max((r["device_total_bytes_max"] or 0 for r in rows), default=0) or None
    line = result["trend_line"] if result["trend_line"] and result["trend_line"][0][0] >= start \
        else None
    return {"figure": figures.leaks_figure(floor, line, limit), "result": result,
            "processes": procs, "method": FROM_STORE, "verdicts_from": "store",
            "floor_points": len(floor), "limit_bytes": limit,
            "orphaned": orphan_events(store, device, host, start, end),
            "makeup": leak_makeup_view(store, config, device, host, start, end,
                                       result["start_ts_s"])}


def _width(start: float, end: float, buckets: int) -> float | None:
    grid = tier_grid(start, end, buckets)
    return grid[1] if grid else None


def risk_now(v: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The risk answer of one process in the page's form."""
    if v is None or not v["risk"]["level"]:
        return None
    r = v["risk"]
    return {"ts_s": v["ts"], "level": r["level"], "reasons": r["reasons"], "cause": r["cause"],
            "headroom_bytes": r["headroom_bytes"], "time_to_oom_s": r["time_to_oom_s"],
            "time_to_oom_low_s": r["time_to_oom_low_s"],
            "time_to_oom_high_s": r["time_to_oom_high_s"], "pid": v["pid"],
            "process": v["process"]}


def risk_view(store: Store, config: Mapping[str, Any], device: int, host: str | None,
              start: float, end: float) -> dict[str, Any]:
    """Headroom drawn over time, the stored forecasts in the window, the warnings the agent
    fired, and the stored verdicts at the window's end."""
    procs = processes(store, device, host, end)
    now = risk_now(leading(procs, "risk"))
    width = _width(start, end, RISK_BUCKETS)
    rows = store.timeline(device, start, end, RISK_BUCKETS, RISK_COLUMNS, host=host,
                          lasts=False, width_s=width)
    headroom = _headroom(rows)
    limit = max((r["device_total_bytes_max"] or 0 for r in rows), default=0) or None
    history = stored.history(store, device, host, start, end)
    # the alerts the agent fired; a store without an agent's alerts (imported), the stored
    # verdicts' level rises
    fired = _fired(store, device, host, start, end)
    warnings = sorted(fired if store.alerts(device=device, host=host or store.host_name,
                                            limit=1) else _rises(history),
                      key=lambda w: w["ts"])
    levels = {"warning": config["alerts.headroom_warning_ratio"],
              "critical": config["alerts.headroom_critical_ratio"]}
    figure = figures.risk_figure(headroom, _forecast(history), warnings, limit, levels,
                                 config["alerts.time_to_oom_warning_s"])
    return {"figure": figure, "warnings": warnings, "forecast_method": FROM_STORE,
            "verdicts_from": "store", "limit_bytes": limit, "now": now, "processes": procs,
            "latest_headroom_bytes": headroom["bytes"][-1] if headroom["bytes"] else None}


def _headroom(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    ts, free = [], []
    for r in rows:
        limit = r["device_total_bytes_max"]
        used = max(r["reserved_bytes_max"] or 0, r["device_used_bytes_max"] or 0)
        if limit:
            ts.append(r["ts_s"])
            free.append(max(0, limit - used))
    return {"ts": ts, "bytes": free}


def _forecast(history: list[Verdict]) -> dict[str, list[Any]]:
    """The stored forecasts, at each verdict the soonest of the device's processes."""
    out: dict[str, list[Any]] = {"ts": [], "time_to_oom_s": [], "low_s": [], "high_s": []}
    for v in history:
        if v.time_to_oom_s is None:
            continue
        if out["ts"] and out["ts"][-1] == v.ts_s:
            if v.time_to_oom_s >= out["time_to_oom_s"][-1]:
                continue
            for k in out:
                out[k].pop()
        out["ts"].append(v.ts_s)
        out["time_to_oom_s"].append(v.time_to_oom_s)
        out["low_s"].append(v.time_to_oom_low_s)
        out["high_s"].append(v.time_to_oom_high_s)
    return out


def _rises(history: list[Verdict]) -> list[dict[str, Any]]:
    """Where a process's stored risk level went up (its answer, before or without an alert)."""
    out: list[dict[str, Any]] = []
    before: dict[int | None, str] = {}
    for v in history:
        was = before.get(v.pid, "ok")
        if _LEVEL_RANK.get(v.risk_level, 0) > _LEVEL_RANK.get(was, 0):
            who = "device" if v.pid is None else f"pid {v.pid}"
            why = v.risk_cause or ", ".join(v.risk_reasons) or "headroom"
            out.append({"ts": v.ts_s, "severity": v.risk_level, "rule": "risk verdict",
                        "label": f"risk verdict [{who}]: {v.risk_level} ({why})"})
        before[v.pid] = v.risk_level
    return out


def _fired(store: Store, device: int, host: str | None, start: float,
           end: float) -> list[dict[str, Any]]:
    out = []
    for a in store.alerts(host=host or store.host_name, device=device, start_s=start,
                          end_s=end, limit=10_000):
        out.append({"ts": a["fired_ts_s"], "severity": a["severity"], "rule": a["rule"],
                    "label": f"{a['rule']}: {a['message'] or ''}"[:300]})
    return out


def attach_stored(doc: dict[str, Any], store: Store, device: int, host: str | None,
                  start: float, end: float) -> None:
    """Put the stored verdicts in an analysis document's place for ``device`` (the document's
    own engine ran on a tier's buckets: a coarse replay that must not speak for the agent)."""
    d = doc["devices"].setdefault(str(device), {})
    procs = processes(store, device, host, end)
    d["processes"] = procs
    doc["verdicts_from"] = "store"
    lead = leak_result(leading(procs, "leak"))
    leak = d.setdefault("leak", {})
    leak.update(detected=lead["detected"], state=lead["state"],
                slope_bytes_per_s=lead["slope_bytes_per_s"],
                first_detected_ts=lead["first_detected_ts_s"], span_s=lead["span_s"],
                evidence=lead["evidence"], pid=lead["pid"])
    history = stored.history(store, device, host, start, end)
    oom = d.setdefault("oom", {})
    levels = [v.risk_level for v in history if v.risk_level] + [
        p["risk"]["level"] for p in procs if p["risk"]["level"] and not p["ended"]]
    warned = [v.ts_s for v in history if v.risk_level in ("warning", "critical")]
    ttos = [v.time_to_oom_s for v in history if v.time_to_oom_s is not None]
    oom.update(max_risk=max(levels, key=lambda lv: _LEVEL_RANK.get(lv, -1)) if levels else None,
               first_warning_ts=min(warned, default=None),
               min_time_to_oom_s=min(ttos, default=None))
