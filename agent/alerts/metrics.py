"""The metrics an alert rule reads, in one table: each derived metric's name, unit, meaning,
what changes it and how it is read (docs/architecture.md, "Add an alert rule").

``tests/agent/test_alert_metrics.py`` checks that every metric the rules, the engine and the
Prometheus rules name resolves here. Light to import: ``rules.py``, which the dashboard reads,
takes its names from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from vramscope.agent.analysis.fragmentation import inactive_split_ratio

if TYPE_CHECKING:
    from vramscope.agent.alerts.device import DeviceAnalysis
    from vramscope.agent.analysis.leaks import LeakResult

OOM_RECENT_S = 300.0

# What can change a metric's value. A rule is evaluated again only after a record changed one
# of the inputs of its metric (or of its gate) on its device, or while its ``for`` /
# ``clear_for`` timer runs: with the same inputs and no timer, evaluating it again cannot
# change anything. So a sample that moves nothing a rule reads costs no rule evaluation.
IN_SAMPLE = 1 << 0  # any sample: the metrics of the latest sample
IN_RAW = 1 << 1  # a sample that carries a field some rule reads as it is
IN_RISK = 1 << 2  # the risk model gave a point
IN_RISK_LEVEL = 1 << 3  # ...of another level than the one before (or its first)
IN_DEVICE = 1 << 4  # device used or device total bytes (the limit)
IN_SNAPSHOT = 1 << 5  # a largest free block
IN_LEAK = 1 << 6  # a new leak verdict
IN_KV = 1 << 7  # a KV pool reading
IN_ORPHANS = 1 << 8  # a kv_orphaned_blocks event
IN_OOM = 1 << 9  # oom_recent changed: an OOM, or five minutes since the last one
IN_EPISODE = 1 << 10  # an OOM ended the risk episode (its risk alerts resolve with it)
IN_LOAD = 1 << 11  # a server_load or kv_preempted event (saturation.py)
# what may change an answer the verdict log keeps (agent/alerts/verdicts.py)
VERDICT_INPUTS = IN_LEAK | IN_RISK_LEVEL | IN_EPISODE | IN_ORPHANS


def inputs_of(metric: str) -> int:
    """The input bits of ``metric`` (a sample field: any sample that carries a read field)."""
    row = BY_NAME.get(metric)
    return IN_RAW if row is None else row.inputs


def getter_for(metric: str) -> Callable[[DeviceAnalysis, float], float | None]:
    """How to read ``metric`` from a device's state: derived, or the latest sample field."""
    row = BY_NAME.get(metric)
    if row is not None:
        return row.read
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


Getter = Callable[["DeviceAnalysis", float], "float | None"]

# The units a derived metric's value is in; each is written its own way (rules.format_value).
BYTES, RATIO, SECONDS = "bytes", "ratio", "seconds"
RISK_LEVEL = "risk level"  # 0 ok, 1 warning, 2 critical
FLAG = "flag"  # 1 or 0, written with the row's words
BYTES_PER_S = "bytes/s"  # written as MiB/h
LIMIT_SHARE_PER_H = "share of the limit/h"
BLOCKS = "blocks"
UNITS = (BYTES, RATIO, SECONDS, RISK_LEVEL, FLAG, BYTES_PER_S, LIMIT_SHARE_PER_H, BLOCKS)


class Metric(NamedTuple):
    name: str
    unit: str  # one of UNITS
    meaning: str  # rules.py's error messages, docs/alerts.md
    inputs: int  # the IN_* bits of what can change it
    read: Getter
    words: tuple[str, str] | None = None  # a FLAG's value in words: (when 1, when 0)


CONFIG_METRIC = "config_headroom_bytes"  # the [server] check (alerts/config_check.py)
SATURATION_METRIC = "kv_saturated"  # alerts/saturation.py

DERIVED: tuple[Metric, ...] = (
    Metric("cached_free_bytes", BYTES, "reserved − allocated", IN_SAMPLE, _cached_free),
    Metric("inactive_split_ratio", RATIO, "inactive split bytes / reserved bytes", IN_SAMPLE,
           lambda d, now: inactive_split_ratio(d.last_sample) if d.last_sample else None),
    Metric("external_fragmentation_ratio", RATIO,
           "1 − largest free block / cached free (latest snapshot)", IN_SNAPSHOT,
           lambda d, now: d.risk.external_fragmentation_ratio),
    Metric("device_used_ratio", RATIO, "device used / device total", IN_DEVICE,
           lambda d, now: _ratio(d.risk._device_used, d.risk.limit_bytes)),
    Metric("headroom_bytes", BYTES, "limit − demand (risk model)", IN_RISK,
           lambda d, now: d.risk.headroom_bytes),
    Metric("headroom_ratio", RATIO,
           "headroom after the largest prefill spike / limit (risk model)", IN_RISK,
           lambda d, now: d.risk.headroom_ratio),
    Metric("time_to_oom_s", SECONDS,
           "forecast time to OOM from the trend of peaks; absent when not rising", IN_RISK,
           lambda d, now: d.risk.time_to_oom_s),
    Metric("risk_level", RISK_LEVEL, "0 ok, 1 warning, 2 critical (risk model)",
           IN_RISK_LEVEL | IN_EPISODE,
           lambda d, now: d.risk.level_index if d.risk.has_point else None),
    Metric("leak_detected", FLAG,
           "1 while the idle-floor leak detector (or the KV orphan check) says leak", IN_LEAK,
           lambda d, now: float(_leak_named(d.leak.result)), ("leak", "no leak")),
    Metric("leak_slope_bytes_per_s", BYTES_PER_S,
           "the leak's rate at the latest leak evaluation (leaks.leak_rate)", IN_LEAK,
           lambda d, now: d.leak.result.slope_bytes_per_s),
    Metric("leak_slope_ratio_per_h", LIMIT_SHARE_PER_H,
           "the same slope as a share of the limit per hour", IN_LEAK | IN_DEVICE, _leak_ratio),
    Metric("kv_usage_ratio", RATIO, "KV blocks used / total", IN_KV,
           lambda d, now: d.kv.usage_ratio),
    Metric("kv_exhaustion_s", SECONDS,
           "time until used KV blocks reach the total at the pool's fill trend", IN_KV,
           lambda d, now: d.kv.exhaustion_s),
    Metric("kv_exhaustion_horizon_s", SECONDS,
           "how far ahead the KV forecast may be trusted: the history the fill trend rests on "
           "(up to 10 min) when the trend reaches the total within it; at least "
           "alerts.kv_exhaustion_warning_s", IN_KV,
           lambda d, now: max(d._thresholds.kv_exhaustion_warning_s, d.kv.horizon_s)),
    Metric("kv_orphaned_blocks", BLOCKS,
           "orphaned KV blocks in the pool's latest check that found any", IN_ORPHANS,
           lambda d, now: float(d.orphaned_blocks)),
    Metric("oom_recent", FLAG, "1 for five minutes after an OOM (event or num_ooms rising)",
           IN_OOM,
           lambda d, now: float(bool(d.oom_ts_s) and now - d.oom_ts_s[-1] < OOM_RECENT_S),
           ("OOM in the last 5 min", "none")),
    # the [server] check, computed again when the limit moves
    Metric(CONFIG_METRIC, BYTES, "limit − what the worst request the [server] section admits "
           "needs (absent without server.model)", IN_DEVICE,
           lambda d, now: d.config_check.headroom_bytes(d.risk.limit_bytes)
           if d.config_check else None),
    # a KV reading also ages the preemption window
    Metric(SATURATION_METRIC, FLAG, "1 while the fullest KV pool is at least 95 % used with "
           "requests waiting, or a request was preempted in the last 60 s "
           "(alerts/saturation.py)", IN_LOAD | IN_KV,
           lambda d, now: d.saturation.value(d.kv.usage_ratio, d.kv.blocks_total, now),
           ("saturated", "not saturated")),
)
BY_NAME: dict[str, Metric] = {m.name: m for m in DERIVED}
