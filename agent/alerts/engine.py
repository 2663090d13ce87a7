"""The alert engine: rules evaluated incrementally over records.

The same :class:`AlertEngine` runs live in the agent's writer thread and offline in
``vramscope analyze``; it depends only on the records it is fed (never on a clock), so both give
identical alerts. Per device it runs the analysis models
(``vramscope.agent.analysis``: risk, leak, KV),
and after every sample (or OOM / orphaned-block event) evaluates each rule:

- ``pending`` when the condition first holds; ``fired`` once it has held ``for`` seconds;
- an active alert ``resolved`` once the value is past the rule's ``clear`` threshold (or no
  longer breaches the threshold) and has stayed there ``clear_for`` seconds.

What the engine returns (:class:`AlertChange`) goes to the sinks of
:mod:`vramscope.agent.alerts.sinks`; the engine itself does no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, cast
from weakref import WeakKeyDictionary

from vramscope.agent.alerts.config_check import METRIC as CONFIG_METRIC
from vramscope.agent.alerts.config_check import LimitCheck, ServerLimits, server_from_config
from vramscope.agent.alerts.explain import (
    CauseEpisode,
    leak_text,
    risk_reasons,
    risk_text,
    warning_cause,
)
from vramscope.agent.alerts.rules import BACKOFF_MAX, BACKOFF_WINDOW_S, OPS, Rule, rules_from
from vramscope.agent.alerts.saturation import EVENTS as SATURATION_EVENTS
from vramscope.agent.alerts.saturation import METRIC as SATURATION_METRIC
from vramscope.agent.alerts.saturation import Saturation
from vramscope.agent.alerts.verdicts import VerdictLog
from vramscope.agent.analysis.diagnosis import REMEDIES
from vramscope.agent.analysis.fragmentation import inactive_split_ratio
from vramscope.agent.analysis.kv import KvTracker, observe_process
from vramscope.agent.analysis.leaks import LeakDetector, LeakResult, orphaned_count
from vramscope.agent.analysis.merge import is_device_wide, merged
from vramscope.agent.analysis.risk import RiskModel
from vramscope.agent.analysis.thresholds import Thresholds
from vramscope.agent.records import EXIT_EVENT, RANK_EVENT, SAMPLE_COUNTER_FIELDS, Event, Sample

OOM_RECENT_S = 300.0
# a process silent this long is gone (its hooks sample several times a second while it lives):
# its models no longer speak, and its last verdict row says it ended; a process that says it
# exits (a ``process_exit`` event) is gone at once
PROCESS_GONE_S = 60.0
GONE_KEPT = 64  # gone processes whose models are kept, should their records arrive late
HISTORY_MAX = 100_000
WEBHOOK_FORMAT = "vramscope.alert/1"


class AlertChange(NamedTuple):
    kind: str  # "fired" or "resolved"
    rule: str
    severity: str
    device: int
    ts_s: float  # when it fired, or when it resolved
    value: float | None  # the metric's value at that moment
    message: str
    labels: Mapping[str, str]
    fired_ts_s: float  # when the alert (of a resolution) fired
    host: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The documented webhook body (docs/alerts.md)."""
        return {"format": WEBHOOK_FORMAT, "kind": self.kind, "rule": self.rule,
                "severity": self.severity, "device": self.device, "host": self.host,
                "ts": self.ts_s, "fired_ts": self.fired_ts_s, "value": self.value,
                "message": self.message, "labels": dict(self.labels)}


# What can change a metric's value. A rule is evaluated again only after a record changed one
# of the inputs of its metric (or of its gate) on its device, or while its ``for`` /
# ``clear_for`` timer runs: with the same inputs and no timer, evaluating it again cannot
# change anything. So a sample that moves nothing a rule reads costs no rule evaluation.
_SAMPLE = 1 << 0  # any sample: the metrics of the latest sample
_RAW = 1 << 1  # a sample that carries a field some rule reads as it is
_RISK = 1 << 2  # the risk model gave a point
_RISK_LEVEL = 1 << 3  # ...of another level than the one before (or its first)
_DEVICE = 1 << 4  # device used or device total bytes (the limit)
_SNAPSHOT = 1 << 5  # a largest free block
_LEAK = 1 << 6  # a new leak verdict
_KV = 1 << 7  # a KV pool reading
_ORPHANS = 1 << 8  # a kv_orphaned_blocks event
_OOM = 1 << 9  # oom_recent changed: an OOM, or five minutes since the last one
_EPISODE = 1 << 10  # an OOM ended the risk episode (its risk alerts resolve with it)
_LOAD = 1 << 11  # a server_load or kv_preempted event (saturation.py)
# what may change an answer the verdict log keeps (agent/alerts/verdicts.py)
_VERDICT = _LEAK | _RISK_LEVEL | _EPISODE | _ORPHANS

_INPUTS: dict[str, int] = {
    "cached_free_bytes": _SAMPLE,
    "inactive_split_ratio": _SAMPLE,
    "external_fragmentation_ratio": _SNAPSHOT,
    "device_used_ratio": _DEVICE,
    "headroom_bytes": _RISK,
    "headroom_ratio": _RISK,
    "time_to_oom_s": _RISK,
    "risk_level": _RISK_LEVEL | _EPISODE,
    "leak_detected": _LEAK,
    "leak_slope_bytes_per_s": _LEAK,
    "leak_slope_ratio_per_h": _LEAK | _DEVICE,
    "kv_usage_ratio": _KV,
    "kv_exhaustion_s": _KV,
    "kv_exhaustion_horizon_s": _KV,
    "kv_orphaned_blocks": _ORPHANS,
    "oom_recent": _OOM,
    CONFIG_METRIC: _DEVICE,  # the [server] check, computed again when the limit moves
    SATURATION_METRIC: _LOAD | _KV,  # a KV reading also ages the preemption window
}


def inputs_of(metric: str) -> int:
    """The input bits of ``metric`` (a sample field: any sample that carries a read field)."""
    return _INPUTS.get(metric, _RAW)


class DeviceAnalysis:
    """The live analysis state of one device: models plus the latest value of each field.

    ``on_sample`` and ``on_event`` return what the record changed, as input bits (above).
    """

    def __init__(self, device: int, thresholds: Thresholds, raw_fields: frozenset[str]) -> None:
        self.device = device
        self._thresholds = thresholds
        # One risk model per server process on the device (its own limit, the device's NVML
        # view; DESIGN.md rule 6), None: the device's NVML view before any process reported.
        # ``risk`` is the one the rules read: the riskiest process's.
        self.risks: dict[int | None, RiskModel] = {None: RiskModel(thresholds)}
        self.risk = self.risks[None]
        self.risk_pid: int | None = None
        # each risk model's episode and the cause it was named with (explain.CauseEpisode):
        # what the alert, the verdict rows and the post-mortem say; gone with its model
        self.episodes: WeakKeyDictionary[RiskModel, CauseEpisode] = WeakKeyDictionary()
        # the pid and model a process sample fed (None: a device-wide one fed every model)
        self._fed: tuple[int | None, RiskModel] | None = None
        self.ranks: dict[int, int] = {}  # pid -> rank, from process_rank events
        self._wide: Sample | None = None  # the latest device-wide (NVML) sample
        # Leak detectors per process too (each its own idle floor); ``leak`` is the one the
        # rules and the report read: a detected one first, then the steepest.
        self.leaks: dict[int | None, LeakDetector] = {None: LeakDetector(thresholds)}
        self.leak = self.leaks[None]
        self.leak_pid: int | None = None  # whose detector ``leak`` is
        self._sampled: set[int | None] = set()  # whose process samples fed a leak detector
        # KV pools per process too (two servers on a GPU have two pools); ``kv`` is the
        # fullest one's tracker, the one the rules and the report read.
        self.kvs: dict[int | None, KvTracker] = {}
        self.kv = KvTracker()
        self.fields: dict[str, int] = {}
        self._raw_fields = tuple(f for f in SAMPLE_COUNTER_FIELDS if f in raw_fields)
        self.last_sample: Sample | None = None
        self.first_warning_ts_s: float | None = None
        self.max_level = 0
        self.min_time_to_oom_s: float | None = None
        self.oom_ts_s: list[float] = []
        self.orphaned_blocks = 0
        self._num_ooms: int | None = None
        self._last_seen: dict[int, float] = {}  # pid -> its latest sample's time
        # pid -> (risk model, leak detector, KV tracker, sampled) of a process thought gone
        self._gone: dict[int, tuple[RiskModel | None, LeakDetector | None, KvTracker | None,
                                    bool]] = {}
        self._next_gone_check = 0.0
        self.ended: list[int] = []  # processes found gone since the verdict log last looked
        # a gone process whose leak the device's alert named, and how it went ("ended": silent,
        # "exited": its process_exit event): the alert resolves saying so, not "no leak"
        self.ended_leak: tuple[int, str] | None = None
        # a process that led the risk and exited: the risk alerts it held resolve at once where
        # the processes left are below their level (as an OOM ends an episode)
        self.exited_risk: int | None = None
        self._episode_ended = False  # an OOM since the rules last looked
        self._level_seen: int | None = None  # the risk level the rules last saw
        self._oom_recent = False  # oom_recent as the rules last saw it
        self.config_check: LimitCheck | None = None  # with a [server] section (config_check.py)
        self.saturation = Saturation()  # queues and preemptions (saturation.py)

    def on_sample(self, s: Sample) -> int:
        self.last_sample = s
        changed = _SAMPLE
        if self._raw_fields:
            changed |= self._absorb_fields(s)
        if s.pid is not None:
            if s.pid in self._gone:
                self._revive(s.pid)
            self._last_seen[s.pid] = s.ts_s
            if s.ts_s >= self._next_gone_check and self._forget_gone(s.ts_s):
                changed |= _LEAK
        if s.num_ooms is not None:
            if self._num_ooms is not None and s.num_ooms > self._num_ooms:
                self._note_oom(s.ts_s, s.pid)
            self._num_ooms = s.num_ooms
        if self._observe_risk(s):
            changed |= _RISK | self._note_risk(s.ts_s)
        if s.device_used_bytes is not None or s.device_total_bytes:
            changed |= _DEVICE
        if s.largest_free_block_bytes is not None:
            changed |= _SNAPSHOT
        if self._update_leak(s):
            changed |= _LEAK
        if changed & _RISK:
            self._keep_causes(s.ts_s)
        if s.kv_blocks_used is not None and self._observe_kv(s):
            changed |= _KV
        if self.oom_ts_s:
            changed |= self._oom_changed(s.ts_s)
        return changed | self._episode()

    def _episode(self) -> int:
        """``_EPISODE`` once after an OOM (the risk alerts it ended resolve)."""
        if not self._episode_ended:
            return 0
        self._episode_ended = False
        return _EPISODE

    def _forget_gone(self, now_s: float) -> bool:
        """Processes silent for ``PROCESS_GONE_S`` are gone (exited, restarted under a new
        pid): their risk models and leak detectors no longer speak for the device. Their state
        is kept aside (``GONE_KEPT`` processes at most): a process whose records only arrived
        late (a client that lags the others, a replay of two files) goes on where it was,
        as it would have had its records come in time order."""
        self._next_gone_check = now_s + PROCESS_GONE_S / 2
        gone = [pid for pid, ts in self._last_seen.items() if now_s - ts >= PROCESS_GONE_S]
        for pid in gone:
            self._retire(pid, "ended")
        if gone:
            self._pick_risk()
            self._pick_leak()
        return bool(gone)

    def _on_exit(self, e: Event) -> int | None:
        """A process said it exits: gone at this instant (as silence makes it gone later), the
        leads move to the processes left. What changed, or None for a process the device
        does not run (unknown, or already gone)."""
        if e.pid is None or e.pid not in self._last_seen:
            return None
        if self.risk_pid == e.pid:
            self.exited_risk = e.pid
        self._retire(e.pid, "exited")
        self._pick_risk()
        self._pick_leak()
        # every rule that reads the leading process reads another one now
        return _LEAK | _RISK | _DEVICE | self._note_risk(e.ts_s)

    def _retire(self, pid: int, how: str) -> None:
        """Process ``pid`` is gone: its state is kept aside, the verdict log writes its last
        row (``ended``); the caller picks the leads again."""
        leading = self.leak
        if self.leaks.get(pid) is leading and leading.result.detected:
            self.ended_leak = (pid, how)  # its alert resolves saying so, not "no leak"
        self._last_seen.pop(pid, None)
        self._gone[pid] = (self.risks.pop(pid, None), self.leaks.pop(pid, None),
                           self.kvs.pop(pid, None), pid in self._sampled)
        self.ended.append(pid)
        self._sampled.discard(pid)
        while len(self._gone) > GONE_KEPT:
            del self._gone[next(iter(self._gone))]

    def _revive(self, pid: int) -> None:
        """A process thought gone sent a record: its models as they were."""
        risk, leak, kv, sampled = self._gone.pop(pid)
        if risk is not None:
            self.risks[pid] = risk
        if leak is not None:
            self.leaks[pid] = leak
        if kv is not None:
            self.kvs[pid] = kv
        if sampled:
            self._sampled.add(pid)
        # it may lead again (the stored leads are these: a revived leak must not stay unnamed)
        self._pick_risk()
        self._pick_leak()

    def _observe_risk(self, s: Sample) -> bool:
        """Feed the sample to its process's model (a device-wide one to every process's);
        True when a model gave a point. ``risk`` becomes the riskiest process's model."""
        if is_device_wide(s):
            self._wide = s
            self._fed = None
            models = [m for pid, m in self.risks.items() if pid is not None] or [self.risk]
            gave = False
            for m in models:
                gave = m.observe(s) or gave
        else:
            model = self.risks.get(s.pid)
            if model is None:
                model = self.risks[s.pid] = RiskModel(self._thresholds)
                if self._wide is not None:
                    model.observe(self._wide)
            gave = model.observe(s)
            self._fed = (s.pid, model)
        # with one process model besides the device's (None), the riskiest is that one
        if gave and len(self.risks) > 1 and not (
                len(self.risks) == 2 and None in self.risks and self.risk_pid == s.pid):
            self._pick_risk()
        return gave

    def _keep_causes(self, ts_s: float) -> None:
        """The episodes of the models the sample fed read their latest points (after the leak
        detectors took the same sample: a cause reads both)."""
        for pid, model in [self._fed] if self._fed is not None else list(self.risks.items()):
            if not model.level_index and model not in self.episodes:
                continue  # no episode, none beginning: the common case
            self.episode(model).observe(model, self.leaks.get(pid) or self.leak, ts_s)

    def episode(self, model: RiskModel) -> CauseEpisode:
        ep = self.episodes.get(model)
        if ep is None:
            ep = self.episodes[model] = CauseEpisode()
        return ep

    def cause_of(self, model: RiskModel, leak: LeakDetector) -> str | None:
        """The cause of ``model``'s risk episode (read from its latest point where no episode
        named one yet); None at ok."""
        point = model.last
        if point is None or point.level == "ok" or not point.reasons:
            return None
        ep = self.episodes.get(model)
        return ep.cause if ep is not None and ep.cause else warning_cause(point, model, leak)

    def _pick_risk(self) -> None:
        procs: dict[int | None, RiskModel] = {
            pid: m for pid, m in self.risks.items() if pid is not None} or self.risks
        if not procs:
            procs = self.risks = {None: RiskModel(self._thresholds)}
        self.risk_pid = max(procs, key=lambda pid: _riskiness(procs[pid]))
        self.risk = procs[self.risk_pid]

    def _leaks_of(self, r: Sample | Event) -> list[LeakDetector]:
        """The detectors a record feeds: its process's; a device-wide (NVML) sample, the
        device's own until a process reports; an event without a pid, every process's. A
        process sample without a pid (a hand-written trace) is the device's own detector's."""
        if r.pid is None:  # (a sample with a pid is never device-wide)
            if isinstance(r, Sample) and is_device_wide(r):
                return [] if self._process_leaks() else [self.leaks[None]]
            if isinstance(r, Sample) and r.allocated_bytes is not None:
                self._sampled.add(None)
                return [self.leaks[None]]
            # events, snapshot readings: every process's
            return self._process_leaks() or [self.leaks[None]]
        leak = self.leaks.get(r.pid)
        if leak is None:
            leak = self.leaks[r.pid] = LeakDetector(self._thresholds)
        if isinstance(r, Sample) and r.pid not in self._sampled:
            self._sampled.add(r.pid)
            self._pick_leak()  # a process's own detector speaks for it from its first sample
        return [leak]

    def _process_leaks(self) -> list[LeakDetector]:
        """Detectors of processes that sent samples (events alone make no idle floor)."""
        return [d for pid, d in self.leaks.items() if pid in self._sampled]

    def sampled_pids(self) -> set[int | None]:
        """The processes whose samples fed a leak detector (``None``: samples without one)."""
        return self._sampled

    def _update_leak(self, s: Sample) -> bool:
        gave = False
        for leak in self._leaks_of(s):
            if leak.update(s) is not None:
                gave = True
                self._growth_to_risk(leak)
        if gave:
            self._pick_leak()
        return gave

    def _growth_to_risk(self, leak: LeakDetector) -> None:
        """The growth model speaks once: a leak verdict's rate and interval become its
        process's time to OOM (the risk model's ``growth``), cleared with the leak."""
        pid = next((p for p, d in self.leaks.items() if d is leak), None)
        model = self.risks.get(pid)
        if model is None:
            return
        r = leak.result
        low, high = r.rate_low_bytes_per_s, r.rate_high_bytes_per_s
        model.growth = None
        # (not a KV pool's orphaned blocks: lost inside the pool, they take no device memory)
        if r.detected and low is not None and high is not None and r.slope_bytes_per_s > 0 \
                and (r.kv is None or not r.kv.sets_slope):
            model.growth = (r.slope_bytes_per_s, low, high)
        growers = [p for p, m in self.risks.items() if p is not None and m.growth is not None]
        for p, m in self.risks.items():  # the others are at risk from the soonest to fill
            others = [g for g in growers if g != p]
            m.grower = min(others, key=lambda g: self.risks[g].time_to_oom_s or float("inf"),
                           default=None)

    def _pick_leak(self) -> None:
        procs = [(pid, d) for pid, d in self.leaks.items() if pid in self._sampled] \
            or [(None, self.leaks[None])]
        self.leak_pid, self.leak = max(procs, key=lambda pd: (
            pd[1].result.detected, pd[1].result.first_detected_ts_s is not None,
            pd[1].result.slope_bytes_per_s))

    def _observe_kv(self, s: Sample) -> bool:
        changed, self.kv = observe_process(self.kvs, self.kv, s)
        return changed

    def process_name(self) -> str | None:
        """Which process ``risk`` is, for alert text: ``rank N (pid P)`` when its rank is
        known, ``pid P`` when the device has several processes, else None."""
        several = sum(1 for p in self.risks if p is not None) > 1
        return self._name(self.risk_pid, several)

    def _name(self, pid: int | None, by_pid: bool) -> str | None:
        """``rank N (pid P)`` when the rank is known, else ``pid P`` if ``by_pid``."""
        if pid is None:
            return None
        rank = self.ranks.get(pid)
        if rank is not None:
            return f"rank {rank} (pid {pid})"
        return f"pid {pid}" if by_pid else None

    def leak_process_name(self) -> str | None:
        """Which process ``leak`` is, for alert text (as ``process_name``)."""
        return self._name(self.leak_pid, True)

    def _absorb_fields(self, s: Sample) -> int:
        changed = 0
        for name in self._raw_fields:
            value = getattr(s, name)
            if value is not None:
                self.fields[name] = value
                changed = _RAW
        return changed

    def _note_risk(self, ts_s: float) -> int:
        """Keep the first warning, the worst level and the soonest OOM forecast; the
        ``_RISK_LEVEL`` bit when the level moved."""
        level = self.risk.level_index
        if level:
            if self.first_warning_ts_s is None:
                self.first_warning_ts_s = ts_s
            if level > self.max_level:
                self.max_level = level
        tto = self.risk.time_to_oom_s
        if tto is not None and (self.min_time_to_oom_s is None or tto < self.min_time_to_oom_s):
            self.min_time_to_oom_s = tto
        if level == self._level_seen:
            return 0
        self._level_seen = level
        return _RISK_LEVEL

    def on_event(self, e: Event) -> int | None:
        """``None`` for an event no rule reads (it is not evaluated), else what it changed."""
        if e.name == EXIT_EVENT:
            return self._on_exit(e)  # before the detectors: an exit feeds none of them
        if e.name == RANK_EVENT and e.pid is not None and isinstance((e.data or {}).get("rank"),
                                                                    int):
            self.ranks[e.pid] = e.data["rank"]  # type: ignore[index]
        if e.name == "oom":
            self._note_oom(e.ts_s, e.pid)
        for leak in self._leaks_of(e):
            leak.on_event(e)
        if e.name == "kv_orphaned_blocks":
            self._pick_leak()
            self.orphaned_blocks = orphaned_count(e)
            return _ORPHANS | _LEAK | (self._oom_changed(e.ts_s) if self.oom_ts_s else 0)
        if e.name == "oom":
            return self._oom_changed(e.ts_s) | self._episode()
        if e.name in SATURATION_EVENTS:
            return _LOAD if self.saturation.on_event(e) else 0
        return None

    def _note_oom(self, ts_s: float, pid: int | None) -> None:
        """An OOM: noted once (two sources may report it), and it ends the risk episode of its
        process (every process's when it names none): their trends and retries start over."""
        if self.oom_ts_s and ts_s - self.oom_ts_s[-1] <= 1.0:
            return
        self.oom_ts_s.append(ts_s)
        for key, model in self.risks.items():
            if pid is None or key == pid or key is None:
                model.restart()
                ep = self.episodes.get(model)
                if ep is not None:
                    ep.end(by_oom=True)
        for key, leak in self.leaks.items():
            if pid is None or key == pid:
                leak.end_growth(ts_s)
        self._episode_ended = True

    def _oom_changed(self, now_s: float) -> int:
        recent = now_s - self.oom_ts_s[-1] < OOM_RECENT_S  # exactly as the oom_recent getter
        if recent == self._oom_recent:
            return 0
        self._oom_recent = recent
        return _OOM

    def value(self, metric: str, now_s: float) -> float | None:
        return getter_for(metric)(self, now_s)


def _riskiness(m: RiskModel) -> tuple[bool, int, float]:
    ratio = m.headroom_ratio
    return m.has_point, m.level_index, -(ratio if ratio is not None else 1.0)


def getter_for(metric: str) -> Callable[[DeviceAnalysis, float], float | None]:
    """How to read ``metric`` from a device's state: derived, or the latest sample field."""
    getter = _DERIVED.get(metric)
    if getter is not None:
        return getter
    return lambda d, now: d.fields.get(metric)


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else num / den


def _cached_free(d: DeviceAnalysis, now: float) -> float | None:
    s = d.last_sample
    if s is None or s.reserved_bytes is None or s.allocated_bytes is None:
        return None
    return s.reserved_bytes - s.allocated_bytes


def _leak_named(r: LeakResult) -> bool:
    """A leak the alert can name with its rate: a KV pool's orphaned blocks, where they are
    the whole answer, once its checks give a rate (``kv_leak.MIN_REPORTS``; the stored verdict
    says "leak" from the first)."""
    k = r.kv
    return r.detected and (k is None or not k.sets_slope or k.blocks_per_s is not None)


def _leak_ratio(d: DeviceAnalysis, now: float) -> float | None:
    limit = d.leak.limit_bytes
    return _ratio(d.leak.result.slope_bytes_per_s * 3600.0, limit)


_DERIVED: dict[str, Callable[[DeviceAnalysis, float], float | None]] = {
    "cached_free_bytes": _cached_free,
    "inactive_split_ratio": lambda d, now: inactive_split_ratio(d.last_sample)
    if d.last_sample else None,
    "external_fragmentation_ratio": lambda d, now: d.risk.external_fragmentation_ratio,
    "device_used_ratio": lambda d, now: _ratio(d.risk._device_used, d.risk.limit_bytes),
    "headroom_bytes": lambda d, now: d.risk.headroom_bytes,
    "headroom_ratio": lambda d, now: d.risk.headroom_ratio,
    "time_to_oom_s": lambda d, now: d.risk.time_to_oom_s,
    "risk_level": lambda d, now: d.risk.level_index if d.risk.has_point else None,
    "leak_detected": lambda d, now: float(_leak_named(d.leak.result)),
    "leak_slope_bytes_per_s": lambda d, now: d.leak.result.slope_bytes_per_s,
    "leak_slope_ratio_per_h": _leak_ratio,
    "kv_usage_ratio": lambda d, now: d.kv.usage_ratio,
    "kv_exhaustion_s": lambda d, now: d.kv.exhaustion_s,
    "kv_exhaustion_horizon_s": lambda d, now: max(d._thresholds.kv_exhaustion_warning_s,
                                                  d.kv.horizon_s),
    "kv_orphaned_blocks": lambda d, now: float(d.orphaned_blocks),
    "oom_recent": lambda d, now: float(bool(d.oom_ts_s) and now - d.oom_ts_s[-1] < OOM_RECENT_S),
    CONFIG_METRIC: lambda d, now: d.config_check.headroom_bytes(d.risk.limit_bytes)
    if d.config_check else None,
    SATURATION_METRIC: lambda d, now: d.saturation.value(d.kv.usage_ratio, d.kv.blocks_total,
                                                         now),
}


class _RuleState:
    """One rule on one device: its metric getter and where it stands."""

    __slots__ = ("rule", "getter", "gate", "horizon", "op", "threshold", "inputs", "quiet",
                 "pending_since", "fired_ts", "clear_since", "resolved_ts", "hold")

    def __init__(self, rule: Rule) -> None:
        self.rule = rule  # its threshold: ``limit`` (a horizon's value may raise it)
        self.getter = getter_for(rule.metric)
        self.gate = getter_for(rule.gate.metric) if rule.gate is not None else None
        self.horizon = getter_for(rule.horizon) if rule.horizon is not None else None
        self.op, self.threshold = OPS[rule.op], rule.threshold  # Rule.breached, inlined
        self.inputs = inputs_of(rule.metric) | (inputs_of(rule.gate.metric) if rule.gate else 0)
        if rule.horizon is not None:
            self.inputs |= inputs_of(rule.horizon)
        # quiet: no timer runs and the last evaluation changed nothing, so only a change of
        # its inputs can make the next one do something (a new state is evaluated at once)
        self.quiet = False
        self.pending_since: float | None = None
        self.fired_ts: float | None = None
        self.clear_since: float | None = None
        self.resolved_ts: float | None = None  # when it last resolved
        self.hold = 1.0  # clear_for is stretched this much (a ``backoff`` rule that came back)


class _DeviceRules:
    """The rules that apply to one device; ``watch``: their inputs; ``busy``: some rule is not
    quiet (a timer runs, or it has yet to be evaluated)."""

    __slots__ = ("states", "watch", "busy")

    def __init__(self, rules: Iterable[Rule], device: int) -> None:
        self.states = [_RuleState(r) for r in rules if r.device is None or r.device == device]
        self.watch = 0
        for st in self.states:
            self.watch |= st.inputs
        self.busy = bool(self.states)


class AlertEngine:
    """Rules over the records of every device; ``feed`` returns what fired and resolved."""

    def __init__(self, rules: Iterable[Rule], thresholds: Thresholds | None = None,
                 server: ServerLimits | None = None) -> None:
        self.rules = list(rules)
        self.thresholds = thresholds or Thresholds()
        self.server = server  # the [server] section: each device checks it at its limit
        self.devices: dict[int, DeviceAnalysis] = {}
        self._raw = frozenset(r.metric for r in self.rules if r.metric in SAMPLE_COUNTER_FIELDS)
        self._state: dict[int, _DeviceRules] = {}  # per device, in rule order
        # the newest changes, for a caller that did not keep feed's returns; bounded so that a
        # live agent never grows without end (analyze and import keep every change they feed)
        self.history: deque[AlertChange] = deque(maxlen=HISTORY_MAX)
        # each process's answers as they change: the rows the store keeps (verdicts.py)
        self.verdicts = VerdictLog()

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> AlertEngine:
        return cls(rules_from(config), Thresholds.from_config(config),
                   server_from_config(config))

    def device(self, index: int) -> DeviceAnalysis:
        d = self.devices.get(index)
        if d is None:
            d = self.devices[index] = DeviceAnalysis(index, self.thresholds, self._raw)
            if self.server is not None:
                d.config_check = LimitCheck(self.server)
            self._state[index] = _DeviceRules(self.rules, index)
        return d

    def feed(self, records: Iterable[Sample | Event]) -> list[AlertChange]:
        """Process records, put in time order here exactly as ``analyze`` orders a recording
        (an event before a sample of the same instant; other ties keep their order)."""
        records = records if isinstance(records, list) else list(records)
        # type(r) is faster than isinstance, and mypy cannot narrow it: hence the casts
        return self.feed_batch(cast("list[Sample]", [r for r in records if type(r) is not Event]),
                               cast("list[Event]", [r for r in records if type(r) is Event]))

    def feed_batch(self, samples: Sequence[Sample], events: Sequence[Event]) -> list[AlertChange]:
        """``feed`` for records already apart (the agent writer's batches): the same order."""
        changes: list[AlertChange] = []
        devices, state, verdicts = self.devices, self._state, self.verdicts
        for rec in merged(samples, events):
            d = devices.get(rec.device) or self.device(rec.device)
            if type(rec) is Event:
                changed = d.on_event(rec)
                if changed is None:
                    continue
            else:
                changed = d.on_sample(rec)  # type: ignore[arg-type]  # not an Event: a Sample
            rules = state[rec.device]
            if changed & rules.watch or rules.busy:
                self._evaluate(d, rules, changed, rec.ts_s, rec.host, changes)
            if type(rec) is not Event or changed & _VERDICT:
                verdicts.note(d, rec.pid, rec.host, rec.ts_s)
                verdicts.note_device(d, rec.host, rec.ts_s)
            if d.ended:
                verdicts.end(d, rec.host, rec.ts_s)
        self.history.extend(changes)
        return changes

    def active(self) -> list[tuple[str, int, float]]:
        """``(rule, device, fired_ts_s)`` of every alert now firing."""
        return [(st.rule.name, dev, st.fired_ts) for dev, rules in self._state.items()
                for st in rules.states if st.fired_ts is not None]

    def _evaluate(self, d: DeviceAnalysis, rules: _DeviceRules, changed: int, now: float,
                  host: str | None, out: list[AlertChange]) -> None:
        busy = False
        for st in rules.states:
            if changed & _EPISODE and st.rule.backoff and st.fired_ts is not None:
                # the OOM ends the episode: its alert resolves, and the OOM's own record does
                # not open the next one (a server that goes on at its limit: the next record)
                self._resolve(st, d, now, st.getter(d, now), host, out, "ended by an OOM")
                busy = True
                continue
            if d.exited_risk is not None and st.rule.backoff and st.fired_ts is not None \
                    and not st.rule.breached(st.getter(d, now), _limit(st, d, now)):
                # its process exited, and the processes left are below its level
                self._resolve(st, d, now, st.getter(d, now), host, out,
                              f"pid {d.exited_risk} exited")
                busy = True
                continue
            if st.quiet and not st.inputs & changed:
                continue
            if d.ended_leak is not None and st.fired_ts is not None \
                    and st.rule.metric == "leak_detected":
                pid, how = d.ended_leak
                self._resolve(st, d, now, None, host, out,
                              f"pid {pid} {how}; its last answer: leak")
                continue
            value, before = st.getter(d, now), len(out)
            if st.fired_ts is None:
                limit = st.threshold if st.horizon is None else _limit(st, d, now)
                if st.pending_since is not None or (value is not None
                                                    and st.op(value, limit)):
                    self._maybe_fire(st.rule, st, d, now, value, host, out)
                st.quiet = st.pending_since is None and len(out) == before
            else:
                self._maybe_resolve(st.rule, st, d, now, value, host, out)
                st.quiet = st.clear_since is None and len(out) == before
            busy = busy or not st.quiet
        rules.busy = busy
        d.ended_leak = d.exited_risk = None

    def _maybe_fire(self, rule: Rule, st: _RuleState, d: DeviceAnalysis, now: float,
                    value: float | None, host: str | None, out: list[AlertChange]) -> None:
        if not rule.breached(value, _limit(st, d, now)) or not _gate_holds(st, d, now):
            st.pending_since = None
            return
        if st.pending_since is None:
            st.pending_since = now
        if now - st.pending_since >= rule.for_s or rule.is_urgent(value):
            st.fired_ts, st.clear_since = now, None
            if rule.backoff:
                back = st.resolved_ts is not None and now - st.resolved_ts <= BACKOFF_WINDOW_S
                st.hold = min(BACKOFF_MAX, 2.0 * st.hold) if back else 1.0
            out.append(AlertChange("fired", rule.name, rule.severity, d.device, now, value,
                                   _message(rule, value, d), rule.labels, now, host))

    def _maybe_resolve(self, rule: Rule, st: _RuleState, d: DeviceAnalysis, now: float,
                       value: float | None, host: str | None, out: list[AlertChange]) -> None:
        # a gated rule holds while its gate does and resolves once it does not (a pool below
        # its usage gate is no longer running out, whatever its fill trend said before)
        held = _gate_holds(st, d, now) if st.gate is not None \
            else not rule.cleared(value, _limit(st, d, now))
        if held:
            st.clear_since = None
            return
        if st.clear_since is None:
            st.clear_since = now
        if now - st.clear_since >= rule.clear_for_s * st.hold:
            self._resolve(st, d, now, value, host, out)

    @staticmethod
    def _resolve(st: _RuleState, d: DeviceAnalysis, now: float, value: float | None,
                 host: str | None, out: list[AlertChange], why: str = "") -> None:
        """The alert resolves; ``why``: an OOM ended it (then it is no back-off's business)."""
        rule, fired = st.rule, st.fired_ts
        assert fired is not None  # only a fired alert resolves
        st.fired_ts = st.pending_since = st.clear_since = None
        st.resolved_ts = None if why else now
        text = rule.describe(value) + (f" ({why})" if why else "")
        out.append(AlertChange("resolved", rule.name, rule.severity, d.device, now, value,
                               text, rule.labels, fired, host))


def _limit(st: _RuleState, d: DeviceAnalysis, now: float) -> float:
    """The rule's threshold now: its own, or its horizon metric's value when that is larger."""
    if st.horizon is None:
        return st.threshold
    horizon = st.horizon(d, now)
    return horizon if horizon is not None and horizon > st.threshold else st.threshold


def _gate_holds(st: _RuleState, d: DeviceAnalysis, now: float) -> bool:
    """The rule's gate holds (a rule without one: always)."""
    gate = st.rule.gate  # set with st.gate
    return st.gate is None or gate is None or gate.holds(st.gate(d, now))


# Metrics read from the risk model: with several processes on a device, the riskiest one's.
_PER_PROCESS_METRICS = frozenset({"risk_level", "headroom_bytes", "headroom_ratio",
                                  "time_to_oom_s", "device_used_ratio",
                                  "external_fragmentation_ratio"})


def _message(rule: Rule, value: float | None, d: DeviceAnalysis) -> str:
    """The rule's text; a risk alert adds why and the first remedy for that cause."""
    if rule.metric == CONFIG_METRIC and d.config_check is not None:
        return d.config_check.message() or rule.describe(value)  # names the limit to lower
    if rule.builtin and rule.metric == SATURATION_METRIC:
        return d.saturation.message(rule.message or rule.name)  # with its numbers
    text = rule.describe(value)
    who = d.process_name() if rule.metric in _PER_PROCESS_METRICS else None
    if who is not None:
        text = f"{text} [{who}]"
    if rule.builtin and rule.metric == "leak_detected" and d.leak.result.detected:
        return leak_text(d.leak.result, d.leak.limit_bytes, d.leak_process_name())
    point = d.risk.last
    if rule.metric != "risk_level" or point is None or not point.reasons:
        return text
    leak = d.leaks.get(d.risk_pid) or d.leak
    cause = d.cause_of(d.risk, leak) or warning_cause(point, d.risk, leak)
    if rule.builtin:
        return risk_text(point, d.risk, leak, who, cause)
    return f"{text}; {risk_reasons(point, d.risk)}: likely {cause}; try: {REMEDIES[cause][0]}"
