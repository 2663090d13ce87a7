"""The stored verdicts (table ``verdicts``, migration 0010): written by whoever runs the alert
engine over records, read by every surface.

A window's answer is, per process, the newest verdict at or before its end (:func:`latest`); its
history (:func:`history`) draws the forecast and the state changes; neither reads a sample.
Which process leads a question is the engine's stored choice (``device_verdicts``, migration
0014), never chosen here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import and_, func, insert, select, true, union_all
from vramscope.agent.alerts.verdicts import (
    HEARTBEAT_S,
    DeviceVerdict,
    Verdict,
    verdict_from_json,
)
from vramscope.agent.analysis.diagnosis import cause_words
from vramscope.agent.store.schema import device_verdicts, devices, hosts, verdicts
from vramscope.agent.store.store import stored_json

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from vramscope.agent.store import Store

NEWEST_READ = 4  # rows read at a process's newest instant (two writes of one instant, damage)
HISTORY_LIMIT = 20_000  # verdict rows one window's history reads (a week of one process: ~4k)
# A process whose newest verdict says it ended, or is this much older than its device's newest
# (rows written before the engine wrote an ended row), has ended.
ENDED_AFTER_S = 2 * HEARTBEAT_S
# Parsed rows kept by their stored text: a stored verdict never changes and a Verdict is
# immutable, so the Overview and /metrics of a 512-device fleet, which read every device's
# newest rows on each request, parse each row once instead of on every request (about 80 ms
# a request at 513 rows). Four times the fleet's 512 running processes; a bounded LRU (a
# row and its Verdict hold about 3 kB: some 6 MB when full), so an old window's rows read once
# leave it again.
PARSED_ROWS = 2048


def write(store: Store, rows: Sequence[Verdict | DeviceVerdict],
          conn: Connection | None = None) -> int:
    """Store ``rows``, the processes' verdicts and the devices' (``VerdictLog.take``'s), in
    the caller's transaction when ``conn`` is given."""
    if not rows:
        return 0
    values = [{"device_id": store.device_id(v.device, v.host, conn), "pid": v.pid,
               "ts_s": v.ts_s, "leak_state": v.leak_state, "risk_level": v.risk_level,
               "doc": json.dumps(v.to_json(stored=True), separators=(",", ":"))}
              for v in rows if isinstance(v, Verdict)]
    answers = [{"device_id": store.device_id(v.device, v.host, conn), "ts_s": v.ts_s,
                "level": v.level, "risk_pid": v.risk_pid, "leak_pid": v.leak_pid,
                "config_check": None if v.config_check is None
                else json.dumps(v.config_check, separators=(",", ":"))}
               for v in rows if isinstance(v, DeviceVerdict)]
    if conn is not None:
        _insert(conn, values, answers)
    else:
        with store.engine.begin() as c:
            _insert(c, values, answers)
    return len(rows)


def _insert(c: Connection, values: list[dict[str, Any]], answers: list[dict[str, Any]]) -> None:
    if values:
        c.execute(insert(verdicts), values)
    if answers:
        c.execute(insert(device_verdicts), answers)


def device_answer(store: Store, device: int, host: str | None,
                  at_s: float) -> DeviceVerdict | None:
    """The device's newest answer at or before ``at_s`` (its level and leading processes, as
    the engine chose them; one seek), None where none is stored (before the agent's first
    row, or a store written before migration 0014)."""
    did = store.known_device_id(device, host)
    if did is None:
        return None
    dv = device_verdicts
    q = (select(dv.c.ts_s, dv.c.level, dv.c.risk_pid, dv.c.leak_pid, dv.c.config_check)
         .where(dv.c.device_id == did, dv.c.ts_s <= at_s)
         .order_by(dv.c.ts_s.desc(), dv.c.id.desc()).limit(1))
    with store.engine.connect() as c:
        row = c.execute(q).first()
    return None if row is None else _answer(device, host, *row)


def _answer(device: int, host: str | None, ts: float, level: str, risk_pid: int | None,
            leak_pid: int | None, check: str | None) -> DeviceVerdict:
    """A ``device_verdicts`` row as the engine wrote it (a check that does not read as an
    object is none)."""
    doc = stored_json(check) if check is not None else None
    return DeviceVerdict(ts, device, host, level, risk_pid, leak_pid,
                         doc if isinstance(doc, dict) else None)


def _newest_answer(at_s: float) -> Any:
    """The id of each device's newest ``device_verdicts`` row at or before ``at_s``, as a
    scalar subquery correlated with ``devices``."""
    inner = device_verdicts.alias("newest_answer")
    return (select(inner.c.id).where(inner.c.device_id == devices.c.id, inner.c.ts_s <= at_s)
            .order_by(inner.c.ts_s.desc(), inner.c.id.desc()).limit(1).correlate(devices)
            .scalar_subquery())


def latest(store: Store, device: int, host: str | None, at_s: float) -> list[Verdict]:
    """Each process's newest verdict at or before ``at_s`` on the device, by pid (the device
    as a whole, ``pid`` None, first).

    By index seeks, not by grouping the device's rows: its pids one after the other (the
    next pid above the last, on ``ix_verdicts_device_pid_ts``: one recursive statement),
    then each pid's newest rows at or before ``at_s`` (one statement, a limited range of the
    index a pid, and the device-wide rows'); a week of rows costs what an hour does (a GROUP
    BY would read every row of the device's history, on every Overview request)."""
    did = store.known_device_id(device, host)
    if did is None:
        return []
    on_device = verdicts.c.device_id == did
    walk = select(func.min(verdicts.c.pid).label("pid")).where(on_device).cte(
        "pid_walk", recursive=True)
    after = verdicts.alias("next_pid")
    walk = walk.union_all(
        select(select(func.min(after.c.pid)).where(after.c.device_id == did,
                                                   after.c.pid > walk.c.pid)
               .scalar_subquery()).where(walk.c.pid.is_not(None)))
    found: dict[int | None, Verdict] = {}
    with store.engine.connect() as c:
        pids = [r[0] for r in c.execute(select(walk.c.pid).where(walk.c.pid.is_not(None)))]
        arms = [select(verdicts.c.pid, verdicts.c.doc, verdicts.c.ts_s, verdicts.c.id)
                .where(on_device, verdicts.c.pid.is_(None) if pid is None
                       else verdicts.c.pid == pid, verdicts.c.ts_s <= at_s)
                .order_by(verdicts.c.ts_s.desc(), verdicts.c.id.desc())
                .limit(NEWEST_READ).subquery().select() for pid in [None, *pids]]
        by_pid: dict[int | None, list[Any]] = {}
        for r in c.execute(union_all(*arms)).all():
            by_pid.setdefault(r[0], []).append(r)
    for rows in by_pid.values():
        rows.sort(key=lambda r: (r[2], r[3]), reverse=True)  # newest first, as each was read
        # two rows of one instant: the later written; a damaged one: the one before it
        v = next((v for _, doc, ts, _ in rows if ts == rows[0][2]
                  and (v := _verdict(doc)) is not None), None)
        if v is not None:
            found[v.pid] = v
    return sorted(found.values(), key=lambda v: (v.pid is not None, v.pid or 0))


def history(store: Store, device: int, host: str | None, start_s: float, end_s: float,
            limit: int = HISTORY_LIMIT) -> list[Verdict]:
    """The device's verdicts in [start_s, end_s], oldest first (at most ``limit``: the newest)."""
    did = store.known_device_id(device, host)
    if did is None:
        return []
    q = (select(verdicts.c.doc).where(verdicts.c.device_id == did,
                                      verdicts.c.ts_s >= start_s, verdicts.c.ts_s <= end_s)
         .order_by(verdicts.c.ts_s.desc(), verdicts.c.id.desc()).limit(limit))
    with store.engine.connect() as c:
        docs = [r[0] for r in c.execute(q)]
    out = [v for v in map(_verdict, reversed(docs)) if v is not None]
    return out


def judged_floor(store: Store, device: int, host: str | None, pid: int | None, start_s: float,
                 end_s: float) -> list[tuple[float, int]]:
    """The floor points process ``pid``'s leak detector made in [start_s, end_s], oldest
    first, as its rows carry them (each row the points since the one before: the rows up to a
    heartbeat after ``end_s`` hold the window's last points); the floor its verdicts were made
    on, which the pages draw. One range on ``ix_verdicts_device_pid_ts``, at most
    ``HISTORY_LIMIT`` rows (the oldest left out beyond)."""
    did = store.known_device_id(device, host)
    if did is None:
        return []
    same = verdicts.c.pid.is_(None) if pid is None else verdicts.c.pid == pid
    q = (select(verdicts.c.doc)
         .where(verdicts.c.device_id == did, same, verdicts.c.ts_s >= start_s,
                verdicts.c.ts_s <= end_s + HEARTBEAT_S)
         .order_by(verdicts.c.ts_s.desc(), verdicts.c.id.desc()).limit(HISTORY_LIMIT))
    with store.engine.connect() as c:
        docs = [r[0] for r in c.execute(q)]
    points = {p for v in map(_verdict, docs) if v is not None for p in v.leak_floor
              if start_s <= p[0] <= end_s}
    return sorted(points)


def has_any(store: Store, device: int | None = None, host: str | None = None) -> bool:
    """Whether any verdict is stored (for the device, when given)."""
    q = select(verdicts.c.id).limit(1)
    if device is not None:
        did = store.known_device_id(device, host)
        if did is None:
            return False
        q = q.where(verdicts.c.device_id == did)
    with store.engine.connect() as c:
        return c.execute(q).first() is not None


def newest_all(store: Store, host: str | None = None) -> list[dict[str, Any]]:
    """Every device's running processes' newest verdicts (``/metrics``, ``status``): per
    device its :func:`processes` at its newest verdict, the ended ones left out, each with
    its ``host``."""
    q = (select(devices.c.device_index, hosts.c.name, func.max(verdicts.c.ts_s))
         .join(devices, devices.c.id == verdicts.c.device_id)
         .join(hosts, hosts.c.id == devices.c.host_id)
         .group_by(devices.c.device_index, hosts.c.name))
    if host not in (None, "*"):
        q = q.where(hosts.c.name == host)
    with store.engine.connect() as c:
        tops = [tuple(r) for r in c.execute(q)]
    out: list[dict[str, Any]] = []
    for device, host_name, newest in sorted(tops, key=lambda t: (t[1], t[0])):
        out += [{**doc, "host": host_name}
                for doc in processes(store, device, host_name, newest) if not doc["ended"]]
    return out


def current(rows: list[Verdict]) -> list[Verdict]:
    """Of a device's :func:`latest` rows, those of processes that have not ended."""
    return [v for v in rows if not ended(v, rows)]


def ended(v: Verdict, rows: list[Verdict]) -> bool:
    """``v``'s process has ended: its last row says so, or its device went on writing verdicts
    without it."""
    newest = max(r.ts_s for r in rows)
    return v.ended or v.ts_s < newest - ENDED_AFTER_S


@lru_cache(maxsize=PARSED_ROWS)
def _verdict(doc: str) -> Verdict | None:
    """A stored row's verdict, None where it is damaged (cached: see ``PARSED_ROWS``)."""
    parsed = stored_json(doc)
    if not isinstance(parsed, dict):
        return None
    try:
        return verdict_from_json(parsed)
    except (KeyError, TypeError, ValueError):
        return None  # a damaged row is not an answer


def processes(store: Store, device: int, host: str | None, end: float) -> list[dict[str, Any]]:
    """Each process's answer at ``end`` (``vramscope.verdict/1`` plus its name and whether it
    has ended), the device-wide one first."""
    rows = latest(store, device, host, end)
    if not rows:
        return []
    names = {p["pid"]: p for p in store.processes(host=host or store.host_name)}
    return mark_leads([process_doc(v, names, ended(v, rows)) for v in rows],
                      device_answer(store, device, host, end))


def mark_leads(docs: list[dict[str, Any]], answer: DeviceVerdict | None) -> list[dict[str, Any]]:
    """Each process document's ``leads``: the questions (``risk``, ``leak``) the engine's
    stored device answer says it leads. Where none is stored (a window before the agent's
    first device row), a device with one running process is led by it: there was nothing to
    choose; with several, none leads (no surface chooses in the engine's place)."""
    running = [d for d in docs if not d["ended"]]
    for d in docs:
        if answer is not None:
            d["leads"] = answer.leads(d["pid"]) if not d["ended"] else []
        else:
            d["leads"] = ["risk", "leak"] if len(running) == 1 and d is running[0] else []
    return docs


def process_doc(v: Verdict, names: Mapping[int, Mapping[str, Any]],
                has_ended: bool) -> dict[str, Any]:
    """One process's answer as the pages show it: ``vramscope.verdict/1`` plus its name,
    model and label from the host's processes table (``names``, by pid), ``ended`` and
    ``cause_text``, its risk cause as every surface prints it (``diagnosis.cause_words``)."""
    doc = v.to_json()
    p = names.get(v.pid) if v.pid is not None else None
    label = "device" if v.pid is None else process_label(p or {"rank": v.rank})
    doc.update(name=(p or {}).get("name"), model=(p or {}).get("model"), label=label,
               process=("the device (no process)" if v.pid is None
                        else f"{label} (pid {v.pid})"),
               ended=has_ended, cause_text=cause_words(v.risk_cause, v.risk_at_risk_from_pid))
    return doc


def fleet_current(store: Store, at_s: float,
                  listed: list[dict[str, Any]] | None = None
                  ) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Every device's running processes' answers at ``at_s``: :func:`fleet_verdicts`'
    ``processes``."""
    return fleet_verdicts(store, at_s, listed).processes


class FleetVerdicts(NamedTuple):
    """The whole fleet's stored answers at one instant, by ``(host, device index)``."""

    processes: dict[tuple[str, int], list[dict[str, Any]]]
    devices: dict[tuple[str, int], DeviceVerdict]


def fleet_verdicts(store: Store, at_s: float,
                   listed: list[dict[str, Any]] | None = None) -> FleetVerdicts:
    """Every device's running processes' answers at ``at_s`` (what :func:`processes` gives
    each device, the ended ones left out, each marked with the ``leads`` of its device's
    stored answer) and every device's :func:`device_answer`, in one statement.

    A process that has not ended wrote a row within ``ENDED_AFTER_S`` of its device's newest
    (the heartbeat): so each device's rows in [newest - ENDED_AFTER_S, newest] hold every
    running process's newest answer. The newest is a correlated ``max`` (one seek on
    ``ix_verdicts_device_ts`` per device) and the rows after it a range on the same index: a
    fleet's 90 days of verdicts cost what its last ten minutes do. The device's answer is its
    newest ``device_verdicts`` row (one seek on ``ix_device_verdicts_device_ts``), joined.
    ``listed``: the processes table's rows (``Store.processes(host="*")``) where the caller
    read them already (a page reads them once, not once per part)."""
    dv = device_verdicts
    newest = (select(func.max(verdicts.c.ts_s))
              .where(verdicts.c.device_id == devices.c.id, verdicts.c.ts_s <= at_s)
              .scalar_subquery())
    tops = (select(devices.c.id.label("did"), devices.c.device_index, hosts.c.name,
                   newest.label("newest"), _newest_answer(at_s).label("answer"))
            .join(hosts, hosts.c.id == devices.c.host_id).subquery())
    since_newest = and_(verdicts.c.device_id == tops.c.did,
                        verdicts.c.ts_s >= tops.c.newest - ENDED_AFTER_S,
                        verdicts.c.ts_s <= tops.c.newest)
    said = (dv.c.ts_s, dv.c.level, dv.c.risk_pid, dv.c.leak_pid, dv.c.config_check)
    if store.dialect == "postgresql":
        # joined, PostgreSQL hash-joined every verdict stored and sought each device's newest
        # once per verdict row; a LATERAL range (OFFSET 0 keeps it from being pulled up into
        # that join again) is each device's rows after its newest alone
        recent = (select(verdicts.c.pid, verdicts.c.ts_s, verdicts.c.doc, verdicts.c.id)
                  .where(since_newest).offset(0).lateral("recent"))
        q = (select(tops.c.name, tops.c.device_index, recent.c.pid, recent.c.ts_s,
                    recent.c.doc, *said)
             .select_from(tops.join(recent, true()).outerjoin(dv, dv.c.id == tops.c.answer))
             .order_by(tops.c.name, tops.c.device_index, recent.c.pid, recent.c.ts_s.desc(),
                       recent.c.id.desc()))
    else:
        # an outer join: SQLite keeps a LEFT JOIN's order, the devices first, each one's range
        # after (joined, it walked every verdict stored, seeking two newest per row)
        q = (select(tops.c.name, tops.c.device_index, verdicts.c.pid, verdicts.c.ts_s,
                    verdicts.c.doc, *said)
             .select_from(tops.outerjoin(verdicts, since_newest)
                          .outerjoin(dv, dv.c.id == tops.c.answer))
             .order_by(tops.c.name, tops.c.device_index, verdicts.c.pid,
                       verdicts.c.ts_s.desc(), verdicts.c.id.desc()))
    with store.engine.connect() as c:
        rows = c.execute(q).all()
    names: dict[str, dict[int, dict[str, Any]]] = {}
    for p in store.processes(host="*") if listed is None else listed:
        names.setdefault(p["host"], {})[p["pid"]] = p
    newest_of: dict[tuple[str, int, int | None], float] = {}
    found: dict[tuple[str, int, int | None], Verdict] = {}
    answers: dict[tuple[str, int], DeviceVerdict] = {}
    for host, device, pid, ts, doc, said_ts, *answer in rows:
        if said_ts is not None and (host, device) not in answers:
            answers[(host, device)] = _answer(device, host, said_ts, *answer)
        if ts is None:
            continue  # a device without verdicts (SQLite's outer join)
        key = (host, device, pid)  # each process's newest instant first
        if newest_of.setdefault(key, ts) != ts or key in found:
            continue  # an older row, or a second of one instant: the later written is kept
        v = _verdict(doc)
        if v is not None:  # a damaged row is not an answer: the one before it of its instant
            found[key] = v
    docs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for (host, device, _), v in sorted(found.items(),
                                       key=lambda kv: (kv[0][:2], kv[1].pid is not None,
                                                       kv[1].pid or 0)):
        docs.setdefault((host, device), []).append(process_doc(v, names.get(host, {}),
                                                               v.ended))
    return FleetVerdicts({key: [d for d in mark_leads(mine, answers.get(key)) if not d["ended"]]
                          for key, mine in docs.items()}, answers)


def process_label(row: Mapping[str, Any] | None) -> str:
    """A process's name for labels and pages: its name, with its rank when it has one (the
    pid, where a surface needs one, is beside it: ``/metrics``' ``pid`` label)."""
    name = (row or {}).get("name") or "unknown"
    rank = (row or {}).get("rank")
    return name if rank is None else f"{name}/rank{rank}"


def leading(procs: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    """The process a page's headline speaks for on ``kind`` (``risk`` or ``leak``): the one
    the engine chose and stored (:func:`mark_leads`; the one its alerts name), never chosen
    here. None where no process leads."""
    return next((d for d in procs if kind in d.get("leads", ())), None)


def window_leak_lead(procs: list[dict[str, Any]], start: float) -> dict[str, Any] | None:
    """The process a window's leak answer speaks for (the Leaks page, the Timeline's floor,
    ``analyze --db``): the one the engine's stored answer at the window's end names, unless
    its answer there is not a leak while a process that ended within the window left ``leak``
    as its last answer. A window is read after the fact: the leak that ran a process out of
    memory, or was the answer until it exited, is the window's leak, not the survivors'
    "not enough data yet" (the newest such, where several). The engine made every one of
    these answers; this only says which of its stored rows a window is about."""
    lead = leading(procs, "leak")
    if lead is not None and lead["leak"]["state"] == "leak":
        return lead
    gone = [d for d in procs
            if d["ended"] and d["leak"]["state"] == "leak" and d["ts"] >= start]
    return max(gone, key=lambda d: (d["ts"], d["pid"] or 0), default=lead)
