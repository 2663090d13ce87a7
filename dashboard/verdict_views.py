"""The Leaks and OOM risk views: the alert engine's stored verdicts for a window, beside the
series a chart draws (docs/dashboard.md, "Verdicts come from the store; figures from the
tiers").

Nothing here decides: a window's answer is each process's newest stored verdict at or before
the window's end, and its history in the window draws the forecast. The floor drawn is the one
the leading process's detector judged on (``verdicts.judged_floor``); the headroom line is a
downsampled series, drawn, never judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vramscope.agent.alerts.verdicts import Verdict
from vramscope.agent.analysis.diagnosis import cause_words
from vramscope.agent.analysis.severity import Severity, rank
from vramscope.agent.store import Store, reader
from vramscope.agent.store import verdicts as stored
from vramscope.agent.store.verdicts import leading, processes, window_leak_lead
from vramscope.agent.store.window_verdicts import NO_VERDICTS, leak_result
from vramscope.dashboard import figures

Settings = Mapping[str, Any] | None
CHART_BUCKETS = 600  # floor points a leak chart draws (its minima per bucket)
RISK_BUCKETS = 2000
RISK_COLUMNS = ("allocated_bytes", "reserved_bytes", "device_used_bytes", "device_total_bytes")
FROM_STORE = "the alert engine's stored verdicts"


def leaks_view(store: Store, config: Settings, device: int, host: str | None, start: float,
               end: float) -> dict[str, Any]:
    """The floor the leading process's detector judged on, as its stored verdicts carry it
    (never one drawn here from the samples), and the stored leak verdicts: the leading
    process's in ``result``, every process's in ``processes``."""
    from vramscope.dashboard.views import leak_makeup_view, orphan_events, window_param

    procs = processes(store, device, host, end)
    lead = window_leak_lead(procs, start)
    result = leak_result(lead)
    floor = [] if lead is None else stored.judged_floor(store, device, host, lead["pid"],
                                                        start, end)
    try:  # the limit line: the device's total, per bucket
        rows = reader.extrema(store, reader.Span(device, start, end, host),
                              ("device_total_bytes",), CHART_BUCKETS).rows
    except reader.WindowTooLong as exc:
        raise window_param(exc) from None
    limit = max((r["device_total_bytes_max"] or 0 for r in rows), default=0) or None
    line = result["trend_line"] if result["trend_line"] and result["trend_line"][0][0] >= start \
        else None
    names: tuple[str, str] = ("idle floor", "trend (Theil–Sen)")
    kv = result["kv_pool"]
    if kv is not None and kv["sets_slope"]:
        # the leak is the pool's orphaned blocks: the floor they make, as the engine stored
        # it, and the line at their rate (allocated memory, if any, does not show them)
        floor = [(t, b) for t, b in kv["floor"] if start <= t <= end]
        line = result["trend_line"]
        names = ("orphaned KV blocks", "at the pool's rate")
    figure = figures.leaks_figure(floor, line, limit, (start, end), *names)
    return {"figure": figure, "result": result,
            "processes": procs, "method": FROM_STORE, "verdicts_from": "store",
            "floor_points": len(floor), "limit_bytes": limit,
            "orphaned": orphan_events(store, device, host, start, end),
            "makeup": leak_makeup_view(store, config, device, host, start, end,
                                       result["start_ts_s"])}


def risk_now(v: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The risk answer of one process in the page's form."""
    if v is None or not v["risk"]["level"]:
        return None
    r = v["risk"]
    return {"ts_s": v["ts"], "level": r["level"], "reasons": r["reasons"], "cause": r["cause"],
            "at_risk_from_pid": r["at_risk_from_pid"], "cause_text": v["cause_text"],
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
    rows = reader.extrema(store, reader.Span(device, start, end, host), RISK_COLUMNS,
                          RISK_BUCKETS, ladder=False).rows
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
        # from no level yet (before the model's first point) to ok is no rise
        if rank(v.risk_level, "risk level") > max(rank(was, "risk level"), Severity.OK):
            who = "device" if v.pid is None else f"pid {v.pid}"
            why = cause_words(v.risk_cause, v.risk_at_risk_from_pid) \
                or ", ".join(v.risk_reasons) or "headroom"
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


__all__ = ["NO_VERDICTS", "leaks_view", "processes", "risk_view"]
