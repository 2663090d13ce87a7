"""The alert engine: rules evaluated incrementally over records, and the sinks alerts go to.

The same :class:`AlertEngine` runs live in the agent's writer thread and offline in
``vramscope analyze``; it depends only on the records it is fed (never on a clock), so both give
identical alerts. Per device it runs the analysis models (``agent.analysis``: risk, leak, KV),
and after every sample (or OOM / orphaned-block event) evaluates each rule:

- ``pending`` when the condition first holds; ``fired`` once it has held ``for`` seconds;
- an active alert ``resolved`` once the value is past the rule's ``clear`` threshold (or no
  longer breaches the threshold) and has stayed there ``clear_for`` seconds.

Sinks (``LogSink``, ``WebhookSink``, ``StoreSink``) take each :class:`AlertChange`; ``send``
never blocks ingest and never raises.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from agent.alert_rules import OPS, Rule, rules_from
from agent.analysis.diagnosis import diagnose_warning
from agent.analysis.fragmentation import inactive_split_ratio
from agent.analysis.kv import KvTracker
from agent.analysis.leaks import LeakDetector, orphaned_count
from agent.analysis.merge import merged
from agent.analysis.risk import RiskModel
from agent.analysis.thresholds import Thresholds
from agent.clock import SYSTEM_CLOCK, Clock
from agent.records import SAMPLE_COUNTER_FIELDS, Event, Sample

log = logging.getLogger("vramscope.alerts")
OOM_RECENT_S = 300.0
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


class DeviceAnalysis:
    """The live analysis state of one device: models plus the latest value of each field."""

    def __init__(self, device: int, thresholds: Thresholds, raw_fields: frozenset[str]) -> None:
        self.device = device
        self.risk = RiskModel(thresholds)
        self.leak = LeakDetector(thresholds)
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

    def on_sample(self, s: Sample) -> None:
        self.last_sample = s
        if self._raw_fields:
            for name in self._raw_fields:
                value = getattr(s, name)
                if value is not None:
                    self.fields[name] = value
        if s.num_ooms is not None:
            if self._num_ooms is not None and s.num_ooms > self._num_ooms:
                self._note_oom(s.ts_s)
            self._num_ooms = s.num_ooms
        point = self.risk.update(s)
        if point is not None and (point.time_to_oom_s is not None or self.risk.level_index):
            self._note_risk(point)
        self.leak.update(s)
        if s.kv_blocks_used is not None:
            self.kv.update(s)

    def _note_risk(self, point) -> None:
        level = self.risk.level_index
        if level and self.first_warning_ts_s is None:
            self.first_warning_ts_s = point.ts_s
        self.max_level = max(self.max_level, level)
        tto = point.time_to_oom_s
        if tto is not None and (self.min_time_to_oom_s is None or tto < self.min_time_to_oom_s):
            self.min_time_to_oom_s = tto

    def on_event(self, e: Event) -> None:
        if e.name == "oom":
            self._note_oom(e.ts_s)
        self.leak.on_event(e)
        if e.name == "kv_orphaned_blocks":
            self.orphaned_blocks = orphaned_count(e)

    def _note_oom(self, ts_s: float) -> None:
        if not self.oom_ts_s or ts_s - self.oom_ts_s[-1] > 1.0:  # one OOM seen by two sources
            self.oom_ts_s.append(ts_s)

    def value(self, metric: str, now_s: float) -> float | None:
        return getter_for(metric)(self, now_s)


def getter_for(metric: str) -> Callable[[DeviceAnalysis, float], float | None]:
    """How to read ``metric`` from a device's state: derived, or the latest sample field."""
    getter = _DERIVED.get(metric)
    if getter is not None:
        return getter
    return lambda d, now: d.fields.get(metric)


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else num / den


def _risk_attr(name: str) -> Callable[[DeviceAnalysis, float], float | None]:
    return lambda d, now: getattr(d.risk.last, name) if d.risk.last is not None else None


def _cached_free(d: DeviceAnalysis, now: float) -> float | None:
    s = d.last_sample
    if s is None or s.reserved_bytes is None or s.allocated_bytes is None:
        return None
    return s.reserved_bytes - s.allocated_bytes


def _leak_ratio(d: DeviceAnalysis, now: float) -> float | None:
    limit = d.leak.limit_bytes
    return _ratio(d.leak.result.slope_bytes_per_s * 3600.0, limit)


_DERIVED: dict[str, Callable[[DeviceAnalysis, float], float | None]] = {
    "cached_free_bytes": _cached_free,
    "inactive_split_ratio": lambda d, now: inactive_split_ratio(d.last_sample)
    if d.last_sample else None,
    "external_fragmentation_ratio": lambda d, now: d.risk.external_fragmentation_ratio,
    "device_used_ratio": lambda d, now: _ratio(d.risk._device_used, d.risk.limit_bytes),
    "headroom_bytes": _risk_attr("headroom_bytes"),
    "headroom_ratio": _risk_attr("headroom_ratio"),
    "time_to_oom_s": _risk_attr("time_to_oom_s"),
    "risk_level": lambda d, now: d.risk.level_index if d.risk.last else None,
    "leak_detected": lambda d, now: float(d.leak.result.detected),
    "leak_slope_bytes_per_s": lambda d, now: d.leak.result.slope_bytes_per_s,
    "leak_slope_ratio_per_h": _leak_ratio,
    "kv_usage_ratio": lambda d, now: d.kv.last.usage_ratio if d.kv.last else None,
    "kv_exhaustion_s": lambda d, now: d.kv.last.exhaustion_s if d.kv.last else None,
    "kv_orphaned_blocks": lambda d, now: float(d.orphaned_blocks),
    "oom_recent": lambda d, now: float(bool(d.oom_ts_s) and now - d.oom_ts_s[-1] < OOM_RECENT_S),
}


class _RuleState:
    """One rule on one device: its metric getter and where it stands."""

    __slots__ = ("rule", "getter", "gate", "op", "threshold", "pending_since", "fired_ts",
                 "clear_since")

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.getter = getter_for(rule.metric)
        self.gate = getter_for(rule.gate.metric) if rule.gate is not None else None
        self.op, self.threshold = OPS[rule.op], rule.threshold  # Rule.breached, inlined
        self.pending_since: float | None = None
        self.fired_ts: float | None = None
        self.clear_since: float | None = None


class AlertEngine:
    """Rules over the records of every device; ``feed`` returns what fired and resolved."""

    def __init__(self, rules: Iterable[Rule], thresholds: Thresholds | None = None) -> None:
        self.rules = list(rules)
        self.thresholds = thresholds or Thresholds()
        self.devices: dict[int, DeviceAnalysis] = {}
        self._raw = frozenset(r.metric for r in self.rules if r.metric in SAMPLE_COUNTER_FIELDS)
        self._state: dict[int, list[_RuleState]] = {}  # per device, in rule order
        # every change so far, for analyze; bounded so that a live agent never grows without end
        self.history: deque[AlertChange] = deque(maxlen=HISTORY_MAX)

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> AlertEngine:
        return cls(rules_from(config), Thresholds.from_config(config))

    def device(self, index: int) -> DeviceAnalysis:
        d = self.devices.get(index)
        if d is None:
            d = self.devices[index] = DeviceAnalysis(index, self.thresholds, self._raw)
        return d

    def feed(self, records: Iterable[Sample | Event]) -> list[AlertChange]:
        """Process records, put in time order here exactly as ``analyze`` orders a recording
        (an event before a sample of the same instant; other ties keep their order)."""
        changes: list[AlertChange] = []
        records = records if isinstance(records, list) else list(records)
        batch = merged([r for r in records if type(r) is not Event],
                       [r for r in records if type(r) is Event])
        devices = self.devices
        for rec in batch:
            d = devices.get(rec.device) or self.device(rec.device)
            if type(rec) is Event:
                d.on_event(rec)
                if rec.name not in ("oom", "kv_orphaned_blocks"):
                    continue
            else:
                d.on_sample(rec)
            self._evaluate(d, rec.ts_s, rec.host, changes)
        self.history.extend(changes)
        return changes

    def active(self) -> list[tuple[str, int, float]]:
        """``(rule, device, fired_ts_s)`` of every alert now firing."""
        return [(st.rule.name, dev, st.fired_ts) for dev, states in self._state.items()
                for st in states if st.fired_ts is not None]

    def _evaluate(self, d: DeviceAnalysis, now: float, host: str | None,
                  out: list[AlertChange]) -> None:
        states = self._state.get(d.device)
        if states is None:
            states = self._state[d.device] = [_RuleState(r) for r in self.rules
                                              if r.device is None or r.device == d.device]
        for st in states:
            value = st.getter(d, now)
            if st.fired_ts is None:
                if st.pending_since is not None or (value is not None
                                                    and st.op(value, st.threshold)):
                    self._maybe_fire(st.rule, st, d, now, value, host, out)
            else:
                self._maybe_resolve(st.rule, st, d, now, value, host, out)

    def _maybe_fire(self, rule: Rule, st: _RuleState, d: DeviceAnalysis, now: float,
                    value: float | None, host: str | None, out: list[AlertChange]) -> None:
        if not rule.breached(value) or not _gate_holds(st, d, now):
            st.pending_since = None
            return
        if st.pending_since is None:
            st.pending_since = now
        if now - st.pending_since >= rule.for_s or rule.is_urgent(value):
            st.fired_ts, st.clear_since = now, None
            out.append(AlertChange("fired", rule.name, rule.severity, d.device, now, value,
                                   _message(rule, value, d), rule.labels, now, host))

    def _maybe_resolve(self, rule: Rule, st: _RuleState, d: DeviceAnalysis, now: float,
                       value: float | None, host: str | None, out: list[AlertChange]) -> None:
        if not rule.cleared(value) or (st.gate is not None and _gate_holds(st, d, now)):
            st.clear_since = None
            return
        if st.clear_since is None:
            st.clear_since = now
        if now - st.clear_since >= rule.clear_for_s:
            fired, st.fired_ts, st.pending_since = st.fired_ts, None, None
            out.append(AlertChange("resolved", rule.name, rule.severity, d.device, now, value,
                                   rule.describe(value), rule.labels, fired, host))


def _gate_holds(st: _RuleState, d: DeviceAnalysis, now: float) -> bool:
    """The rule's gate holds (a rule without one: always)."""
    return st.gate is None or st.rule.gate.holds(st.gate(d, now))


def _message(rule: Rule, value: float | None, d: DeviceAnalysis) -> str:
    """The rule's text; a risk alert adds why and the first remedy for that cause."""
    text = rule.describe(value)
    point = d.risk.last
    if rule.metric != "risk_level" or point is None or not point.reasons:
        return text
    cause, remedies = diagnose_warning(point.reasons)
    return f"{text}; {', '.join(point.reasons)}: likely {cause}; try: {remedies[0]}"


# --- sinks -----------------------------------------------------------------------------------
class LogSink:
    """One log line per change."""

    def __init__(self, logger: logging.Logger = log) -> None:
        self.logger = logger

    def send(self, change: AlertChange) -> None:
        level = logging.WARNING if change.kind == "fired" else logging.INFO
        self.logger.log(level, "alert %s %s [%s] device %s at %.3f: %s", change.kind,
                        change.rule, change.severity, change.device, change.ts_s, change.message)

    def close(self) -> None:
        pass


class StoreSink:
    """Opens an alert row when one fires and resolves that row when it resolves."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._open: dict[tuple[str, int, str | None], int] = {}

    def send(self, change: AlertChange) -> None:
        key = (change.rule, change.device, change.host)
        try:
            if change.kind == "fired":
                self._open[key] = self.store.open_alert(
                    change.rule, change.severity, change.ts_s, device=change.device,
                    value=change.value, message=change.message, labels=dict(change.labels) or None,
                    host=change.host)
            elif key in self._open:
                self.store.resolve_alert(self._open.pop(key), change.ts_s)
        except Exception as exc:  # a sink never raises into ingest
            log.error("could not store alert %s: %s", change.rule, exc)

    def close(self) -> None:
        pass


def _urllib_post(url: str, body: bytes, timeout_s: float) -> int:
    import urllib.request  # only where a webhook is configured

    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json",
                                          "User-Agent": "vramscope-alerts"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return resp.status


class WebhookSink:
    """POSTs each change as JSON from its own thread; a full queue drops (and counts) changes.

    A failed POST (error or status >= 300) is retried ``retries`` times, waiting
    ``backoff_s × 2**attempt`` between tries on the injected clock.
    """

    def __init__(self, url: str, *, timeout_s: float = 5.0, retries: int = 3,
                 backoff_s: float = 0.5, queue_max: int = 1000, clock: Clock = SYSTEM_CLOCK,
                 post: Callable[[str, bytes, float], int] = _urllib_post) -> None:
        self.url, self.timeout_s, self.retries, self.backoff_s = url, timeout_s, retries, backoff_s
        self.clock, self._post = clock, post
        self._queue: queue.Queue[AlertChange | None] = queue.Queue(maxsize=queue_max)
        self.sent = self.failed = self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="vramscope-webhook", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: Mapping[str, Any], clock: Clock = SYSTEM_CLOCK) -> WebhookSink:
        return cls(config["alerts.webhook_url"], timeout_s=config["alerts.webhook_timeout_s"],
                   retries=config["alerts.webhook_retries"], clock=clock)

    def send(self, change: AlertChange) -> None:
        try:
            self._queue.put_nowait(change)
        except queue.Full:
            self.dropped += 1

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued (bounded by ``timeout_s``), then stop the thread."""
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            change = self._queue.get()
            if change is None:
                return
            self._deliver(change)

    def _deliver(self, change: AlertChange) -> None:
        body = json.dumps(change.to_json(), sort_keys=True).encode("utf-8")
        for attempt in range(self.retries + 1):
            try:
                status = self._post(self.url, body, self.timeout_s)
                if status < 300:
                    self.sent += 1
                    return
                problem = f"HTTP {status}"
            except Exception as exc:
                problem = str(exc)
            if attempt < self.retries:
                self.clock.sleep(self.backoff_s * 2 ** attempt)
        self.failed += 1
        log.error("alert webhook %s failed after %d tries: %s (alerts.webhook_url)", self.url,
                  self.retries + 1, problem)


def sinks_from_config(config: Mapping[str, Any], store: Any = None,
                      clock: Clock = SYSTEM_CLOCK) -> list:
    """Log always; the store when given; the webhook when ``alerts.webhook_url`` is set."""
    sinks: list = [LogSink()]
    if store is not None:
        sinks.append(StoreSink(store))
    if config is not None and config.get("alerts.webhook_url"):
        sinks.append(WebhookSink.from_config(config, clock))
    return sinks


make_sinks = sinks_from_config  # the name the agent daemon looks for
