"""The engine's answers, kept: one verdict per process (and per device for what no process
explains), written when it changes and at a heartbeat.

The alert engine evaluates every record; its leak detectors, risk models and KV trackers hold
the verdict at that moment. :class:`VerdictLog` turns that state into :class:`Verdict` rows
when an answer changes (a leak state, a slope that moved, a risk level, a cause) or, unchanged,
every ``HEARTBEAT_S`` of record time. The rows depend only on the records (never on a clock or
on how records were batched), so the live agent, ``vramscope import`` / ``replay`` and
``vramscope analyze FILE`` write the same rows for the same recording, and every surface that
reads them (pages, ``/api/v1/analysis``, ``/metrics``, ``analyze --db``, ``status``) shows one
answer. The format is ``vramscope.verdict/1`` (docs/analysis.md, "Verdicts").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from vramscope.agent.analysis.growth import GROWTH_KEYS
from vramscope.agent.analysis.kv_leak import KvLeak, kv_leak_from_json
from vramscope.agent.analysis.windows import Windows, windows_from_json, windows_json

if TYPE_CHECKING:
    from vramscope.agent.alerts.engine import DeviceAnalysis
    from vramscope.agent.analysis.leaks import LeakResult

VERDICT_FORMAT = "vramscope.verdict/1"
HEARTBEAT_S = 300.0  # an unchanged answer is written again this often (record time)
SLOPE_CHANGE = 0.05  # a leak slope that moved by more than this share is a new answer
HISTORY_MAX = 100_000  # rows an offline run keeps (a live agent hands them to the store)
# a pool's orphaned-block count that moved is written again once the process's last row is
# this old (record time; at once when it doubled): every surface shows the latest check's
# count within this, without a row per check (a server may check after every request)
ORPHAN_ROW_S = 10.0


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
    # the process ended (silent for the engine's PROCESS_GONE_S): this row is its last, its
    # risk ended with it; what it says of the leak is history
    ended: bool = False
    # the KV pool's orphaned blocks: the latest count, their rate in blocks and bytes per
    # second with its interval, the pool's time to exhaustion and the floor they make
    leak_kv: KvLeak | None = None

    def answer(self) -> tuple[Any, ...]:
        """What must change for a new row before the heartbeat."""
        return (self.leak_state, self.leak_first_detected_ts_s, self.leak_estimated_floor,
                self.risk_level, self.risk_cause, self.rank, self.ended)

    def to_json(self) -> dict[str, Any]:
        """The documented form (docs/analysis.md, "Verdicts")."""
        return {"format": VERDICT_FORMAT, "ts": self.ts_s, "device": self.device,
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
                         "reasons": list(self.risk_reasons),
                         "headroom_bytes": self.headroom_bytes,
                         "time_to_oom_s": self.time_to_oom_s,
                         "time_to_oom_low_s": self.time_to_oom_low_s,
                         "time_to_oom_high_s": self.time_to_oom_high_s},
                "kv": {"usage_ratio": self.kv_usage_ratio,
                       "exhaustion_s": self.kv_exhaustion_s}}


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
                   doc.get("ended") is True, kv_leak_from_json(leak.get("kv_pool")))


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
        # per process: (the leak result, risk level and risk episode's cause its answer was
        # made from, record time of its next heartbeat); the result itself, not its id: a freed
        # one's id comes back
        self._seen: dict[tuple[str | None, int, int | None],
                         tuple[LeakResult, int, str | None, float]] = {}
        # per process: the orphaned KV blocks its last row said; twice as many is a new row
        # at once, another count once the row is ORPHAN_ROW_S old
        self._row_orphans: dict[tuple[str | None, int, int | None], int] = {}
        # per process: when a count held back (its row too recent) is due to be written; the
        # device's next record after it writes it, whoever sent that record (the leaking
        # process may have gone quiet)
        self._held: dict[tuple[str | None, int, int | None], float] = {}
        # processes whose last row said they ended (until a record of theirs comes back)
        self._ended: set[tuple[str | None, int, int | None]] = set()

    def note(self, d: DeviceAnalysis, pid: int | None, host: str | None, now_s: float) -> None:
        """A record of process ``pid`` (None: of the device as a whole, every process's) at
        ``now_s``: a row for each process whose answer changed, or whose heartbeat is due."""
        for p in processes_of(d) if pid is None or pid not in d.risks else (pid,):
            self._note(d, p, host, now_s)
        if self._held:
            for key, due in list(self._held.items()):
                if key[:2] == (host, d.device) and now_s >= due:
                    del self._held[key]
                    if key[2] in d.leaks:  # still running
                        self._note(d, key[2], host, now_s, held=True)

    def _note(self, d: DeviceAnalysis, pid: int | None, host: str | None, now_s: float,
              held: bool = False) -> None:
        key = (host, d.device, pid)
        self._ended.discard(key)
        result = (d.leaks.get(pid) or d.leaks[None]).result
        model = d.risks.get(pid) or d.risk
        level = model.level_index
        ep = d.episodes.get(model)
        cause = ep.cause if ep is not None else None
        seen = self._seen.get(key)
        if seen is not None and seen[0] is result and seen[1] == level and seen[2] == cause \
                and now_s < seen[3] and not held:
            return  # nothing its answer is made from moved, and no heartbeat is due
        v = verdict_of(d, pid, host, now_s)
        last = self.latest.get(key)
        orphans, said = result.orphaned_blocks, self._row_orphans.get(key, 0)
        recount = orphans != said and last is not None and now_s >= last.ts_s + ORPHAN_ROW_S
        if orphans != said and not recount and last is not None:
            self._held.setdefault(key, last.ts_s + ORPHAN_ROW_S)
        if (seen is None or now_s >= seen[3] or last is None or last.answer() != v.answer()
                or _moved(last, v) or orphans >= 2 * said > 0 or recount):
            self.latest[key] = v
            if not self.keep or len(self.history) < HISTORY_MAX:
                self.history.append(v)
            self._seen[key] = (result, level, cause, now_s + self.heartbeat_s)
            self._row_orphans[key] = orphans
            self._held.pop(key, None)
        else:
            self._seen[key] = (result, level, cause, seen[3])

    def end(self, d: DeviceAnalysis, host: str | None, now_s: float) -> None:
        """A row for each process ``d`` found gone: its last, ``ended``, its risk ``ok`` with
        no forecast (what ran out of memory, or would have, is no longer there). A process
        that comes back (its records were late) goes on from its row before: the rows after
        are the ones it would have had."""
        for pid in d.ended:
            key = (host, d.device, pid)
            last = self.latest.get(key)
            if last is None or key in self._ended:
                continue
            self._ended.add(key)
            v = last._replace(ts_s=now_s, ended=True, risk_level="ok", risk_cause=None,
                              risk_reasons=(), time_to_oom_s=None, time_to_oom_low_s=None,
                              time_to_oom_high_s=None)
            if not self.keep or len(self.history) < HISTORY_MAX:
                self.history.append(v)
        d.ended.clear()

    def take(self) -> list[Verdict]:
        """The rows made since the last ``take``."""
        out = self.history[self._taken:]
        if self.keep:
            self._taken = len(self.history)
        else:
            self.history = []
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
    """Process ``pid``'s answers on ``d`` now."""
    leak = d.leaks.get(pid) or d.leaks[None]
    r = leak.result
    model = d.risks.get(pid) or d.risk
    point = model.last
    level = point.level if point is not None else ""
    cause = d.cause_of(model, leak)  # the risk episode's (explain.CauseEpisode)
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
                   r.time_to_oom_s, r.time_to_oom_low_s, r.time_to_oom_high_s, leak_kv=r.kv)
