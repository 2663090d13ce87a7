"""The live analysis state of one device: what the alert engine's rules and verdicts read.

A risk model, a leak detector and a KV tracker per server process (and the device's own), which
of them leads, the processes gone, OOMs, the ``[server]`` check and the saturation window; fed
records in time order, it says as input bits (``metrics.py``) what each changed. The models are
``vramscope.agent.analysis``'s; this is the state that picks among them.
"""

from __future__ import annotations

from collections.abc import Sequence
from weakref import WeakKeyDictionary

from vramscope.agent.alerts.config_check import LimitCheck
from vramscope.agent.alerts.explain import CauseEpisode, warning_cause
from vramscope.agent.alerts.metrics import (
    IN_DEVICE,
    IN_EPISODE,
    IN_KV,
    IN_LEAK,
    IN_LOAD,
    IN_OOM,
    IN_ORPHANS,
    IN_RAW,
    IN_RISK,
    IN_RISK_LEVEL,
    IN_SAMPLE,
    IN_SNAPSHOT,
    OOM_RECENT_S,
    getter_for,
)
from vramscope.agent.alerts.saturation import EVENTS as SATURATION_EVENTS
from vramscope.agent.alerts.saturation import Saturation
from vramscope.agent.analysis.kv import KvTracker, observe_process
from vramscope.agent.analysis.leaks import LeakDetector, orphaned_count
from vramscope.agent.analysis.merge import is_device_wide
from vramscope.agent.analysis.risk_model import RiskModel
from vramscope.agent.analysis.thresholds import Thresholds
from vramscope.agent.records import EXIT_EVENT, RANK_EVENT, SAMPLE_COUNTER_FIELDS, Event, Sample

# a process silent this long is gone (its hooks sample several times a second while it lives):
# its models no longer speak, and its last verdict row says it ended; a process that says it
# exits (a ``process_exit`` event) is gone at once
PROCESS_GONE_S = 60.0
GONE_KEPT = 64  # gone processes whose models are kept, should their records arrive late


class DeviceAnalysis:
    """The live analysis state of one device: models plus the latest value of each field.

    ``on_sample`` and ``on_event`` return what the record changed, as input bits (above).
    """

    def __init__(self, device: int, thresholds: Thresholds, raw_fields: frozenset[str]) -> None:
        self.device = device
        self._thresholds: Thresholds = thresholds
        # One risk model per server process on the device (its own limit, the device's NVML
        # view; DESIGN.md rule 6), None: the device's NVML view before any process reported.
        # ``risk`` is the one the rules read: the riskiest process's.
        self.risks: dict[int | None, RiskModel] = {None: RiskModel(thresholds)}
        self.risk: RiskModel = self.risks[None]
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
        self.leak: LeakDetector = self.leaks[None]
        self.leak_pid: int | None = None  # whose detector ``leak`` is
        self._sampled: set[int | None] = set()  # whose process samples fed a leak detector
        # KV pools per process too (two servers on a GPU have two pools); ``kv`` is the
        # fullest one's tracker, the one the rules and the report read.
        self.kvs: dict[int | None, KvTracker] = {}
        self.kv: KvTracker = KvTracker()
        self.fields: dict[str, int] = {}
        self._raw_fields = tuple(f for f in SAMPLE_COUNTER_FIELDS if f in raw_fields)
        self.last_sample: Sample | None = None
        self.first_warning_ts_s: float | None = None
        self.max_level = 0
        self.min_time_to_oom_s: float | None = None
        self.oom_ts_s: list[float] = []
        self.orphaned_blocks: int = 0
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
        self.saturation: Saturation = Saturation()  # queues and preemptions (saturation.py)

    def on_sample(self, s: Sample) -> int:
        self.last_sample = s
        changed = IN_SAMPLE
        if self._raw_fields:
            changed |= self._absorb_fields(s)
        pid, ts_s = s.pid, s.ts_s
        if pid is not None:
            if pid in self._gone:
                self._revive(pid)
            self._last_seen[pid] = ts_s
            if ts_s >= self._next_gone_check and self._forget_gone(ts_s):
                changed |= IN_LEAK
        num_ooms = s.num_ooms
        if num_ooms is not None:
            if self._num_ooms is not None and num_ooms > self._num_ooms:
                self._note_oom(ts_s, pid)
            self._num_ooms = num_ooms
        if self._observe_risk(s):
            changed |= IN_RISK | self._note_risk(ts_s)
        if s.device_used_bytes is not None or s.device_total_bytes:
            changed |= IN_DEVICE
        if s.largest_free_block_bytes is not None:
            changed |= IN_SNAPSHOT
        if self._update_leak(s):
            changed |= IN_LEAK
        if changed & IN_RISK:
            self._keep_causes(ts_s)
        if s.kv_blocks_used is not None and self._observe_kv(s):
            changed |= IN_KV
        if self.oom_ts_s:
            changed |= self._oom_changed(ts_s)
        return changed | self._episode() if self._episode_ended else changed

    def _episode(self) -> int:
        """``IN_EPISODE`` once after an OOM (the risk alerts it ended resolve)."""
        if not self._episode_ended:
            return 0
        self._episode_ended = False
        return IN_EPISODE

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
        return IN_LEAK | IN_RISK | IN_DEVICE | self._note_risk(e.ts_s)

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

    @property
    def window_leak(self) -> LeakDetector:
        """The leak of the whole record, for a document of it (``analyze``): the leading
        detector where it has found one; else that of a process gone within the record whose
        detector had (a leaker that exited before the record's end: its leak ran in it, as the
        stored window's lead says, ``store/verdicts.window_leak_lead``); else the lead."""
        if self.leak.result.first_detected_ts_s is not None:
            return self.leak
        found = [d for _, d, _, _ in self._gone.values()
                 if d is not None and d.result.first_detected_ts_s is not None]
        return max(found, key=lambda d: d.result.slope_bytes_per_s, default=self.leak)

    def retired_leak(self, pid: int) -> LeakDetector | None:
        """The leak detector of process ``pid`` as it was when the process went (``_retire``),
        None where it had none or it is no longer kept."""
        gone = self._gone.get(pid)
        return None if gone is None else gone[1]

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
        if s.pid is None and is_device_wide(s):  # (a sample with a pid never is: no call)
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
        fed = self._fed
        if fed is not None:  # one process's sample (the common case): without a list
            pid, model = fed
            if model.level_index or model in self.episodes:
                self.episode(model).observe(model, self.leaks.get(pid) or self.leak, ts_s)
            return
        for pid, model in list(self.risks.items()):
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

    def _leaks_of(self, r: Sample | Event) -> Sequence[LeakDetector]:
        """The detectors a record feeds: its process's; a device-wide (NVML) sample, the
        device's own until a process reports; an event without a pid, every process's. A
        process sample without a pid (a hand-written trace) is the device's own detector's."""
        pid = r.pid
        if pid is not None:  # (a sample with a pid is never device-wide)
            leak = self.leaks.get(pid)
            if leak is not None and pid in self._sampled:
                return (leak,)  # the common case, first and cheap: a sample of a known process
            if leak is None:
                leak = self.leaks[pid] = LeakDetector(self._thresholds)
            if isinstance(r, Sample):
                self._sampled.add(pid)
                self._pick_leak()  # a process's own detector speaks for it from its first sample
            return (leak,)
        if isinstance(r, Sample) and is_device_wide(r):
            return [] if self._process_leaks() else [self.leaks[None]]
        if isinstance(r, Sample) and r.allocated_bytes is not None:
            self._sampled.add(None)
            return [self.leaks[None]]
        # events, snapshot readings: every process's
        return self._process_leaks() or [self.leaks[None]]

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
                changed = IN_RAW
        return changed

    def _note_risk(self, ts_s: float) -> int:
        """Keep the first warning, the worst level and the soonest OOM forecast; the
        ``IN_RISK_LEVEL`` bit when the level moved."""
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
        return IN_RISK_LEVEL

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
            return IN_ORPHANS | IN_LEAK | (self._oom_changed(e.ts_s) if self.oom_ts_s else 0)
        if e.name == "oom":
            return self._oom_changed(e.ts_s) | self._episode()
        if e.name in SATURATION_EVENTS:
            return IN_LOAD if self.saturation.on_event(e) else 0
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
        return IN_OOM

    def value(self, metric: str, now_s: float) -> float | None:
        return getter_for(metric)(self, now_s)


def _riskiness(m: RiskModel) -> tuple[bool, int, float]:
    ratio = m.headroom_ratio
    return m.has_point, m.level_index, -(ratio if ratio is not None else 1.0)
