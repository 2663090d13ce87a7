"""An alert's value in words, with its unit: "critical (risk level 2)", "14.1 s", "772.9 MiB/h".

Stored alerts keep the bare number their rule compared (a level code, seconds, a ratio); the
unit follows from the rule's metric (its row of :data:`vramscope.agent.alerts.metrics.DERIVED`,
or a sample field's name), so it is looked up by rule name, built-in or ``[[alerts.rules]]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vramscope.agent.alerts.rules import format_value, parse_rules
from vramscope.agent.errors import VramscopeError


def metrics_by_rule(config: Mapping[str, Any] | None) -> dict[str, str]:
    """``{rule name: metric}`` for the built-ins and the config's own rules."""
    try:
        return {r.name: r.metric for r in parse_rules(config)}
    except VramscopeError:  # a bad rule is the agent's error to report; no units then
        return {}


def value_text(rule: str, value: float | None, metrics: Mapping[str, str]) -> str | None:
    if value is None:
        return None
    return format_value(metrics.get(rule, ""), value)
