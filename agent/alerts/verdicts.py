"""The engine's answers, kept: one verdict per process, written when it changes and at a
heartbeat (``vramscope.verdict/1``, docs/analysis.md, "Verdicts").

:class:`VerdictLog` turns the engine's state into :class:`Verdict` rows when an answer changes or,
unchanged, every ``HEARTBEAT_S`` of record time. The rows depend only on the records (never on a
clock or on batching), so the live agent, ``import`` / ``replay`` and ``analyze FILE`` write the
same rows and every surface shows one answer. :class:`DeviceVerdict` rows keep the device's level
and which process leads each question; no surface chooses a leading process again.
"""

from __future__ import annotations

from itertools import takewhile
from typing import TYPE_CHECKING, Any, NamedTuple

from vramscope.agent.analysis.growth import GROWTH_KEYS
from vramscope.agent.analysis.kv_leak import KvLeak, kv_leak_from_json
from vramscope.agent.analysis.severity import LEVELS, NO_LEVEL
from vramscope.agent.analysis.windows import Windows, windows_from_json, windows_json

if TYPE_CHECKING:
    from vramscope.agent.alerts.device import DeviceAnalysis
    from vramscope.agent.analysis.leaks import LeakDetector, LeakResult

VERDICT_FORMAT = "vramscope.verdict/1"
HEARTBEAT_S = 300.0  # an unchanged answer is written again this often (record time)
SLOPE_CHANGE = 0.05  # a leak slope that moved by more than this share is a new answer
HISTORY_MAX = 100_000  # rows an offline run keeps (a live agent hands them to the store)
# a pool's orphaned-block count that moved is written again once the process's last row is
# this old (record time; at once when it doubled): every surface shows the latest check's
# count within this, without a row per check (a server may check after every request)
ORPHAN_ROW_S = 10.0
# the riskiest process may change at one level as two processes' headrooms cross and cross
# back with their requests: such a change is written once the device's last row is this old
# (record time), should it last; a change of the level or of the leak's process, or from a
# process that is gone, at once
LEAD_ROW_S = 60.0


class Verdict(NamedTuple):
    """One process's answers at ``ts_s`` (``pid`` None: the device as a whole, from NVML or
    records without a pid). Slopes in bytes per second, times in seconds."""

    ts_s: float
    device: int
    host: str | None
    pid: int | None
    leak_state: str  # leak, no_leak, insufficient_data
    leak_slope_bytes_per_s: float
    leak_start_ts_s: float | None  # when the rise began (estimated)
    leak_first_detected_ts_s: float | None
    leak_span_s: float  # the floor after the warm-up the verdict rests on
    leak_evidence: str  # what it rests on, or what is missing
    risk_level: str  # ok, warning, critical ("" before the risk model's first point)
    risk_cause: str | None  # the likely cause of a warning (diagnosis.REMEDIES' keys)
    risk_reasons: tuple[str, ...]
    headroom_bytes: int | None
    time_to_oom_s: float | None
    time_to_oom_low_s: float | None
    time_to_oom_high_s: float | None
    kv_usage_ratio: float | None
    kv_exhaustion_s: float | None
    rank: int | None = None
    # the fitted floor line, ((ts, bytes), (ts, bytes)), for charts; not part of the answer
    leak_trend_line: tuple[tuple[float, float], tuple[float, float]] | None = None
    # the windows the leak detector chose from the data (None: not chosen yet); chosen once
    leak_windows: Windows | None = None
    # the leak's rate was read off an estimated floor (rarely or never idle, no KV figures):
    # every surface says "about" before it
    leak_estimated_floor: bool = False
    # the growth model's: the leak rate's 90 % interval and the time until the headroom is
    # used up at it (soonest, latest: None where the interval reaches zero growth)
    leak_rate_low_bytes_per_s: float | None = None
    leak_rate_high_bytes_per_s: float | None = None
    leak_time_to_oom_s: float | None = None
    leak_time_to_oom_low_s: float | None = None
    leak_time_to_oom_high_s: float | None = None
    # the process ended (silent for the engine's PROCESS_GONE_S, or at its process_exit
    # event): this row is its last, its risk ended with it; what it says of the leak is history
    ended: bool = False
    # the KV pool's orphaned blocks: the latest count, their rate in blocks and bytes per
    # second with its interval, the pool's time to exhaustion and the floor they make
    leak_kv: KvLeak | None = None
    # the floor points the leak detector made since this process's previous row, (ts, bytes)
    # (residual where the load explains part of the memory: the trend line's coordinates):
    # the rows of a window together are the floor the verdicts were made on, which the pages
    # draw; not part of the answer
    leak_floor: tuple[tuple[float, int], ...] = ()
    # the pid whose growth puts this process at risk (``RiskModel.at_risk_from``: its cause is
    # growth, another process's, not its own); the alert says the same pid
    risk_at_risk_from_pid: int | None = None

    def answer(self) -> tuple[Any, ...]:
        """What must change for a new row before the heartbeat."""
        return (self.leak_state, self.leak_first_detected_ts_s, self.leak_estimated_floor,
                self.risk_level, self.risk_cause, self.risk_at_risk_from_pid, self.rank,
                self.ended)

    def to_json(self, stored: bool = False) -> dict[str, Any]:
        """The documented form (docs/analysis.md, "Verdicts"); ``stored``: as the store keeps
        it, with ``leak.floor_points`` (the points since the process's previous row, which
        only a window's rows together make sense of: no document shows them)."""
        doc: dict[str, Any] = {
                "format": VERDICT_FORMAT, "ts": self.ts_s, "device": self.device,
                "host": self.host, "pid": self.pid, "rank": self.rank, "ended": self.ended,
                "leak": {"state": self.leak_state,
                         "slope_bytes_per_s": self.leak_slope_bytes_per_s,
                         "slope_bytes_per_h": self.leak_slope_bytes_per_s * 3600.0,
                         "start_ts": self.leak_start_ts_s,
                         "first_detected_ts": self.leak_first_detected_ts_s,
                         "span_s": self.leak_span_s, "evidence": self.leak_evidence,
                         "trend_line": ([list(p) for p in self.leak_trend_line]
                                        if self.leak_trend_line else None),
                         "windows": windows_json(self.leak_windows),
                         "estimated_floor": self.leak_estimated_floor,
                         "rate_low_bytes_per_s": self.leak_rate_low_bytes_per_s,
                         "rate_high_bytes_per_s": self.leak_rate_high_bytes_per_s,
                         "time_to_oom_s": self.leak_time_to_oom_s,
                         "time_to_oom_low_s": self.leak_time_to_oom_low_s,
                         "time_to_oom_high_s": self.leak_time_to_oom_high_s,
                         "orphaned_blocks": self.leak_kv.blocks if self.leak_kv else 0,
                         "kv_pool": self.leak_kv.to_json() if self.leak_kv else None},
                "risk": {"level": self.risk_level, "cause": self.risk_cause,
                         "at_risk_from_pid": self.risk_at_risk_from_pid,
                         "reasons": list(self.risk_reasons),
                         "headroom_bytes": self.headroom_bytes,
                         "time_to_oom_s": self.time_to_oom_s,
                         "time_to_oom_low_s": self.time_to_oom_low_s,
                         "time_to_oom_high_s": self.time_to_oom_high_s},
                "kv": {"usage_ratio": self.kv_usage_ratio,
                       "exhaustion_s": self.kv_exhaustion_s}}
        if stored:
            doc["leak"]["floor_points"] = [list(p) for p in self.leak_floor]
        return doc


class DeviceVerdict(NamedTuple):
    """The device's answer at ``ts_s``, chosen by the engine once for every surface: its risk
    level (the riskiest process's, what the ``risk_level`` rule reads; ``""`` before the risk
    model's first point) and which process leads each question: ``risk_pid`` the riskiest
    (the one a risk alert names), ``leak_pid`` the leak the device's leak alert speaks of
    (None: the device as a whole, records without a pid). ``config_check``: the ``[server]``
    section's check at the limit the engine judges the device by, as the ``config_oom`` alert
    makes it (``config_check.check_json``'s form; None where the agent has no such section)."""

    ts_s: float
    device: int
    host: str | None
    level: str
    risk_pid: int | None
    leak_pid: int | None
    config_check: dict[str, Any] | None = None

    def leads(self, pid: int | None) -> list[str]:
        """The questions process ``pid`` leads: ``"risk"``, ``"leak"``, both or none."""
        return [q for q, p in (("risk", self.risk_pid), ("leak", self.leak_pid)) if p == pid]


def verdict_from_json(doc: dict[str, Any]) -> Verdict:
    """A :class:`Verdict` back from :meth:`Verdict.to_json` (as the store keeps it)."""
    leak, risk, kv = doc["leak"], doc["risk"], doc["kv"]
    low, high, tto, tto_low, tto_high = _numbers(leak, GROWTH_KEYS)
    return Verdict(doc["ts"], doc["device"], doc.get("host"), doc.get("pid"), leak["state"],
                   leak["slope_bytes_per_s"], leak["start_ts"], leak["first_detected_ts"],
                   leak["span_s"], leak["evidence"], risk["level"], risk["cause"],
                   tuple(risk["reasons"]), risk["headroom_bytes"], risk["time_to_oom_s"],
                   risk["time_to_oom_low_s"], risk["time_to_oom_high_s"], kv["usage_ratio"],
                   kv["exhaustion_s"], doc.get("rank"), _line(leak.get("trend_line")),
                   windows_from_json(leak.get("windows")),
                   leak.get("estimated_floor") is True, low, high, tto, tto_low, tto_high,
                   doc.get("ended") is True, kv_leak_from_json(leak.get("kv_pool")),
                   _points(leak.get("floor_points")), _pid(risk.get("at_risk_from_pid")))


def _pid(value: Any) -> int | None:
    """A stored pid back, None where absent (rows written before it) or not a whole number."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _points(value: Any) -> tuple[tuple[float, int], ...]:
    """Stored floor points back, ``()`` where absent (rows written before them) or damaged."""
    if not isinstance(value, list):
        return ()
    try:
        return tuple((float(t), int(b)) for t, b in value)
    except (TypeError, ValueError):
        return ()


def _numbers(doc: dict[str, Any], keys: tuple[str, ...]) -> list[float | None]:
    """``doc``'s numbers at ``keys``, None where absent (rows written before them) or not a
    number."""
    out: list[float | None] = []
    for k in keys:
        v = doc.get(k)
        out.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None)
    return out


def _line(value: Any) -> tuple[tuple[float, float], tuple[float, float]] | None:
    if not value:
        return None
    (t0, y0), (t1, y1) = value
    return (float(t0), float(y0)), (float(t1), float(y1))


class VerdictLog:
    """The verdict rows of an engine, made as it evaluates (``note``) and taken by the writer
    (``take``). ``latest`` keeps each process's newest row, for an offline run's document.

    A process's rows depend only on its own records (and the device-wide ones): its heartbeat
    is its own, so two processes interleaved differently (a live agent's batches, a sorted
    trace) give each the same rows."""

    def __init__(self, heartbeat_s: float = HEARTBEAT_S, keep: bool = True) -> None:
        self.heartbeat_s = heartbeat_s
        # True: every row stays in ``history`` (at most HISTORY_MAX: an offline run's);
        # False: a row stays only until ``take`` (a live agent's writer takes each batch's)
        self.keep = keep
        self.history: list[Verdict] = []
        self._taken = 0  # rows of ``history`` already handed out by ``take``
        self.latest: dict[tuple[str | None, int, int | None], Verdict] = {}
        # per process: the time of the newest floor point its rows carry
        self._floor_said: dict[tuple[str | None, int, int | None], float] = {}
        # per process: (the leak result, risk level, risk episode's cause and the pid at risk
        # from its answer was made from, record time of its next heartbeat); the result itself,
        # not its id: a freed one's id comes back
        self._seen: dict[tuple[str | None, int, int | None],
                         tuple[LeakResult, int, str | None, int | None, float]] = {}
        # per process: the orphaned KV blocks its last row said; twice as many is a new row
        # at once, another count once the row is ORPHAN_ROW_S old
        self._row_orphans: dict[tuple[str | None, int, int | None], int] = {}
        # per process: when a count held back (its row too recent) is due to be written; the
        # device's next record after it writes it, whoever sent that record (the leaking
        # process may have gone quiet)
        self._held: dict[tuple[str | None, int, int | None], float] = {}
        # processes whose last row said they ended (until a record of theirs comes back)
        self._ended: set[tuple[str | None, int, int | None]] = set()
        # the devices' answers (level, leading processes) as they change: their own rows
        self.device_history: list[DeviceVerdict] = []
        self._device_taken = 0
        self._device_said: dict[tuple[str | None, int], DeviceVerdict] = {}
        self._checked: dict[tuple[str | None, int], int | None] = {}  # the check's limit said

    def note(self, d: DeviceAnalysis, pid: int | None, host: str | None, now_s: float) -> None:
        """A record of process ``pid`` (None: of the device as a whole, every process's) at
        ``now_s``: a row for each process whose answer changed, or whose heartbeat is due."""
        if pid is not None and pid in d.risks:  # a process's record: its own row alone
            self._note(d, pid, host, now_s)
        else:
            for p in processes_of(d):
                self._note(d, p, host, now_s)
        if self._held:
            for key, due in list(self._held.items()):
                if key[:2] == (host, d.device) and now_s >= due:
                    del self._held[key]
                    if key[2] in d.leaks:  # still running
                        self._note(d, key[2], host, now_s, held=True)

    def _note(self, d: DeviceAnalysis, pid: int | None, host: str | None, now_s: float,
              held: bool = False) -> None:
        leak = d.leaks.get(pid)
        if leak is None:
            return  # no state of its own: no row (never the device's or another's answer)
        key = (host, d.device, pid)
        if self._ended:  # (a process whose row said it ended: rare; the key hashes once less)
            self._ended.discard(key)
        result = leak.result
        model = d.risks.get(pid)
        level = model.level_index if model is not None else -1
        ep = d.episodes.get(model) if model is not None else None
        cause = ep.cause if ep is not None else None
        source = model.at_risk_from(cause, result.detected) if model is not None else None
        seen = self._seen.get(key)
        if seen is not None and seen[0] is result and seen[1] == level and seen[2] == cause \
                and seen[3] == source and now_s < seen[4] and not held:
            return  # nothing its answer is made from moved, and no heartbeat is due
        v = verdict_of(d, pid, host, now_s)
        last = self.latest.get(key)
        orphans, said = result.orphaned_blocks, self._row_orphans.get(key, 0)
        recount = orphans != said and last is not None and now_s >= last.ts_s + ORPHAN_ROW_S
        if orphans != said and not recount and last is not None:
            self._held.setdefault(key, last.ts_s + ORPHAN_ROW_S)
        if (seen is None or now_s >= seen[4] or last is None or last.answer() != v.answer()
                or _moved(last, v) or orphans >= 2 * said > 0 or recount):
            v = v._replace(leak_floor=self._new_floor(key, leak))
            self.latest[key] = v
            if not self.keep or len(self.history) < HISTORY_MAX:
                self.history.append(v)
            self._seen[key] = (result, level, cause, source, now_s + self.heartbeat_s)
            self._row_orphans[key] = orphans
            self._held.pop(key, None)
        else:
            self._seen[key] = (result, level, cause, source, seen[4])

    def _new_floor(self, key: tuple[str | None, int, int | None],
                   leak: LeakDetector) -> tuple[tuple[float, int], ...]:
        """The detector's floor points newer than the process's previous row's (its
        ``recent_floor`` keeps the last RECENT_FLOOR_POINTS, hours of them: more than a
        heartbeat's)."""
        said = self._floor_said.get(key, float("-inf"))
        new = list(takewhile(lambda p: p[0] > said, reversed(leak.recent_floor)))
        if new:
            self._floor_said[key] = new[0][0]
        return tuple((float(t), int(b)) for t, b in reversed(new))

    def note_device(self, d: DeviceAnalysis, host: str | None, now_s: float) -> None:
        """A row for the device when its level or a leading process changed (a risk lead that
        moved at one level: once its last row is ``LEAD_ROW_S`` old, should the change last),
        or at its heartbeat. Its rows never go back in time."""
        key = (host, d.device)
        level = LEVELS[d.risk.level_index] if d.risk.has_point else NO_LEVEL
        check = d.config_check
        if check is not None:
            check.at(d.risk.limit_bytes)  # made again only when the limit moved
        checked = check.limit_bytes if check is not None else None
        said = self._device_said.get(key)
        if said is not None:
            # (level, risk pid, leak pid, limit checked) as said: compared one by one, without
            # building two tuples for every record
            if said.level == level and said.risk_pid == d.risk_pid \
                    and said.leak_pid == d.leak_pid and self._checked.get(key) == checked:
                if now_s < said.ts_s + self.heartbeat_s:
                    return
            elif said.level == level and said.leak_pid == d.leak_pid \
                    and said.risk_pid != d.risk_pid and said.risk_pid in d.risks \
                    and now_s < said.ts_s + LEAD_ROW_S:
                return  # (a lead that is gone, ended or exited, is replaced at once)
        # a process's records may lag another's (clients send at their own pace): the row is
        # the device's answer from now on, so it never goes back before the one it follows
        at_s = now_s if said is None else max(now_s, said.ts_s)
        row = DeviceVerdict(at_s, d.device, host, level, d.risk_pid, d.leak_pid,
                            check.to_json() if check is not None else None)
        self._checked[key] = checked
        self._device_said[key] = row
        if not self.keep or len(self.device_history) < HISTORY_MAX:
            self.device_history.append(row)

    def end(self, d: DeviceAnalysis, host: str | None, now_s: float) -> None:
        """A row for each process ``d`` found gone: its last, ``ended``, its risk ``ok`` and
        no forecast, its leak's neither (what ran out of memory, or would have, is no longer
        there; its leak's rate and evidence stay its answer). A process
        that comes back (its records were late) goes on from its row before: the rows after
        are the ones it would have had."""
        for pid in d.ended:
            key = (host, d.device, pid)
            last = self.latest.get(key)
            if last is None or key in self._ended:
                continue
            self._ended.add(key)
            # a row is written when the answer changes or at the heartbeat: what a "not
            # enough data yet" is missing may have moved on since (the warm-up ended, more
            # floor came); the last row says where the detector stood when the process went
            leak = d.retired_leak(pid) if pid is not None else None
            if leak is not None and leak.result.state == last.leak_state:
                last = last._replace(leak_evidence=leak.result.evidence,
                                     leak_span_s=leak.result.span_s)
            v = last._replace(ts_s=now_s, ended=True, risk_level="ok", risk_cause=None,
                              risk_reasons=(), time_to_oom_s=None, time_to_oom_low_s=None,
                              time_to_oom_high_s=None, leak_floor=(),
                              risk_at_risk_from_pid=None, leak_time_to_oom_s=None,
                              leak_time_to_oom_low_s=None, leak_time_to_oom_high_s=None)
            if not self.keep or len(self.history) < HISTORY_MAX:
                self.history.append(v)
        d.ended.clear()

    def take(self) -> list[Verdict | DeviceVerdict]:
        """The rows made since the last ``take``: the processes' and the devices'."""
        out: list[Verdict | DeviceVerdict] = [*self.history[self._taken:],
                                              *self.device_history[self._device_taken:]]
        if self.keep:
            self._taken, self._device_taken = len(self.history), len(self.device_history)
        else:
            self.history, self.device_history = [], []
        return out


def _moved(last: Verdict, new: Verdict) -> bool:
    """A leak's slope that moved by more than ``SLOPE_CHANGE`` of itself."""
    if new.leak_state != "leak":
        return False
    before = last.leak_slope_bytes_per_s
    return abs(new.leak_slope_bytes_per_s - before) > SLOPE_CHANGE * max(abs(before), 1.0)


def processes_of(d: DeviceAnalysis) -> list[int | None]:
    """Whose answers a device has: each process that reported (its leak detector was fed
    samples, or its risk model exists), else the device as a whole."""
    pids: set[int] = ({p for p in d.risks if p is not None}
                      | {p for p in d.sampled_pids() if p is not None})
    if not pids:
        return [None]
    return [*sorted(pids)]


def verdict_of(d: DeviceAnalysis, pid: int | None, host: str | None, now_s: float) -> Verdict:
    """Process ``pid``'s answers on ``d`` now, from its own state alone (``pid`` None: the
    device's own, from NVML or records without a pid): a process without a risk model of its
    own has no risk answer (level ``""``, no figures), never the riskiest process's; one
    without a leak detector of its own has no row at all (``VerdictLog`` writes none)."""
    leak = d.leaks[pid]
    r = leak.result
    model = d.risks.get(pid)
    point = model.last if model is not None else None
    level = point.level if point is not None else NO_LEVEL
    cause = d.cause_of(model, leak) if model is not None else None  # its episode's
    source = model.at_risk_from(cause, r.detected) if model is not None else None
    kv = d.kvs.get(pid)
    return Verdict(now_s, d.device, host, pid, r.state, r.slope_bytes_per_s, r.start_ts_s,
                   r.first_detected_ts_s, r.span_s, r.evidence, level, cause,
                   point.reasons if point is not None else (),
                   point.headroom_bytes if point is not None else None,
                   point.time_to_oom_s if point is not None else None,
                   point.time_to_oom_low_s if point is not None else None,
                   point.time_to_oom_high_s if point is not None else None,
                   kv.usage_ratio if kv is not None else None,
                   kv.exhaustion_s if kv is not None else None,
                   d.ranks.get(pid) if pid is not None else None, r.trend_line, leak.windows,
                   r.estimated_floor, r.rate_low_bytes_per_s, r.rate_high_bytes_per_s,
                   r.time_to_oom_s, r.time_to_oom_low_s, r.time_to_oom_high_s, leak_kv=r.kv,
                   risk_at_risk_from_pid=source)
