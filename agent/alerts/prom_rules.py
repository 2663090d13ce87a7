"""The config's alert rules as a Prometheus alerting-rules file (``vramscope export
prometheus-rules``; docs/metrics.md, "Alert rules as PromQL").

A user rule whose metric has no Prometheus series is left out, listed in a comment at the end and
logged once. The YAML is written by hand (JSON-quoted scalars are valid YAML): no YAML library.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from vramscope.agent.alerts.rules import Rule, parse_rules

log = logging.getLogger("vramscope.prom_rules")

GROUP = "vramscope"
LABELS = ("host", "device")  # the labels every device series carries

# Each server process's KV pool: its share of its own blocks in use.
_KV_SHARE = ("vramscope_process_kv_blocks_used{sel}"
             " / vramscope_process_kv_blocks_capacity{sel}")

# Rule metric -> PromQL over exported series; ``{sel}`` is the device matcher (or nothing).
SERIES: dict[str, str] = {
    "allocated_bytes": "vramscope_allocated_bytes{sel}",
    "reserved_bytes": "vramscope_reserved_bytes{sel}",
    "inactive_split_bytes": "vramscope_inactive_split_bytes{sel}",
    "largest_free_block_bytes": "vramscope_largest_free_block_bytes{sel}",
    "device_used_bytes": "vramscope_device_used_bytes{sel}",
    "device_total_bytes": "vramscope_device_limit_bytes{sel}",
    "kv_blocks_used": "vramscope_kv_blocks_used{sel}",
    "kv_blocks_total": "vramscope_kv_blocks_capacity{sel}",
    "kv_blocks_cached": "vramscope_kv_blocks_cached{sel}",
    "kv_tokens_used": "vramscope_kv_tokens_used{sel}",
    "num_alloc_retries": "vramscope_alloc_retries_total{sel}",
    "num_ooms": "vramscope_ooms_total{sel}",
    "risk_level": "vramscope_risk_level{sel}",
    "cached_free_bytes": "(vramscope_reserved_bytes{sel} - vramscope_allocated_bytes{sel})",
    "inactive_split_ratio":
        "(vramscope_inactive_split_bytes{sel} / vramscope_reserved_bytes{sel})",
    "external_fragmentation_ratio":
        "(1 - vramscope_largest_free_block_bytes{sel}"
        " / (vramscope_reserved_bytes{sel} - vramscope_allocated_bytes{sel}))",
    "device_used_ratio": "(vramscope_device_used_bytes{sel} / vramscope_device_limit_bytes{sel})",
    # The fullest pool's share, as the agent's rules read it: each server's pool against its
    # own size (the device sums would hide a full 63-block pool beside a 16,384-block one).
    "kv_usage_ratio": "max by (host, device) (" + _KV_SHARE + ")",
    # The fullest pool's free plus cached blocks over the growth rate of its used blocks;
    # absent when not growing.
    "kv_exhaustion_s":
        "min by (host, device) (((vramscope_process_kv_blocks_capacity{sel}"
        " - vramscope_process_kv_blocks_used{sel})"
        " / (deriv(vramscope_process_kv_blocks_used{sel}[5m]) > 0))"
        " and on(host, device, process, pid) (" + _KV_SHARE + " == on(host, device)"
        " group_left max by (host, device) (" + _KV_SHARE + ")))",
    # 1 for five minutes after the OOM counter rose (the agent's OOM_RECENT_S).
    "oom_recent": "(increase(vramscope_ooms_total{sel}[5m]) > bool 0)",
    # The stored leak verdicts the agent's engine writes (1 leak, 0 no leak, -1 not enough
    # data): one series a running process, so the alert names the leaking process and pid
    # (the agent's own alert is per device and names it in its message).
    "leak_detected": "(vramscope_process_leak_state{sel} == bool 1)",
    "leak_slope_bytes_per_s": "vramscope_process_leak_slope_bytes_per_second{sel}",
    # the stored verdicts' orphaned KV blocks: the pool check's latest count, per process
    "kv_orphaned_blocks": "vramscope_process_kv_orphaned_blocks{sel}",
    # The [server] section's worst request against each device's limit (dashboard /metrics
    # with the same [server] section).
    "config_headroom_bytes": "vramscope_config_headroom_bytes{sel}",
    # The dashboard's reading of the stored queue and preemption events with the agent's own
    # tracker (agent/alerts/saturation.py).
    "kv_saturated": "vramscope_kv_saturated{sel}",
}

# Rule metrics whose series are one a process (labels process and pid beside host, device).
PER_PROCESS = frozenset({"leak_detected", "leak_slope_bytes_per_s", "kv_orphaned_blocks"})

def render_rules(config: Mapping[str, Any] | None) -> str:
    """The Prometheus rules file (YAML) for ``config``'s alert rules."""
    rules = parse_rules(config)
    kept = [r for r in rules if exportable(r)]
    left_out = [r for r in rules if not exportable(r)]
    for r in left_out:
        log.warning("alert rule %r is not exported to Prometheus: its metric %r has no "
                    "Prometheus series (the agent still evaluates it)", r.name, r.metric)
    lines = _header(getattr(config, "source", None))
    lines += ["groups:", f"  - name: {_q(GROUP)}"]
    if kept:
        lines += ["    rules:", *(line for r in kept for line in _rule_lines(r))]
    else:
        lines.append("    rules: []")
    lines += _left_out_comment(left_out)
    return "\n".join(lines) + "\n"


def alert_name(rule_name: str) -> str:
    """``oom_risk`` -> ``VramscopeOomRisk``: a valid, namespaced Prometheus alert name."""
    words = [w for w in re.split(r"[^A-Za-z0-9]+", rule_name) if w]
    return "Vramscope" + "".join(w[0].upper() + w[1:] for w in words)


def expression(rule: Rule) -> str:
    """The PromQL condition of ``rule``: the comparison, and-ed with its gate; then, while the
    alert fires, what keeps it (the ``clear`` hysteresis, the gate still holding)."""
    sel = "" if rule.device is None else f'{{device="{rule.device}"}}'
    value = SERIES[rule.metric].format(sel=sel)
    on = f"on({', '.join(LABELS)})"
    fires = f"{value} {rule.op} {_number(rule.threshold)}"
    gate = _gate(rule, sel)
    if gate is not None:
        fires = f"({fires}) and {on} ({gate})"
    keeps = [] if rule.clear is None else [f"{value} {rule.op} {_number(rule.clear)}"]
    keeps += [] if gate is None else [gate]
    if not keeps:
        return fires
    firing = f'ALERTS{{alertname="{alert_name(rule.name)}", alertstate="firing"}}'
    kept = keeps[0] if len(keeps) == 1 else " or ".join(f"({k})" for k in keeps)
    return f"{fires} or (({kept}) and {on} {firing})"


def _gate(rule: Rule, sel: str) -> str | None:
    """A built-in's second condition (``kv_usage_ratio >= 0.8``), as PromQL."""
    gate = getattr(rule, "gate", None)
    if gate is None:
        return None
    return f"{SERIES[gate.metric].format(sel=sel)} {gate.op} {_number(gate.threshold)}"


def exportable(rule: Rule) -> bool:
    """Its metric (and its gate's) have Prometheus series."""
    gate = getattr(rule, "gate", None)
    return rule.metric in SERIES and (gate is None or gate.metric in SERIES)


def duration(seconds: float) -> str:
    """A Prometheus duration: ``30s``, ``5m``, ``1h``, ``1500ms``."""
    ms = round(seconds * 1000)
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _rule_lines(rule: Rule) -> list[str]:
    lines = _urgent_comment(rule)
    lines += [f"      - alert: {_q(alert_name(rule.name))}",
              f"        expr: {_q(expression(rule))}"]
    if rule.for_s > 0:
        lines.append(f"        for: {_q(duration(rule.for_s))}")
    if rule.clear_for_s > 0:
        lines.append(f"        keep_firing_for: {_q(duration(rule.clear_for_s))}")
    labels = {**dict(rule.labels), "severity": rule.severity, "vramscope_rule": rule.name}
    lines.append("        labels:")
    lines += [f"          {_q(k)}: {_q(v)}" for k, v in sorted(labels.items())]
    lines.append("        annotations:")
    lines += [f"          summary: {_q(_summary(rule))}",
              f"          description: {_q(_description(rule))}"]
    return lines


def _urgent_comment(rule: Rule) -> list[str]:
    """A built-in that fires at once past an urgent level cannot say so in one Prometheus rule
    (``for`` holds at every level, and a second rule of the same name fails promtool's lint)."""
    urgent = getattr(rule, "urgent", None)
    if urgent is None or rule.for_s <= 0:
        return []
    return [f"      # The agent fires this at once when {rule.metric} {rule.op} "
            f"{_number(urgent)}; Prometheus waits the `for` at every level."]


def _summary(rule: Rule) -> str:
    text = rule.message or f"{rule.metric} {rule.op} {_number(rule.threshold)}"
    return _escape_template(text)


def _description(rule: Rule) -> str:
    """Where, the value, and the rule's condition. A gated alert kept firing by its gate shows
    the gate's value (the metric itself may be absent then, e.g. a pool that stopped growing)."""
    condition = f"{rule.metric} {rule.op} {_number(rule.threshold)}"
    gate = getattr(rule, "gate", None)
    if gate is not None:
        condition += f" while {gate.metric} {gate.op} {_number(gate.threshold)}"
    where = "host {{ $labels.host }} GPU {{ $labels.device }}"
    if rule.metric in PER_PROCESS:
        where += " process {{ $labels.process }} (pid {{ $labels.pid }})"
    return (f"{_summary(rule)} on {where}: "
            f"value {{{{ $value }}}} (vramscope rule {_escape_template(rule.name)}: "
            f"{condition})")


def _header(source: str | None) -> list[str]:
    return [
        "# Prometheus alerting rules for vramscope's /metrics (docs/metrics.md).",
        "# Generated by `vramscope export prometheus-rules` from "
        f"{source or 'the default settings'}.",
        "# Do not edit: change the config and export again. Needs Prometheus >= 2.42.",
    ]


def _left_out_comment(left_out: Sequence[Any]) -> list[str]:
    if not left_out:
        return []
    lines = ["# Not exported (their metric has no Prometheus series; the agent alerts on them):"]
    return lines + [f"#   {r.name} ({r.metric})" for r in left_out]


def _number(value: float) -> str:
    """Exact PromQL literal: integers without a fraction, other floats by repr."""
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _escape_template(text: str) -> str:
    """A user's message is text, never a Prometheus template: quote any ``{{``."""
    return text.replace("{{", '{{ "{{" }}')


def _q(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)

