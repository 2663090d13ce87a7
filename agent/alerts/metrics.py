"""The metrics an alert rule reads: how each is read from a device's state, and what changes it.

A rule names a metric (``rules.py``: a sample field as it is, or one derived here from the
analysis models); :func:`getter_for` reads its value from a :class:`~vramscope.agent.alerts.
device.DeviceAnalysis`. The input bits say which records can change a metric's value, so that the
engine evaluates a rule again only after one did (``engine.py``). Kept apart from the device state
so that what a metric means is one table, read by the engine and the state alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from vramscope.agent.alerts.config_check import METRIC as CONFIG_METRIC
from vramscope.agent.alerts.saturation import METRIC as SATURATION_METRIC
from vramscope.agent.analysis.fragmentation import inactive_split_ratio
from vramscope.agent.analysis.leaks import LeakResult

if TYPE_CHECKING:
    from vramscope.agent.alerts.device import DeviceAnalysis

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

_INPUTS: dict[str, int] = {
    "cached_free_bytes": IN_SAMPLE,
    "inactive_split_ratio": IN_SAMPLE,
    "external_fragmentation_ratio": IN_SNAPSHOT,
    "device_used_ratio": IN_DEVICE,
    "headroom_bytes": IN_RISK,
    "headroom_ratio": IN_RISK,
    "time_to_oom_s": IN_RISK,
    "risk_level": IN_RISK_LEVEL | IN_EPISODE,
    "leak_detected": IN_LEAK,
    "leak_slope_bytes_per_s": IN_LEAK,
    "leak_slope_ratio_per_h": IN_LEAK | IN_DEVICE,
    "kv_usage_ratio": IN_KV,
    "kv_exhaustion_s": IN_KV,
    "kv_exhaustion_horizon_s": IN_KV,
    "kv_orphaned_blocks": IN_ORPHANS,
    "oom_recent": IN_OOM,
    CONFIG_METRIC: IN_DEVICE,  # the [server] check, computed again when the limit moves
    SATURATION_METRIC: IN_LOAD | IN_KV,  # a KV reading also ages the preemption window
}


def inputs_of(metric: str) -> int:
    """The input bits of ``metric`` (a sample field: any sample that carries a read field)."""
    return _INPUTS.get(metric, IN_RAW)

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
