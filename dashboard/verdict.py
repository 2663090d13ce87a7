"""One verdict per device, decided once, shown everywhere; and whether the data is still live.

The dashboard keeps no domain rules of its own. A device's verdict is what the agent's alert
engine decided (:mod:`vramscope.agent.alerts`: the causal risk model with its prefill-spike
allowance, the leak detector, the KV and OOM rules): the worst severity among the device's
active alerts, with those alerts as its reasons. ``vramscope analyze`` feeds the same records
through the same engine, so the Overview, ``/api/v1/alerts?active=true`` and the analysis agree.

Freshness: a verdict is only as new as the newest sample. When that sample is older than a few
sampling intervals (``stale_after_s``), every page says so in a banner and drops "live": the
values, verdicts and alerts are as of then, not now.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from vramscope.agent.analysis.risk import LEVELS

SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
STALE_INTERVALS = 5  # intervals without a new sample before the data counts as stale
STALE_MIN_S = 15.0  # never stale sooner: a batch and a page refresh may both be in flight
_INTERVAL_KEYS = ("sampling.device_interval_s", "sampling.allocator_interval_s",
                  "agent.batch_interval_s", "dashboard.refresh_s")


def device_verdict(alerts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``{"level", "reasons"}`` from one device's active alerts, most severe first."""
    mine = sorted(alerts, key=lambda a: (-SEVERITY_RANK.get(a["severity"], 0), a["fired_ts_s"]))
    rank = max((SEVERITY_RANK.get(a["severity"], 0) for a in mine), default=0)
    return {"level": LEVELS[rank],
            "reasons": [{"rule": a["rule"], "severity": a["severity"],
                         "message": a.get("message"), "fired_ts_s": a["fired_ts_s"]}
                        for a in mine]}


def stale_after_s(config: Mapping[str, Any]) -> float:
    """How old the newest sample may be before the data is stale: ``STALE_INTERVALS`` of the
    slowest step between a sample and the page (sampling, batching, page refresh)."""
    slowest = max(float(config[k]) for k in _INTERVAL_KEYS if k in config) if config else 1.0
    return max(STALE_MIN_S, STALE_INTERVALS * slowest)


def freshness(newest_ts_s: float | None, now_s: float,
              config: Mapping[str, Any]) -> dict[str, Any]:
    """``{"now_s", "newest_ts_s", "age_s", "stale_after_s", "stale"}``; no data is not stale
    (there is nothing to mistake for live), but ``newest_ts_s`` is ``None``."""
    limit = stale_after_s(config)
    age = None if newest_ts_s is None else max(0.0, now_s - newest_ts_s)
    return {"now_s": now_s, "newest_ts_s": newest_ts_s, "age_s": age, "stale_after_s": limit,
            "stale": age is not None and age > limit}
