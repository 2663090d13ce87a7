"""Alert rules: the built-in defaults from the ``alerts.*`` settings plus ``[[alerts.rules]]``.

A user rule is a TOML table with ``name``, ``metric`` (a sample field or a derived metric,
``METRICS``), ``op``, ``threshold`` and the optional ``for``, ``clear``, ``clear_for``,
``severity``, ``labels``, ``device`` and ``message`` (each key: docs/alerts.md, "User rules";
a ``name`` of a built-in replaces it). A bad rule raises :class:`ConfigError` naming the rule
(its name, or its position) and the key.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vramscope.agent.alerts import metrics as m
from vramscope.agent.alerts.metrics import DERIVED
from vramscope.agent.analysis.severity import ALERT_SEVERITIES, LEVELS
from vramscope.agent.errors import ConfigError
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS

OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
    "==": operator.eq, "!=": operator.ne,
}

# what a rule may name: a sample field, or a derived metric of agent/alerts/metrics.py's table
METRICS: tuple[str, ...] = tuple(SAMPLE_COUNTER_FIELDS) + tuple(row.name for row in DERIVED)
_KEYS = ("name", "metric", "op", "threshold", "for", "clear", "clear_for", "severity", "labels",
         "device", "message")


@dataclass(frozen=True)
class Gate:
    """A second condition on another metric of the same device (``kv_usage_ratio >= 0.8``)."""

    metric: str
    op: str
    threshold: float

    def holds(self, value: float | None) -> bool:
        return value is not None and OPS[self.op](value, self.threshold)


@dataclass(frozen=True)
class Rule:
    name: str
    metric: str
    op: str
    threshold: float
    for_s: float = 0.0
    clear: float | None = None
    clear_for_s: float = 0.0
    severity: str = "warning"
    labels: Mapping[str, str] = field(default_factory=dict)
    device: int | None = None
    message: str = ""
    builtin: bool = False
    # built-in refinements (not TOML keys yet):
    urgent: float | None = None  # a value past this (by ``op``) fires at once, without ``for``
    gate: Gate | None = None  # fire only while the gate holds; stay active until it no longer does
    # a metric whose value, when larger, replaces the threshold (a ``<`` rule: a forecast
    # compared with the horizon its evidence covers, not a fixed look-ahead)
    horizon: str | None = None
    # an alert that fires again within BACKOFF_WINDOW_S of resolving holds twice as long before
    # it resolves next (up to BACKOFF_MAX times ``clear_for``): a risk that keeps coming back is
    # one risk, not an alert every time it returns
    backoff: bool = False

    def breached(self, value: float | None, threshold: float | None = None) -> bool:
        limit = self.threshold if threshold is None else threshold
        return value is not None and OPS[self.op](value, limit)

    def is_urgent(self, value: float | None) -> bool:
        return self.urgent is not None and value is not None and OPS[self.op](value, self.urgent)

    def cleared(self, value: float | None, threshold: float | None = None) -> bool:
        """True when an active alert may resolve (past the clear threshold, if any)."""
        if value is None:
            return True
        limit = self.clear if self.clear is not None else \
            self.threshold if threshold is None else threshold
        return not OPS[self.op](value, limit)

    def describe(self, value: float | None) -> str:
        text = self.message or f"{self.metric} {self.op} {self.threshold:g}"
        return text if value is None else f"{text}: {format_value(self.metric, value)}"


_MIB = 2**20


def _level_name(value: float) -> str:
    level = int(value)
    return LEVELS[level] if 0 <= level < len(LEVELS) else "level"


def format_value(metric: str, value: float) -> str:
    """A rule's value in words with its metric's unit: "warning (risk level 1)", "14.1 s",
    "772.9 MiB/h", "3.00 GiB". Alerts store the bare number the rule compared; every place that
    shows one (messages, the dashboard, the CLI) says it this way. A derived metric's unit is
    its row's (agent/alerts/metrics.py); a sample field's follows from its name."""
    row = m.BY_NAME.get(metric)
    unit = row.unit if row is not None else \
        m.BYTES if metric.endswith("_bytes") else m.RATIO if metric.endswith("_ratio") else \
        m.SECONDS if metric.endswith("_s") else None
    if row is not None and row.words is not None:
        return row.words[0] if value >= 1 else row.words[1]
    if unit == m.RISK_LEVEL:
        return f"{_level_name(value)} (risk level {value:g})"
    if unit == m.BYTES_PER_S:
        return f"{value * 3600 / _MIB:.1f} MiB/h"
    if unit == m.LIMIT_SHARE_PER_H:
        return f"{value * 100:.2f} % of the limit per hour"
    if unit == m.BLOCKS:
        return f"{value:.0f} blocks"
    if unit == m.BYTES:
        return f"{value / 2**30:.2f} GiB" if abs(value) >= 2**30 else f"{value / _MIB:.1f} MiB"
    if unit == m.RATIO:
        return f"{value * 100:.1f} %"
    if unit == m.SECONDS:
        if value < 120:
            return f"{value:.1f} s"
        return f"{value / 60:.1f} min" if value < 7200 else f"{value / 3600:.1f} h"
    return f"{value:.6g}"


SATURATION_FOR_S = 30.0  # kv_saturation waits this long before it fires
RISK_HOLD_S = 1800.0  # an OOM-risk alert resolves after half an hour below its level
BACKOFF_WINDOW_S = 6 * 3600.0  # a firing this soon after a resolution is the same risk back
BACKOFF_MAX = 8.0  # the hold grows at most to this many times ``clear_for``


def builtin_rules(config: Mapping[str, Any] | None) -> list[Rule]:
    """The default rules, with thresholds from the ``alerts.*`` settings (each one's condition and
    why: docs/alerts.md, "Built-in rules"). The OOM-risk rules resolve only after ``RISK_HOLD_S``
    below their level, longer after a quick return (``BACKOFF_WINDOW_S``, up to ``BACKOFF_MAX``
    times), so a server that comes back to the same risk is held by one alert; ``kv_exhaustion``
    holds while the pool is at least ``alerts.kv_exhaustion_min_usage_ratio`` full."""
    kv_s = _setting(config, "alerts.kv_exhaustion_warning_s", 60.0)
    kv_min = _setting(config, "alerts.kv_exhaustion_min_usage_ratio", 0.8)
    risk_for = _setting(config, "alerts.risk_for_s", 15.0)
    hold = RISK_HOLD_S
    return [
        Rule("oom_risk", "risk_level", ">=", 1, for_s=risk_for, clear_for_s=hold,
             severity="warning", urgent=2, backoff=True,
             message="OOM risk", builtin=True),
        Rule("oom_risk_critical", "risk_level", ">=", 2, clear_for_s=hold, severity="critical",
             backoff=True, message="OOM risk critical", builtin=True),
        Rule("memory_leak", "leak_detected", ">=", 1, severity="warning",
             message="idle floor rising after the warm-up", builtin=True),
        Rule("kv_exhaustion", "kv_exhaustion_s", "<", kv_s, for_s=5.0, clear_for_s=30.0,
             severity="warning", gate=Gate("kv_usage_ratio", ">=", kv_min),
             horizon="kv_exhaustion_horizon_s",
             message="KV pool runs out of blocks soon", builtin=True),
        Rule("oom", "oom_recent", ">=", 1, severity="critical",
             message="out of memory", builtin=True),
        # a pool full with a queue for half a minute (a burst that fills it is not), or any
        # preemption; it resolves a minute after neither holds
        Rule("kv_saturation", "kv_saturated", ">=", 1, for_s=SATURATION_FOR_S,
             clear_for_s=60.0, severity="warning", message="KV pool saturated", builtin=True),
    ] + _config_rules(config)


def _config_rules(config: Mapping[str, Any] | None) -> list[Rule]:
    """``config_oom`` with a ``[server]`` section: the worst request it admits cannot fit under
    the limit (vramscope.agent.alerts.config_check). It holds while the configuration does."""
    if config is None or not config.get("server.model"):
        return []
    return [Rule("config_oom", "config_headroom_bytes", "<", 0, severity="warning",
                 message="the worst request the server admits cannot fit under the limit",
                 builtin=True)]


def _setting(config: Mapping[str, Any] | None, key: str, default: float) -> float:
    return default if config is None else float(config.get(key, default))


def parse_rules(config: Mapping[str, Any] | None) -> list[Rule]:
    """Built-ins plus ``config.rules``; a user rule with a built-in's name replaces it."""
    raw = getattr(config, "rules", None) or []
    source = getattr(config, "source", None)
    where = f"{source}: " if source else ""
    try:
        user = [parse_rule(r, i) for i, r in enumerate(raw, start=1)]
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}") from None
    names = [r.name for r in user]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ConfigError(f"{where}alert rule {dup!r}: name is used by more than one rule")
    rules = [r for r in builtin_rules(config) if r.name not in names]
    return rules + user


def parse_rule(raw: Mapping[str, Any], position: int = 1) -> Rule:
    """One ``[[alerts.rules]]`` table; errors name the rule and the key."""
    where = f"alert rule {raw['name']!r}" if isinstance(raw.get("name"), str) and raw["name"] \
        else f"alert rule #{position}"
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(_KEYS)}")
    name = _required_str(raw, "name", where)
    metric = _required_str(raw, "metric", where)
    if metric not in METRICS:
        raise ConfigError(f"{where}: metric = {metric!r} is not a known metric; known: "
                          f"{', '.join(METRICS)}")
    op = raw.get("op", ">")
    if op not in OPS:
        raise ConfigError(f"{where}: op = {op!r} is not one of {', '.join(OPS)}")
    if "threshold" not in raw:
        raise ConfigError(f"{where}: missing required key 'threshold'")
    threshold = _number(raw["threshold"], "threshold", where)
    clear = _clear(raw, op, threshold, where)
    return Rule(name, metric, op, threshold,
                for_s=parse_duration(raw.get("for", 0), "for", where),
                clear=clear,
                clear_for_s=parse_duration(raw.get("clear_for", 0), "clear_for", where),
                severity=_severity(raw, where), labels=_labels(raw, where),
                device=_device(raw, where), message=_str(raw, "message", where))


def _required_str(raw: Mapping[str, Any], key: str, where: str) -> str:
    if key not in raw:
        raise ConfigError(f"{where}: missing required key {key!r}")
    value = raw[key]
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return value


def _str(raw: Mapping[str, Any], key: str, where: str) -> str:
    value = raw.get(key, "")
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {key} must be a string, got {value!r}")
    return value


def _number(value: Any, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
    return float(value)


def _clear(raw: Mapping[str, Any], op: str, threshold: float, where: str) -> float | None:
    if "clear" not in raw:
        return None
    clear = _number(raw["clear"], "clear", where)
    if op in ("==", "!="):
        raise ConfigError(f"{where}: clear is only allowed with >, >=, < or <=, not {op!r}")
    if op in (">", ">=") and clear > threshold:
        raise ConfigError(f"{where}: clear = {clear:g} must not be above threshold = "
                          f"{threshold:g} for op {op!r}")
    if op in ("<", "<=") and clear < threshold:
        raise ConfigError(f"{where}: clear = {clear:g} must not be below threshold = "
                          f"{threshold:g} for op {op!r}")
    return clear


def _severity(raw: Mapping[str, Any], where: str) -> str:
    value = raw.get("severity", "warning")
    if value not in ALERT_SEVERITIES:
        raise ConfigError(f"{where}: severity = {value!r} is not one of "
                          f"{', '.join(ALERT_SEVERITIES)}")
    return str(value)  # one of ALERT_SEVERITIES


def _labels(raw: Mapping[str, Any], where: str) -> dict[str, str]:
    value = raw.get("labels", {})
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConfigError(f"{where}: labels must be a table of strings, got {value!r}")
    return dict(value)


def _device(raw: Mapping[str, Any], where: str) -> int | None:
    value = raw.get("device")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: device must be a device index >= 0, got {value!r}")
    return value


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any, key: str = "for", where: str = "alert rule") -> float:
    """Seconds from a number or a string like ``"500ms"``, ``"30s"``, ``"5m"``, ``"1h"``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return float(m.group(1)) * _UNIT_S[m.group(2)]
    raise ConfigError(f"{where}: {key} must be a duration such as 30, \"30s\", \"5m\" or "
                      f"\"1h\", got {value!r}")


def rules_from(config_or_rules: Mapping[str, Any] | list[Rule] | tuple[Rule, ...] | None
               ) -> Sequence[Rule]:
    """Accept a Config, a list of Rule, or None (built-ins with default thresholds)."""
    if config_or_rules is None:
        return builtin_rules(None)
    if isinstance(config_or_rules, (list, tuple)):
        return list(config_or_rules)
    return parse_rules(config_or_rules)
