"""The analysis thresholds, read once from the ``alerts.*`` settings (or their defaults).

Analysis functions take a config mapping (``vramscope.agent.config.Config`` or any mapping with the
same
keys) or ``None`` for the defaults; they turn it into this record once, so that the hot loops
read attributes rather than dictionary keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple


class Thresholds(NamedTuple):
    headroom_warning_ratio: float = 0.05
    headroom_critical_ratio: float = 0.02
    time_to_oom_warning_s: float = 1800.0
    time_to_oom_critical_s: float = 300.0
    leak_min_slope_ratio_per_h: float = 0.0025
    leak_warmup_s: float = 300.0
    leak_floor_window_s: float = 60.0
    leak_horizon_s: float = 7200.0
    leak_min_span_s: float = 900.0
    trend_window_s: float = 60.0
    trend_span_s: float = 1200.0
    trend_min_span_s: float = 600.0
    fragmentation_warning_ratio: float = 0.5
    kv_exhaustion_warning_s: float = 60.0

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | Thresholds | None) -> Thresholds:
        """Read ``alerts.<field>`` for every field; missing keys keep the defaults above."""
        if config is None:
            return cls()
        if isinstance(config, Thresholds):
            return config
        values = {}
        for name in cls._fields:
            key = f"alerts.{name}"
            if key in config:
                values[name] = float(config[key])
        return cls(**values)
