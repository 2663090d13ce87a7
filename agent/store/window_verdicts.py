"""A window's stored verdicts in an analysis document: what fills its verdict fields.

``analyze --db`` (:func:`attach_stored`) and ``/api/v1/analysis`` (:func:`attach_window`) run no
engine over what retention left: every verdict field is what the engine stored as it saw every
record. The reads are ``agent/store/verdicts.py``'s; this module only puts them in form.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vramscope.agent.analysis.growth import GROWTH_KEYS
from vramscope.agent.analysis.severity import Severity, rank, worst
from vramscope.agent.store.verdicts import history, leading, processes, window_leak_lead

if TYPE_CHECKING:
    from vramscope.agent.store import Store

NO_VERDICTS = ("no verdict stored for this device up to the window's end: the agent writes "
               "them as it runs, `vramscope import` as it loads a trace")
ALERT_READ_LIMIT = 1_000  # a window's stored alerts an analysis document shows


def leak_result(v: Mapping[str, Any] | None) -> dict[str, Any]:
    """The leak answer of one process in the page's form (a stored verdict, never refit)."""
    if v is None:
        return {"detected": False, "state": "no_verdict", "span_s": 0.0, "slope_bytes_per_s": 0.0,
                "slope_bytes_per_h": 0.0, "start_ts_s": None, "first_detected_ts_s": None,
                "evidence": NO_VERDICTS, "trend_line": None, "pid": None, "process": None,
                "verdict_ts_s": None, "estimated_floor": False, **dict.fromkeys(GROWTH_KEYS),
                "orphaned_blocks": 0, "kv_pool": None, "ended": False}
    leak = v["leak"]
    return {"detected": leak["state"] == "leak", "state": leak["state"], "span_s": leak["span_s"],
            "slope_bytes_per_s": leak["slope_bytes_per_s"],
            "slope_bytes_per_h": leak["slope_bytes_per_h"], "start_ts_s": leak["start_ts"],
            "first_detected_ts_s": leak["first_detected_ts"], "evidence": leak["evidence"],
            "trend_line": leak["trend_line"], "pid": v["pid"], "process": v["process"],
            "verdict_ts_s": v["ts"], "estimated_floor": leak["estimated_floor"],
            **{k: leak.get(k) for k in GROWTH_KEYS},
            "orphaned_blocks": leak.get("orphaned_blocks", 0), "kv_pool": leak.get("kv_pool"),
            "ended": bool(v.get("ended"))}


def attach_stored(doc: dict[str, Any], store: Store, device: int, host: str | None,
                  start: float, end: float) -> dict[str, Any]:
    """Put the stored verdicts in an analysis document's place for ``device`` in [start, end]
    (``analyze --db`` ran the engine on what retention left: it may not speak for the engine
    that saw every record): the leak answer and its windows (where a row keeps them),
    ``processes`` and the OOM risk's level, first warning and shortest forecast. Returns
    the leak answer of the process the document speaks for (:func:`leak_result`)."""
    d = doc["devices"].setdefault(str(device), {})
    procs = processes(store, device, host, end)
    d["processes"] = procs
    doc["verdicts_from"] = "store"
    lead = leak_result(window_leak_lead(procs, start))
    leak = d.setdefault("leak", {})
    windows = stored_windows(procs, lead["pid"])
    if windows is not None:  # a store written before verdicts kept them: the engine's stand
        leak["windows"] = windows
    leak.update(detected=lead["detected"], state=lead["state"],
                slope_bytes_per_s=lead["slope_bytes_per_s"],
                first_detected_ts=lead["first_detected_ts_s"], span_s=lead["span_s"],
                evidence=lead["evidence"], pid=lead["pid"],
                estimated_floor=lead["estimated_floor"],
                **{k: lead[k] for k in (*GROWTH_KEYS, "orphaned_blocks", "kv_pool")})
    rows = history(store, device, host, start, end)
    oom = d.setdefault("oom", {})
    levels = [v.risk_level for v in rows if v.risk_level] + [
        p["risk"]["level"] for p in procs if p["risk"]["level"] and not p["ended"]]
    warned = [v.ts_s for v in rows if rank(v.risk_level, "risk level") >= Severity.WARNING]
    ttos = [v.time_to_oom_s for v in rows if v.time_to_oom_s is not None]
    oom.update(max_risk=worst(levels, "risk level").label if levels else None,
               first_warning_ts=min(warned, default=None),
               min_time_to_oom_s=min(ttos, default=None))
    return lead


def stored_windows(procs: Sequence[Mapping[str, Any]], pid: int | None) -> dict[str, Any] | None:
    """The windows the leak detector chose, as the headline's process's row keeps them, else
    as any process's row does (each process's detector chooses its own from the same server;
    one without a leak is not the headline, but it chose them all the same). None where no
    row keeps them."""
    ordered = sorted(procs, key=lambda p: p["pid"] != pid)
    return next((p["leak"]["windows"] for p in ordered if p["leak"].get("windows")), None)


def attach_window(doc: dict[str, Any], store: Store, device: int, host: str | None,
                  start: float, end: float) -> dict[str, Any]:
    """Every verdict field of an analysis document of ``device`` in [start, end] from the
    store (the dashboard's: its summaries are the window's records',
    ``analysis.report.summaries_document``, and no engine runs): :func:`attach_stored`'s, and

    - where no verdict is stored up to ``end``: leak ``insufficient_data`` with
      :data:`NO_VERDICTS` as its evidence (``processes`` empty, ``max_risk`` null);
    - ``leak.windows``: the stored windows (:func:`stored_windows`), null where no row
      keeps them (a store written before rows kept them);
    - ``alerts``: the alerts the agent stored for the window (:func:`stored_alerts`), and
      ``alerts_from`` ``"agent"``, or ``"none_stored"`` where the store holds no alert of the
      device at all (none fired, or a store imported before ``import`` kept alerts);
    - ``oom.first_warning_ts``: the first stored warning, or the first stored
      ``kv_exhaustion`` alert in the window when sooner;
    - ``oom.cause``, for an OOM without a post-mortem's cause: the likely cause the engine
      stored with its warning at the OOM (the riskiest process's newest verdict at or before
      it), else null.

    Returns the leak answer of the process the document speaks for (:func:`leak_result`)."""
    from vramscope.agent.analysis.report import KV_WARNING_RULE

    lead = attach_stored(doc, store, device, host, start, end)
    d = doc["devices"][str(device)]
    leak, oom = d["leak"], d["oom"]
    leak.setdefault("windows", None)
    if not d["processes"]:
        leak.update(state="insufficient_data", evidence=NO_VERDICTS)
    alerts = stored_alerts(store, device, host, start, end)
    doc.update(alerts=alerts or [], alerts_from="none_stored" if alerts is None else "agent")
    warned = [a["fired_ts"] for a in alerts or () if a["rule"] == KV_WARNING_RULE
              and a["fired_ts"] >= start]
    if oom.get("first_warning_ts") is not None:
        warned.append(oom["first_warning_ts"])
    oom["first_warning_ts"] = min(warned, default=None)
    if oom.get("first_oom_ts") is not None and oom.get("cause") is None:
        oom["cause"] = _warned_cause(store, device, host, oom["first_oom_ts"])
    return lead


def _warned_cause(store: Store, device: int, host: str | None, at_s: float) -> str | None:
    """The likely cause the engine stored with its warning at ``at_s``: the newest verdict at
    or before it of the process the engine stored as the riskiest (:func:`leading`)."""
    lead = leading(processes(store, device, host, at_s), "risk")
    return lead["risk"]["cause"] if lead is not None else None


def stored_alerts(store: Store, device: int, host: str | None, start: float,
                  end: float) -> list[dict[str, Any]] | None:
    """The alerts the live agent stored for the window (fired in it, or still open at its
    start), oldest first, in the analysis document's form; None when the store holds none of
    this device at all. The engine that stored them (the agent's, or ``vramscope import``'s)
    saw every raw sample: its alerts are the window's, and nothing replays them."""
    if not store.alerts(device=device, host=host, limit=1):
        return None
    rows = store.alerts(device=device, host=host, end_s=end, limit=ALERT_READ_LIMIT)
    kept = [a for a in rows if a["fired_ts_s"] >= start
            or a["resolved_ts_s"] is None or a["resolved_ts_s"] >= start]
    return [{"rule": a["rule"], "severity": a["severity"], "device": device,
             "fired_ts": a["fired_ts_s"], "resolved_ts": a["resolved_ts_s"]}
            for a in sorted(kept, key=lambda a: a["fired_ts_s"])]
