"""The causal OOM-risk model: how close is this device to an out-of-memory error, and how soon?

Fed one sample at a time (live in the agent, offline in ``analyze``), it only ever uses data up
to the sample in hand, so the offline timeline is exactly what the live agent said. Per sample
with memory figures it gives a :class:`RiskPoint`:

- **headroom** = limit − demand, where the *limit* is the latest ``device_total_bytes`` of an
  allocator sample (the per-process cap, if one is set) or else of an NVML sample (the device),
  and the *demand* is allocated memory plus, without a cap, memory the allocator does not own
  (device used − reserved: CUDA context, other processes);
- **headroom after spike** = limit − max(demand, baseline + largest prefill spike seen): room
  left if the largest prompt seen so far arrived now;
- **time to OOM** from the trend of the *peaks* (the maximum demand in each window of
  ``alerts.trend_window_s``), not of the raw samples: a Theil–Sen line over the last
  ``TREND_WINDOWS`` peaks, extrapolated to the limit, with Sen's 90 % band on the slope as
  the uncertainty band; only when the band's low slope is above zero (a significant rise);
- **fragmentation**: the largest request seen (the largest prefill spike) fits neither in the
  largest free block of the latest snapshot nor in the memory the allocator can still reserve
  under the limit (a new segment);
- **allocator retries**: ``num_alloc_retries`` rose within the last ``RETRY_WINDOW_S`` — the
  allocator is already flushing its cache to survive.

Levels: ``critical`` when the headroom after spike is below ``alerts.headroom_critical_ratio``
of the limit, the time to OOM is below ``alerts.time_to_oom_critical_s``, or fragmentation
leaves no room for the largest request while retries rise; ``warning`` when the headroom is
below ``alerts.headroom_warning_ratio``, the time to OOM below ``alerts.time_to_oom_warning_s``,
retries rise, or the largest request fits neither in a free block nor in a new segment while
external fragmentation is above ``alerts.fragmentation_warning_ratio``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from agent.analysis.fragmentation import external_fragmentation
from agent.analysis.merge import merged
from agent.analysis.phases import SpikeTracker
from agent.analysis.stats import theil_sen
from agent.analysis.thresholds import Thresholds
from agent.records import Event, Phase, Sample

PEAK_WINDOW_S = 60.0  # default; longer than a KV fill cycle, so a peak is the top of a cycle
TREND_WINDOWS = 20  # twenty minutes of peaks
MIN_TREND_WINDOWS = 10
RETRY_WINDOW_S = 60.0
LEVELS = ("ok", "warning", "critical")
LEVEL_INDEX = {name: i for i, name in enumerate(LEVELS)}
REASONS = ("headroom", "trend", "alloc_retries", "fragmentation")  # the order _level gives
_NO_FORECAST = (None, None, None)
CAP_RATIO = 0.98  # an allocator limit under this share of NVML's total is a per-process cap


class RiskPoint(NamedTuple):
    ts_s: float
    device: int
    level: str  # ok, warning, critical
    headroom_bytes: int | None  # limit − demand; None without a known limit
    headroom_ratio: float | None  # headroom after the spike allowance / limit
    time_to_oom_s: float | None  # central forecast; None when the peaks are not rising
    time_to_oom_low_s: float | None  # soonest (the band's steepest slope)
    time_to_oom_high_s: float | None  # latest (the band's shallowest slope)
    reasons: tuple[str, ...]  # headroom, trend, fragmentation, alloc_retries


class _Trend(NamedTuple):
    t0: float
    slope: float
    intercept: float
    slope_low: float
    slope_high: float


class RiskModel:
    """Incremental risk for one device. ``update(sample)`` returns a point or ``None``."""

    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.t = thresholds or Thresholds()
        self.limit_bytes: int | None = None
        self._cap: int | None = None
        self._device_total: int | None = None
        self._capped = False
        self.spikes = SpikeTracker()
        self.largest_request_bytes = 0
        self._reserved: int | None = None
        self._allocated: int | None = None
        self.external_fragmentation_ratio: float | None = None  # of the latest snapshot
        self._device_used: int | None = None
        self._largest_free: int | None = None
        self._window: list[float] | None = None  # [start_s, peak]
        self._window_s = self.t.trend_window_s
        self._peaks: deque[tuple[float, float]] = deque(maxlen=TREND_WINDOWS)
        self._trend: _Trend | None = None
        self._retries: int | None = None
        self._retry_rise_ts: float | None = None  # when num_alloc_retries last went up
        self.last: RiskPoint | None = None
        self.level_index = 0  # of ``last``: 0 ok, 1 warning, 2 critical

    def update(self, s: Sample) -> RiskPoint | None:
        self._absorb(s)
        demand = self._demand(s)
        if demand is None:
            return None
        self._track_peak(s.ts_s, demand)
        self.last = self._assess(s, demand)
        return self.last

    def _absorb(self, s: Sample) -> None:
        if s.device_total_bytes:
            self._absorb_limit(s)
        if s.reserved_bytes is not None:
            self._reserved = s.reserved_bytes
            self._allocated = s.allocated_bytes
        if s.device_used_bytes is not None:
            self._device_used = s.device_used_bytes
        if s.largest_free_block_bytes is not None:
            self._largest_free = s.largest_free_block_bytes
            if s.reserved_bytes is None and self._reserved is not None:  # a snapshot sample
                s = s._replace(reserved_bytes=self._reserved, allocated_bytes=self._allocated)
            self.external_fragmentation_ratio = external_fragmentation(s)
        if s.num_alloc_retries is not None:
            if self._retries is not None and s.num_alloc_retries > self._retries:
                self._retry_rise_ts = s.ts_s
            self._retries = s.num_alloc_retries
        if s.allocated_bytes is not None:
            spikes = self.spikes
            spikes.update(s.ts_s, s.phase, s.allocated_bytes)
            if spikes.largest_bytes > self.largest_request_bytes:
                self.largest_request_bytes = spikes.largest_bytes
            if s.phase is Phase.PREFILL and spikes.current_bytes() > self.largest_request_bytes:
                self.largest_request_bytes = spikes.current_bytes()

    def _absorb_limit(self, s: Sample) -> None:
        """An allocator sample's total is the process's limit (its per-process cap, if any);
        an NVML sample's is the device's. A cap below the device total wins."""
        if s.allocated_bytes is not None:
            self._cap = s.device_total_bytes
        else:
            self._device_total = s.device_total_bytes
        cap, total = self._cap, self._device_total
        # torch's total is a little under NVML's (memory the driver keeps): not a cap
        self._capped = cap is not None and total is not None and cap < CAP_RATIO * total
        self.limit_bytes = cap if cap is not None else total

    def _other_bytes(self) -> int:
        """Device memory the caching allocator does not own (context, other processes); none
        counts under a per-process cap, which limits the allocator alone."""
        if self._device_used is None or self._reserved is None or self._capped:
            return 0
        other = self._device_used - self._reserved
        return other if other > 0 else 0

    def _demand(self, s: Sample) -> int | None:
        if s.allocated_bytes is not None:
            return s.allocated_bytes + self._other_bytes()
        if s.reserved_bytes is None and s.device_used_bytes is not None and self._reserved is None:
            return s.device_used_bytes  # NVML-only recording
        return None

    def _track_peak(self, ts_s: float, demand: int) -> None:
        w = self._window
        if w is None:
            self._window = [ts_s, demand]
            return
        if ts_s < w[0] + self._window_s:
            if demand > w[1]:
                w[1] = demand
            return
        self._peaks.append((w[0], w[1]))
        step = self._window_s
        self._window = [w[0] + step * ((ts_s - w[0]) // step), demand]
        self._trend = self._fit() if len(self._peaks) >= MIN_TREND_WINDOWS else None

    def _fit(self) -> _Trend | None:
        t0 = self._peaks[0][0]
        tr = theil_sen([p[0] - t0 for p in self._peaks], [p[1] for p in self._peaks])
        if tr.slope_low <= 0:
            return None
        return _Trend(t0, tr.slope, tr.intercept, tr.slope_low, tr.slope_high)

    def _assess(self, s: Sample, demand: int) -> RiskPoint:
        limit = self.limit_bytes
        if not limit:
            self.level_index = 0
            return RiskPoint(s.ts_s, s.device, "ok", None, None, None, None, None, ())
        other = self._other_bytes()
        base = self.spikes.baseline_bytes
        spike = self.spikes.largest_bytes
        projected = demand if base is None else max(demand, base + other + spike)
        ratio = (limit - projected) / limit
        tto = self._time_to_oom(s.ts_s, demand, limit)
        level, reasons = self._level(s.ts_s, ratio, tto, limit, other)
        self.level_index = level
        return RiskPoint(s.ts_s, s.device, LEVELS[level], limit - demand, ratio, *tto, reasons)

    def _time_to_oom(self, ts_s: float, demand: int, limit: int) -> tuple:
        tr = self._trend
        if tr is None:
            return _NO_FORECAST
        level = max(demand, tr.intercept + tr.slope * (ts_s - tr.t0))
        room = max(0.0, limit - level)
        return (room / tr.slope, room / tr.slope_high, room / tr.slope_low)

    def _level(self, ts_s: float, ratio: float, tto: tuple, limit: int,
               other: int) -> tuple[int, tuple]:
        t = self.t
        retrying = self._retry_rise_ts is not None and ts_s - self._retry_rise_ts <= RETRY_WINDOW_S
        if ratio >= t.headroom_warning_ratio and tto[0] is None and not retrying \
                and self._largest_free is None:
            return 0, ()  # the common case, decided cheaply
        reasons, level = [], 0
        if ratio < t.headroom_warning_ratio:
            reasons.append("headroom")
            level = 2 if ratio < t.headroom_critical_ratio else 1
        if tto[0] is not None and tto[0] < t.time_to_oom_warning_s:
            reasons.append("trend")
            level = max(level, 2 if tto[0] < t.time_to_oom_critical_s else 1)
        if retrying:
            reasons.append("alloc_retries")
            level = max(level, 1)
        frag = self._fragmentation_level(limit, other, retrying)
        if frag:
            reasons.append("fragmentation")
            level = max(level, frag)
        return level, tuple(reasons)

    def _fragmentation_level(self, limit: int, other: int, retrying: bool) -> int:
        """1 when the largest request seen would fit neither in the largest free block nor in
        what the allocator can still reserve, while external fragmentation is high; 2 when
        that holds and the allocator is already retrying. A request that fits in either is no
        risk, however fragmented the cache: plenty of headroom is not a fragmentation risk."""
        if self._largest_free is None or self._reserved is None or not self.largest_request_bytes:
            return 0
        need = self.largest_request_bytes  # a prefill spike: an upper bound on its largest block
        unreserved = limit - other - self._reserved
        if need <= self._largest_free or need <= unreserved:
            return 0
        if retrying:
            return 2
        return int((self.external_fragmentation_ratio or 0.0) > self.t.fragmentation_warning_ratio)


def risk_timeline(samples: Iterable[Sample], events: Iterable[Event] = (),
                  config: Mapping[str, Any] | None = None,
                  max_points: int | None = None) -> list[RiskPoint]:
    """Every device's risk points in time order, each computed only from data up to it.

    With ``max_points``, each device's span is cut into ``max_points`` equal buckets of time
    and each bucket becomes one point (:func:`downsample_risk`): at most ``max_points`` per
    device, for a chart of a long window. The model still sees every sample.
    """
    thresholds = Thresholds.from_config(config)
    models: dict[int, RiskModel] = {}
    out = []
    for rec in merged(samples, events):
        if isinstance(rec, Event):
            continue
        model = models.get(rec.device)
        if model is None:
            model = models[rec.device] = RiskModel(thresholds)
        point = model.update(rec)
        if point is not None:
            out.append(point)
    return out if max_points is None else downsample_risk(out, max_points)


def downsample_risk(points: Sequence[RiskPoint], max_points: int) -> list[RiskPoint]:
    """At most ``max_points`` points per device, one per equal bucket of its time span.

    A bucket's point is its worst one (highest level; then least headroom after the spike;
    then the earliest), stamped with that point's time, with the bucket's least
    ``headroom_bytes`` and ``headroom_ratio``, its soonest time-to-OOM band and every reason
    seen in it: the chart of a long window still shows every warning and the tightest moment.
    """
    if max_points < 1:
        raise ValueError(f"max_points must be at least 1, got {max_points}")
    by_device: dict[int, list[RiskPoint]] = {}
    for p in points:
        by_device.setdefault(p.device, []).append(p)
    out: list[RiskPoint] = []
    for pts in by_device.values():
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
    worst = max(pts, key=lambda p: (LEVEL_INDEX[p.level], _tight(p.headroom_ratio), -p.ts_s))
    reasons = {r: None for p in pts for r in p.reasons}
    return worst._replace(headroom_bytes=_least(p.headroom_bytes for p in pts),
                          headroom_ratio=_least(p.headroom_ratio for p in pts),
                          time_to_oom_s=_least(p.time_to_oom_s for p in pts),
                          time_to_oom_low_s=_least(p.time_to_oom_low_s for p in pts),
                          time_to_oom_high_s=_least(p.time_to_oom_high_s for p in pts),
                          reasons=tuple(sorted(reasons, key=REASONS.index)))


def _tight(ratio: float | None) -> float:
    return float("-inf") if ratio is None else -ratio


def _least(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None
