"""``vramscope status``: what the agent is doing now (asked over its socket), or, when it is
not running, the last state it wrote to the database."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from vramscope.agent.analysis.diagnosis import cause_words
from vramscope.agent.analysis.kv_leak import verdict_words
from vramscope.agent.cli.common import url_or_path

if TYPE_CHECKING:
    from vramscope.agent.config import Config


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("status", help="devices, clients, rows/s, queue, drops, rejected, DB size",
                       description="Ask the running agent for its state over its socket; when "
                                   "it is not running, show the last state it stored.")
    p.add_argument("--config", help="config file")
    p.add_argument("--socket", dest="socket_path", help="the agent's socket")
    p.add_argument("--db", dest="db_url", type=url_or_path,
                   help="database URL or SQLite file path (for the fallback)")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vramscope.agent.config import load_config
    from vramscope.agent.errors import VramscopeError

    config = load_config(args.config).replace(database__url=args.db_url,
                                              agent__socket_path=args.socket_path)
    try:
        status = live_status(config["agent.socket_path"])
    except (VramscopeError, OSError) as exc:
        status = stored_status(config, str(exc))
    status["verdicts"] = stored_verdicts(config)
    if args.json:
        json.dump(status, sys.stdout, indent=2, sort_keys=True, default=str)
        print()
    else:
        print(render(status) + _render_verdicts(status["verdicts"]))
    return 0 if status.get("running") else 1


def stored_verdicts(config: Config) -> list[dict[str, Any]]:
    """Each running process's newest stored verdict (the answer every page shows), from the
    database; none where it does not exist or cannot be read."""
    from vramscope.agent.store import Store
    from vramscope.agent.store import verdicts as stored
    from vramscope.agent.store.exists import missing_sqlite_file

    url = config["database.url"]
    if missing_sqlite_file(url) is not None:
        return []
    try:
        with Store.from_config(config) as st:
            return stored.newest_all(st, "*")
    except Exception:  # noqa: BLE001 - status still says what it knows without them
        return []


def _render_verdicts(verdicts: list[dict[str, Any]]) -> str:
    if not verdicts:
        return ""
    words = {"leak": "LEAK", "no_leak": "no leak", "insufficient_data": "not enough data yet"}
    lines = ["", "verdicts (the alert engine's, stored):"]
    for v in verdicts:
        who = "device" if v["pid"] is None else f"pid {v['pid']} ({v.get('name') or '?'})"
        leak = words.get(v["leak"]["state"], v["leak"]["state"])
        if v["leak"]["state"] == "leak":
            leak += " " + verdict_words(v["leak"])
        risk = v["risk"]["level"] or "not assessed yet"
        cause = cause_words(v["risk"]["cause"], v["risk"].get("at_risk_from_pid"))
        lines.append(f"  {v.get('host') or ''} GPU {v['device']} {who}: {leak}; OOM risk {risk}"
                     + (f" ({cause})" if cause else ""))
    return "\n".join(lines)


def live_status(socket_path: str) -> dict[str, Any]:
    from vramscope.agent.errors import VramscopeError
    from vramscope.agent.ingest.connection import AgentConnection

    with AgentConnection(socket_path, timeout_s=5.0) as conn:
        status = conn.status()
    if status.pop("type", None) != "status":  # an error frame: the agent refused us
        raise VramscopeError(f"the agent at {socket_path} answered: "
                             f"{status.get('message', status)}")
    return {"running": True, "socket": socket_path, **status}


def stored_status(config: Config, why: str) -> dict[str, Any]:
    from vramscope.agent.store import Store
    from vramscope.agent.store.exists import missing_sqlite_file

    url = config["database.url"]
    if missing_sqlite_file(url) is not None:
        return {"running": False, "why": why, "database": url, "devices": [],
                "db_size_bytes": None, "last_report": None, "missing": True}
    with Store.from_config(config) as st:
        last = st.latest_agent_stats()
        out = {"running": False, "why": why, "database": st.safe_url,
               "devices": [_stored_device(st, d) for d in st.devices()],
               "db_size_bytes": st.size_bytes(), "last_report": last}
    return out


def _stored_device(st: Any, d: dict[str, Any]) -> dict[str, Any]:
    """What the store knows of a device, with when its last record was taken."""
    out = {k: d[k] for k in ("device_index", "uuid", "name", "total_bytes")}
    span = st.time_range(d["device_index"])
    out["last_seen_ts"] = None if span is None else span[1]
    return out


def render(s: dict[str, Any]) -> str:
    if not s.get("running"):
        return _render_stored(s)
    lines = [f"agent: running (pid {s['pid']}), socket {s['socket']}",
             f"database: {s['database']}, {_size(s.get('db_size_bytes'))}"
             + (" — WRITES FAILING, retrying" if s.get("db_failing") else "")
             + (_catch_up(s.get("retention_catch_up")) if s.get("retention_backlog") else "")
             + _integrity(s.get("db_integrity"))]
    lines.append(f"devices: {len(s['devices'])}")
    for d in s["devices"]:
        lines.append(f"  {d['index']}: {d.get('name') or '?'} {d.get('uuid') or ''} "
                     f"{_size(d.get('total_bytes'))}")
    lines.append(f"clients: {len(s['clients'])}")
    for c in s["clients"]:
        lines.append(f"  pid {c['pid']}: {c.get('process') or '?'} devices {c.get('devices')}")
    lines += [f"rows/s: {s['rows_per_s']:.1f} (written {s['written_total']})",
              f"queue depth: {s['queue_depth']} (at risk: lost if the agent is killed now)",
              f"dropped: {s['dropped_total']} in the agent, {s['client_dropped_total']} "
              f"reported by clients",
              f"rejected messages: {s['rejected_total']}" + _by_reason(s.get("rejected")),
              f"refused by the database: {s.get('db_refused_total', 0)} records (dropped alone)"]
    if s.get("names"):
        lines.append(_names(s["names"]))
    return "\n".join(lines)


def _names(names: dict[str, Any]) -> str:
    """``live names: 0/8 hosts, 2/32 devices, 5/256 processes (idle after 300 s); refused
    records: processes 700``."""
    live, limits = names.get("live", {}), names.get("limits", {})
    kinds = ", ".join(f"{live.get(k, 0)}/{limits.get(k, '?')} {k}"
                      for k in ("hosts", "devices", "processes"))
    refused = ", ".join(f"{k} {v}" for k, v in sorted(names.get("refused", {}).items()))
    return (f"live names: {kinds} (idle after {names.get('idle_s', 0):g} s)"
            + (f"; refused records: {refused}" if refused else ""))


def _catch_up(progress: dict[str, Any] | None) -> str:
    """`` — retention catching up: 14.2 h behind, about 3 min left``."""
    if not progress:
        return " — retention catching up"
    text = f" — retention catching up: {progress['behind_s'] / 3600:.1f} h behind"
    eta = progress.get("eta_s")
    return text + (f", about {max(1, round(eta / 60))} min left" if eta is not None else "")


def _integrity(result: dict[str, Any] | None) -> str:
    if not result or result.get("ok"):
        return ""
    return f" — INTEGRITY CHECK FAILED: {result.get('problem')}"


def _by_reason(counts: dict[str, int] | None) -> str:
    """`` (names 3, schema 1)``: refusals by reason, the largest first; empty for none."""
    if not counts:
        return ""
    return " (" + ", ".join(f"{k} {v}" for k, v in
                            sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) + ")"


def _render_stored(s: dict[str, Any]) -> str:
    if s.get("missing"):
        return (f"agent: not running ({s['why']})\ndatabase: {s['database']} does not exist; "
                f"check --db or database.url, or start 'vramscope agent' (or 'vramscope demo', "
                f"'vramscope import FILE') to create it")
    lines = [f"agent: not running ({s['why']})",
             f"database: {s['database']}, {_size(s.get('db_size_bytes'))}",
             f"devices: {len(s['devices'])}" if s["devices"] else
             "devices: none recorded in this database"]
    lines += [f"  {d['device_index']}: {_known(d)}" for d in s["devices"]]
    last = s.get("last_report")
    if last is None:
        lines.append("last report: none stored")
    else:
        age = time.time() - last["ts_s"]
        lines.append(f"last report {age:.0f} s ago: clients {last['clients']}, rows/s "
                     f"{last['rows_per_s']:.1f}, queue depth {last['queue_depth']}, dropped "
                     f"{last['dropped_total']}, rejected {last['rejected_total']}"
                     + _by_reason(last.get("rejected_by_reason")))
    return "\n".join(lines)


def _known(d: dict[str, Any]) -> str:
    """A stored device as far as it is known: name, UUID, memory, when last seen; a device
    whose records came without NVML (a trace, a hook alone) is said to have no name."""
    from vramscope.agent.timefmt import iso_utc

    what = [x for x in (d.get("name"), d.get("uuid")) if x]
    if d.get("total_bytes"):
        what.append(f"{d['total_bytes'] / 2**30:.1f} GiB")
    text = ", ".join(what) or "no name or UUID recorded (its records came without NVML)"
    seen = d.get("last_seen_ts")
    if seen is None:
        return f"{text}; no samples stored"
    return f"{text}; last seen {iso_utc(seen)} ({_ago(time.time() - seen)})"


def _ago(age_s: float) -> str:
    if age_s < 120:
        return f"{max(age_s, 0):.0f} s ago"
    if age_s < 7200:
        return f"{age_s / 60:.0f} min ago"
    return f"{age_s / 3600:.1f} h ago" if age_s < 2 * 86400 else f"{age_s / 86400:.1f} days ago"


def _size(n: int | None) -> str:
    if n is None:
        return "size unknown"
    return f"{n / 2**20:.1f} MiB"
