"""The OOM-risk model's public entry points: a recording's risk timeline and its charts.

:func:`risk_timeline` runs one :class:`~vramscope.agent.analysis.risk_model.RiskModel` per
process series over a recording; :func:`device_points` picks a device's riskiest series and
:func:`downsample_risk` buckets points for a chart of a long window. The model itself, and the
rules it follows, are in ``agent/analysis/risk_model.py``; ``RiskModel`` and ``RiskPoint`` stay
importable from here, the path scripts have imported them by.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from vramscope.agent.analysis.merge import SeriesSplit, merged
from vramscope.agent.analysis.risk_model import REASONS, RiskModel, RiskPoint
from vramscope.agent.analysis.severity import rank
from vramscope.agent.analysis.thresholds import Thresholds
from vramscope.agent.records import Event, Sample

__all__ = ["RiskModel", "RiskPoint", "device_points", "downsample_risk", "risk_timeline"]

_Number = TypeVar("_Number", int, float)


def risk_timeline(samples: Iterable[Sample], events: Iterable[Event] = (),
                  config: Mapping[str, Any] | None = None,
                  max_points: int | None = None) -> list[RiskPoint]:
    """Every process's risk points in time order, each computed only from data up to it.

    One model per ``(device, pid)`` series (:class:`~vramscope.agent.analysis.merge.SeriesSplit`):
    each server process is assessed against its own limit (its per-process cap, when one is
    set) with the device's NVML view, so two processes on one GPU never feed one model. A
    device with no process records gets one model of its NVML view (``pid`` None).

    With ``max_points``, each series' span is cut into ``max_points`` equal buckets of time
    and each bucket becomes one point (:func:`downsample_risk`): at most ``max_points`` per
    series, for a chart of a long window. The models still see every sample.
    """
    thresholds = Thresholds.from_config(config)
    split: SeriesSplit[RiskModel] = SeriesSplit(lambda: RiskModel(thresholds))
    out = []
    for rec in merged(samples, events):
        if isinstance(rec, Event):
            continue
        for key, model, fresh in split.route(rec):
            if fresh:
                model.pid = key[1]
                primer = split.primer(key)
                if primer is not None and primer is not rec:
                    model.observe(primer)
            point = model.update(rec)
            if point is not None:
                out.append(point)
    return out if max_points is None else downsample_risk(out, max_points)


def device_points(points: Sequence[RiskPoint], device: int) -> list[RiskPoint]:
    """The points of one device's riskiest series (highest final level, then least headroom):
    the device's chart follows the process closest to its limit."""
    series: dict[int | None, list[RiskPoint]] = {}
    for p in points:
        if p.device == device:
            series.setdefault(p.pid, []).append(p)
    if not series:
        return []
    if len(series) > 1:  # an NVML-only start before the first process record: not a rival
        series.pop(None, None)

    def risk(pts: list[RiskPoint]) -> tuple[int, float]:
        last = pts[-1]
        ratio = last.headroom_ratio if last.headroom_ratio is not None else 1.0
        return rank(last.level), -ratio

    return max(series.values(), key=risk)


def downsample_risk(points: Sequence[RiskPoint], max_points: int) -> list[RiskPoint]:
    """At most ``max_points`` points per device, one per equal bucket of its time span.

    A bucket's point is its worst one (highest level; then least headroom after the spike;
    then the earliest), stamped with that point's time, with the bucket's least
    ``headroom_bytes`` and ``headroom_ratio``, its soonest time-to-OOM band and every reason
    seen in it: the chart of a long window still shows every warning and the tightest moment.
    """
    if max_points < 1:
        raise ValueError(f"max_points must be at least 1, got {max_points}")
    by_series: dict[tuple[int, int | None], list[RiskPoint]] = {}
    for p in points:
        by_series.setdefault((p.device, p.pid), []).append(p)
    out: list[RiskPoint] = []
    for pts in by_series.values():
        if len(pts) <= max_points:
            out += pts
            continue
        t0, span = pts[0].ts_s, pts[-1].ts_s - pts[0].ts_s
        buckets: dict[int, list[RiskPoint]] = {}
        for p in pts:
            k = min(max_points - 1, int((p.ts_s - t0) / span * max_points)) if span else 0
            buckets.setdefault(k, []).append(p)
        out += [_merge_bucket(b) for _, b in sorted(buckets.items())]
    out.sort(key=lambda p: p.ts_s)
    return out


def _merge_bucket(pts: list[RiskPoint]) -> RiskPoint:
    worst = max(pts, key=lambda p: (rank(p.level), _tight(p.headroom_ratio), -p.ts_s))
    reasons = {r: None for p in pts for r in p.reasons}
    return worst._replace(headroom_bytes=_least(p.headroom_bytes for p in pts),
                          headroom_ratio=_least(p.headroom_ratio for p in pts),
                          time_to_oom_s=_least(p.time_to_oom_s for p in pts),
                          time_to_oom_low_s=_least(p.time_to_oom_low_s for p in pts),
                          time_to_oom_high_s=_least(p.time_to_oom_high_s for p in pts),
                          reasons=tuple(sorted(reasons, key=REASONS.index)))


def _tight(ratio: float | None) -> float:
    return float("-inf") if ratio is None else -ratio


def _least(values: Iterable[_Number | None]) -> _Number | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None
