"""An alert's value in words, with its unit: "critical (risk level 2)", "14.1 s", "772.9 MiB/h".

Stored alerts keep the bare number their rule compared (a level code, seconds, a ratio); the
unit follows from the rule's metric (:data:`vramscope.agent.alerts.rules.DERIVED_METRICS` and
the sample fields), so it is looked up by rule name, built-in or ``[[alerts.rules]]``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

MIB = 2**20
LEVEL_NAMES = {0: "ok", 1: "warning", 2: "critical"}


def metrics_by_rule(config: Mapping[str, Any] | None) -> dict[str, str]:
    """``{rule name: metric}`` for the built-ins and the config's own rules."""
    try:
        from vramscope.agent.alerts.rules import parse_rules
    except ImportError:
        return {}
    try:
        return {r.name: r.metric for r in parse_rules(config)}
    except Exception:  # noqa: BLE001 - a bad rule is the agent's error to report, not ours
        return {}


def value_text(rule: str, value: float | None, metrics: Mapping[str, str]) -> str | None:
    if value is None:
        return None
    return _formatter(metrics.get(rule, ""))(value)


def _formatter(metric: str) -> Callable[[float], str]:
    exact: dict[str, Callable[[float], str]] = {
        "risk_level": lambda v: f"{LEVEL_NAMES.get(int(v), 'level')} (risk level {v:g})",
        "leak_detected": lambda v: "leak" if v >= 1 else "no leak",
        "oom_recent": lambda v: "OOM in the last 5 min" if v >= 1 else "none",
        "leak_slope_bytes_per_s": lambda v: f"{v * 3600 / MIB:.1f} MiB/h",
        "leak_slope_ratio_per_h": lambda v: f"{v * 100:.2f} % of the limit per hour",
        "kv_orphaned_blocks": lambda v: f"{v:.0f} blocks",
    }
    if metric in exact:
        return exact[metric]
    if metric.endswith("_bytes"):
        return _bytes
    if metric.endswith("_ratio"):
        return lambda v: f"{v * 100:.1f} %"
    if metric.endswith("_s"):
        return _seconds
    return lambda v: f"{v:.6g}"


def _bytes(v: float) -> str:
    return f"{v / 2**30:.2f} GiB" if abs(v) >= 2**30 else f"{v / MIB:.1f} MiB"


def _seconds(v: float) -> str:
    if v < 120:
        return f"{v:.1f} s"
    return f"{v / 60:.1f} min" if v < 7200 else f"{v / 3600:.1f} h"
