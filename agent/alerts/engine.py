"""The alert engine: rules evaluated incrementally over records (docs/alerts.md, "Evaluation").

The same :class:`AlertEngine` runs live in the agent's writer and offline in ``vramscope
analyze``; it depends only on the records it is fed, never on a clock, so both give identical
alerts. It does no I/O: its :class:`AlertChange` results go to the sinks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, cast

from vramscope.agent.alerts.config_check import LimitCheck, ServerLimits, server_from_config
from vramscope.agent.alerts.device import DeviceAnalysis
from vramscope.agent.alerts.explain import leak_text, risk_reasons, risk_text, warning_cause
from vramscope.agent.alerts.metrics import (
    CONFIG_METRIC,
    IN_EPISODE,
    SATURATION_METRIC,
    VERDICT_INPUTS,
    getter_for,
    inputs_of,
)
from vramscope.agent.alerts.rules import BACKOFF_MAX, BACKOFF_WINDOW_S, OPS, Rule, rules_from
from vramscope.agent.alerts.verdicts import VerdictLog
from vramscope.agent.analysis.diagnosis import REMEDIES
from vramscope.agent.analysis.merge import merged
from vramscope.agent.analysis.thresholds import Thresholds
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS, Event, Sample

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
            if type(rec) is not Event or changed & VERDICT_INPUTS:
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
        # read once: no rule's evaluation moves them (they are cleared after the loop)
        episode, exited, ended_leak = changed & IN_EPISODE, d.exited_risk, d.ended_leak
        for st in rules.states:
            if st.fired_ts is not None and (episode or exited is not None) and st.rule.backoff:
                if episode:
                    # the OOM ends the episode: its alert resolves, and the OOM's own record
                    # does not open the next one (a server that goes on at its limit: the next
                    # record)
                    self._resolve(st, d, now, st.getter(d, now), host, out, "ended by an OOM")
                    busy = True
                    continue
                if not st.rule.breached(st.getter(d, now), _limit(st, d, now)):
                    # its process exited, and the processes left are below its level
                    self._resolve(st, d, now, st.getter(d, now), host, out,
                                  f"pid {exited} exited")
                    busy = True
                    continue
            if st.quiet and not st.inputs & changed:
                continue
            if ended_leak is not None and st.fired_ts is not None \
                    and st.rule.metric == "leak_detected":
                pid, how = ended_leak
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
