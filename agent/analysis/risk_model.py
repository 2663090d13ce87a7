"""The causal OOM-risk model: how close is this device to an out-of-memory error, and how soon?

Fed one sample at a time (live in the agent, offline in ``analyze``), it only ever uses data up
to the sample in hand, so the offline timeline is exactly what the live agent said. Per sample
with memory figures it gives a :class:`RiskPoint`: headroom (limit − demand), headroom after the
largest prefill spike, time to OOM (from the trend of window peaks, the fast route of
:mod:`~vramscope.agent.analysis.peak_rise`, or the floor's growth, whichever is soonest),
fragmentation and allocator retries, and a level with hysteresis. An OOM ends the episode
(:meth:`RiskModel.restart`). The rules, thresholds and why each is so: docs/analysis.md,
"OOM risk".
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from vramscope.agent.analysis.fragmentation import external_fragmentation
from vramscope.agent.analysis.peak_rise import FINE_PEAK_S, PeakRise
from vramscope.agent.analysis.phases import SpikeTracker
from vramscope.agent.analysis.risk_trend import Trend, fit_peaks
from vramscope.agent.analysis.severity import LEVELS
from vramscope.agent.analysis.thresholds import Thresholds
from vramscope.agent.analysis.windows import WindowChooser, Windows
from vramscope.agent.records import Phase, Sample

FINE_SAMPLES = 4  # a fast-route peak window holds this many samples at least
PEAK_WINDOW_S = 60.0  # default; longer than a KV fill cycle, so a peak is the top of a cycle
TREND_WINDOWS = 20  # peaks per alerts.trend_span_s
MIN_TREND_WINDOWS = 6  # fewer peaks than this are never a fit, whatever their span
FORECAST_REACH = 3.0  # a forecast reaches at most this many times the span it was fitted on
# ...and the fast route's at most this many: its stretch is minutes of a load that comes in
# bursts (a burst's rise of two minutes says little of the six after it)
FAST_REACH = 2.0
RETRY_WINDOW_S = 60.0
# the OOM trend waits out at most this much of the warm-up: a lazy warm-up's growth is no leak,
# but an OOM that builds up in a process's first half hour must still be foreseen
RISK_WARMUP_S = 300.0
RETRY_HOLD_S = 1800.0  # retries this recent hold the risk while reserved stays near the limit
NEAR_LIMIT_RATIO = 0.95  # reserved at this share of what may be reserved: no room to regrow
MAX_PENDING = 100_000  # readings held while the windows are chosen
HYSTERESIS_RATIO = 0.01  # a headroom warning clears 1 % of the limit above where it began
HYSTERESIS_TIME = 1.25  # a trend warning clears at 1.25x the time-to-OOM it began under
REASONS = ("headroom", "trend", "alloc_retries", "fragmentation", "growth")  # _level's order
_Forecast = tuple[float | None, float | None, float | None]  # central, soonest, latest
_NO_FORECAST: _Forecast = (None, None, None)
_HEADROOM, _TREND, _RETRIES, _FRAGMENTATION, _GROWTH = 1, 2, 4, 8, 16  # in REASONS order
_REASONS_BY_MASK = tuple(tuple(r for i, r in enumerate(REASONS) if mask >> i & 1)
                         for mask in range(1 << len(REASONS)))
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
    pid: int | None = None  # the process whose series this is; None: the device as a whole



class RiskModel:
    """Incremental risk for one device. ``update(sample)`` returns a point or ``None``.

    ``observe(sample)`` is the same step without building the point: the live alert engine
    calls it for every sample and reads ``level_index`` and the figures below, and ``last``
    builds the :class:`RiskPoint` only when something asks for it (a chart, an alert message).
    """

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
        self._window_start: float | None = None  # the peak window being filled, and its peak
        self._window_end = 0.0
        self._window_peak = 0
        self._window_s = self.t.trend_window_s
        # The trend window and its warm-up come from the data (analysis.windows): no peak is
        # kept before they are chosen and the warm-up has passed, so a first KV-pool fill is
        # not a trend toward OOM.
        self.chooser = WindowChooser(self.t)
        self.windows: Windows | None = None
        self._trend_from: float | None = None
        self._pending: list[tuple[float, int, Phase]] = []
        self._peaks: deque[tuple[float, float]] = deque(maxlen=4 * TREND_WINDOWS)
        self._trend: Trend | None = None
        self._in_use: Trend | None = None  # the trend the latest forecast came from
        # the fast route: short windows' peaks, a rise established on evidence that scales
        # with it (a load ramp filling the device in minutes), as a trend of its stretch
        self._rise = PeakRise()
        self._fast: Trend | None = None
        self._retries: int | None = None
        self._retry_rise_ts: float | None = None  # when num_alloc_retries last went up
        # the latest point's figures (``last`` is built from them on demand)
        self.has_point = False
        self.level_index = 0  # a Severity's number, kept a plain int on the per-sample path
        self.headroom_bytes: int | None = None
        self.headroom_ratio: float | None = None
        self.time_to_oom_s: float | None = None
        self._room = 0.0  # bytes left above the trend line, when there is a forecast
        self._reasons = 0  # a bit per REASONS entry
        self._ts_s = 0.0
        self._device = 0
        self.pid: int | None = None  # set by whoever splits records per process
        self._last: RiskPoint | None = None
        # the process's floor growth (its leak verdict's rate and 90 % interval, bytes per
        # second), set by whoever runs its leak detector: the growth model's time to OOM
        self.growth: tuple[float, float, float] | None = None
        # another process on the device whose floor growth is named: a victim near the limit
        # is at risk from it (set by whoever runs the device's leak detectors)
        self.grower: int | None = None
        self._growth_used = False  # the latest forecast is the floor's growth, not the peaks'

    def update(self, s: Sample) -> RiskPoint | None:
        return self.last if self.observe(s) else None

    def at_risk_from(self, cause: str | None, leaking: bool) -> int | None:
        """The pid whose growth puts this process at risk: the other process's named growth
        (``grower``), where this one's risk ``cause`` is ``growth`` and it does not grow
        itself (``leaking``: its own leak verdict holds a leak). None otherwise: its own
        growth, or a cause of its own, is the answer. The alert's text and the stored verdict
        row both read it, so they name one pid."""
        if cause != "growth" or leaking or self.growth is not None:
            return None
        return self.grower

    @property
    def trend(self) -> Trend | None:
        """The peaks' trend the forecast comes from (None: no significant rise)."""
        return self._in_use

    @property
    def reserved_bytes(self) -> int | None:
        return self._reserved

    @property
    def largest_free_bytes(self) -> int | None:
        """The largest free block of the latest snapshot."""
        return self._largest_free

    @property
    def last(self) -> RiskPoint | None:
        """The latest point (``None`` before the first sample with memory figures)."""
        if self._last is None and self.has_point:
            tto, tr, g = self.time_to_oom_s, self._in_use, self.growth
            forecast: _Forecast = _NO_FORECAST
            if tto is not None and self._growth_used and g is not None:
                forecast = (tto, self._room / g[2], self._room / g[1] if g[1] > 0 else None)
            elif tto is not None and tr is not None:
                forecast = (tto, self._room / tr.slope_high, self._room / tr.slope_low)
            self._last = RiskPoint(self._ts_s, self._device, LEVELS[self.level_index],
                                   self.headroom_bytes, self.headroom_ratio, *forecast,
                                   _REASONS_BY_MASK[self._reasons], self.pid)
        return self._last

    def observe(self, s: Sample) -> bool:
        """Absorb one sample; True when it gave a point (it carried memory figures).

        Called for every sample the agent receives, so the common case (an allocator sample
        with an unchanged limit and no snapshot) runs inline, without allocating.
        """
        allocated, total = s.allocated_bytes, s.device_total_bytes
        if total and total != (self._device_total if allocated is None else self._cap):
            self._absorb_limit(s)
        if s.reserved_bytes is not None:
            self._reserved, self._allocated = s.reserved_bytes, allocated
        if s.device_used_bytes is not None:
            self._device_used = s.device_used_bytes
        spike_allocated = allocated
        if s.largest_free_block_bytes is not None:
            spike_allocated = self._absorb_snapshot(s)
        retries = s.num_alloc_retries
        if retries is not None:
            if self._retries is not None and retries > self._retries:
                self._retry_rise_ts = s.ts_s
            self._retries = retries
        if spike_allocated is not None:  # the largest request: a prefill spike, finished or not
            request = self.spikes.observe(s.ts_s, s.phase, spike_allocated)
            if request > self.largest_request_bytes:
                self.largest_request_bytes = request
        if allocated is not None:
            other = self._other_bytes()
            demand = allocated + other
        elif s.reserved_bytes is None and s.device_used_bytes is not None \
                and self._reserved is None:
            other, demand = 0, s.device_used_bytes  # NVML-only recording
        else:
            return False
        ts_s = s.ts_s
        if self._trend_from is None or ts_s < self._trend_from:
            self._calibrate(s, demand)
        else:
            self._peak(ts_s, demand, s.phase)
        self._ts_s, self._device, self._last, self.has_point = ts_s, s.device, None, True
        self._assess(ts_s, demand, other)
        return True

    def _calibrate(self, s: Sample, demand: int) -> None:
        """Before the trend starts: choose the windows (the readings wait, then are replayed
        from the end of the warm-up on), then wait out the warm-up."""
        if self.windows is not None:
            return
        if len(self._pending) < MAX_PENDING:
            self._pending.append((s.ts_s, demand, s.phase))
        w = self.chooser.update(s)
        if w is None:
            return
        self.windows = w
        self._window_s = max(w.trend_s, self.t.trend_span_s / TREND_WINDOWS)
        # short windows, however long the server's cycle: the fast route's interval takes a
        # sawtooth's wander for noise (a peak per cycle would be five minutes of six peaks)
        self._rise.window_s = max(FINE_PEAK_S, FINE_SAMPLES * (w.dt_s or 0.0))
        first = self.chooser.first_ts if self.chooser.first_ts is not None else s.ts_s
        self._trend_from = first + min(w.warmup_s, RISK_WARMUP_S)
        pending, self._pending = self._pending, []
        for ts_s, value, phase in pending:
            if ts_s >= self._trend_from:
                self._peak(ts_s, value, phase)

    def _peak(self, ts_s: float, demand: int, phase: Phase) -> None:
        if phase is Phase.SETUP:
            return  # a pool's one-time allocation and warm-up: not the serving peaks
        if self._rise.add(ts_s, demand) and self.limit_bytes:
            rate = self._rise.update(self.limit_bytes, demand, FAST_REACH,
                                     self.t.time_to_oom_warning_s)
            self._fast = None if rate is None else Trend(
                rate.t0, rate.slope, rate.intercept, rate.low, rate.high, rate.span_s)
        if self._window_start is not None and ts_s < self._window_end:
            if demand > self._window_peak:
                self._window_peak = demand
        else:
            self._next_window(ts_s, demand)

    def _absorb_snapshot(self, s: Sample) -> int | None:
        """Keep the largest free block and the external fragmentation; a snapshot-only sample
        takes the latest allocator figures, and the spike tracker then reads it as an allocator
        reading with the latest allocated bytes (returned), as it always has."""
        self._largest_free = s.largest_free_block_bytes
        if s.reserved_bytes is None and self._reserved is not None:  # a snapshot sample
            s = s._replace(reserved_bytes=self._reserved, allocated_bytes=self._allocated)
        self.external_fragmentation_ratio = external_fragmentation(s)
        return s.allocated_bytes

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

    def _next_window(self, ts_s: float, demand: int) -> None:
        """Close the peak window (the first sample opens one) and refit the trend of peaks."""
        start = self._window_start
        if start is not None:
            peaks = self._peaks
            peaks.append((start, self._window_peak))
            while peaks[0][0] < start - self.t.trend_span_s:
                peaks.popleft()
            step = self._window_s
            start += step * ((ts_s - start) // step)
            span = peaks[-1][0] + step - peaks[0][0]
            self._trend = fit_peaks(self._peaks, span) if len(peaks) >= MIN_TREND_WINDOWS \
                and span >= self.t.trend_min_span_s else None
        else:
            start = ts_s
        self._window_start, self._window_end = start, start + self._window_s
        self._window_peak = demand

    def restart(self) -> None:
        """An OOM happened: the episode is over. The trend and the retry history start over
        (the next warning is about the next OOM); the limit and the largest request stay. Its
        risk ends with it: the level is ok until a sample says otherwise (a process that died
        of the OOM sends none), and the floor's growth speaks again only once its leak
        detector does. The floor under the spikes is read anew: the one before the OOM held
        what the OOM freed (a headroom left after it would be the dead episode's)."""
        self._peaks.clear()
        self._rise.clear()
        self.spikes.baseline_bytes = None
        self._trend = self._in_use = self._fast = None
        self._window_start = None
        self._retry_rise_ts = self._retries = None  # the OOM's own retry is the episode's
        self.growth = None
        self.level_index = self._reasons = 0
        self.time_to_oom_s = None
        self._last = None

    def _assess(self, ts_s: float, demand: int, other: int) -> None:
        """The point's figures and level. ``x if x > y else y`` is ``max(y, x)`` (the same
        value and type, ties to ``y``), spelt out because this runs for every sample."""
        limit = self.limit_bytes
        if not limit:
            self.level_index = self._reasons = 0
            self.headroom_bytes = self.headroom_ratio = self.time_to_oom_s = None
            return
        spikes = self.spikes
        projected = demand
        if spikes.baseline_bytes is not None:
            projected = spikes.baseline_bytes + other + spikes.largest_bytes
            projected = projected if projected > demand else demand
        ratio = (limit - projected) / limit
        self.headroom_bytes, self.headroom_ratio = limit - demand, ratio
        tr = self._in_use = self._trend
        tto = None if tr is None else self._time_to_oom(tr, ts_s, demand, limit)
        if tto is None and tr is not None and tr.steady is not None:
            tr = self._in_use = tr.steady
            tto = self._time_to_oom(tr, ts_s, demand, limit)
        fast = self._fast
        if fast is not None:  # the fast route's rise, where it says sooner
            room = self._room
            fast_tto = self._time_to_oom(fast, ts_s, demand, limit)
            if fast_tto is not None and (tto is None or fast_tto < tto):
                tto, self._in_use = fast_tto, fast
            else:
                self._room = room
        self._growth_used = False
        if self.growth is not None:
            room = limit - projected
            growth_tto = (room if room > 0 else 0) / self.growth[0]
            if tto is None or growth_tto < tto:
                tto, self._room, self._growth_used = growth_tto, float(max(0, room)), True
        self.time_to_oom_s = tto
        retrying = self._retry_rise_ts is not None and self._retrying(ts_s, limit, other)
        # hysteresis: a headroom warning holds until the headroom is back above the threshold
        # by HYSTERESIS_RATIO of the limit (a server hovering at the threshold: one warning,
        # not dozens)
        held = self._reasons & _HEADROOM
        if ratio >= self.t.headroom_warning_ratio + (HYSTERESIS_RATIO if held else 0.0) \
                and tto is None and not retrying and self._largest_free is None:
            self.level_index = self._reasons = 0  # the common case, decided cheaply
        else:
            self._level(ratio, tto, limit, other, retrying)

    def _time_to_oom(self, tr: Trend, ts_s: float, demand: int, limit: int) -> float | None:
        """Seconds until the trend line (or the demand, if above it) meets the limit; None
        further than ``FORECAST_REACH`` times the span the trend was fitted on. An
        accelerating trend rests on half the span: it stands only where its latest end (the
        band's shallowest slope) is within that reach too, else None (the steady one answers).
        """
        level = tr.intercept + tr.slope * (ts_s - tr.t0)
        room = limit - (level if level > demand else demand)
        room = room if room > 0.0 else 0.0
        reach = FORECAST_REACH * tr.span_s
        if room / (tr.slope if tr.steady is None else tr.slope_low) > reach:
            return None  # further than the evidence reaches
        self._room = room
        return room / tr.slope

    def _retrying(self, ts_s: float, limit: int, other: int) -> bool:
        """Retries rose within ``RETRY_WINDOW_S``; or within ``RETRY_HOLD_S`` while reserved
        memory is still within ``NEAR_LIMIT_RATIO`` of what the allocator may reserve."""
        rise = self._retry_rise_ts
        if rise is None:
            return False
        age = ts_s - rise
        if age <= RETRY_WINDOW_S:
            return True
        reserved = self._reserved
        return age <= RETRY_HOLD_S and reserved is not None \
            and reserved >= NEAR_LIMIT_RATIO * (limit - other)

    def _level(self, ratio: float, tto: float | None, limit: int, other: int,
               retrying: bool) -> None:
        t = self.t
        was, was_level = self._reasons, self.level_index
        band = HYSTERESIS_RATIO if was & _HEADROOM else 0.0
        critical_band = band if was_level == 2 else 0.0
        stretch = HYSTERESIS_TIME if was & (_TREND | _GROWTH) else 1.0
        reasons = level = 0
        if ratio < t.headroom_warning_ratio + band:
            reasons, level = _HEADROOM, 2 if ratio < t.headroom_critical_ratio + critical_band \
                else 1
        if tto is not None and tto < t.time_to_oom_warning_s * stretch:
            reasons |= _GROWTH if self._growth_used else _TREND
            critical_stretch = stretch if was_level == 2 else 1.0
            level = 2 if tto < t.time_to_oom_critical_s * critical_stretch else (level or 1)
        if retrying:
            reasons |= _RETRIES
            level = level or 1
        if self._largest_free is not None:
            frag = self._fragmentation_level(limit, other, retrying)
            if frag:
                reasons |= _FRAGMENTATION
                level = frag if frag > level else level
        self.level_index, self._reasons = level, reasons

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
        cached_free = self._reserved - (self._allocated or 0)
        if need > cached_free + unreserved:
            return 0  # not enough free in all: a headroom risk, not fragmentation
        if retrying:
            return 2
        if self._reasons & _FRAGMENTATION:
            return 1  # holds while no block and no new segment holds the request, however the
            #           external fragmentation ratio wavers around its threshold
        return int((self.external_fragmentation_ratio or 0.0) > self.t.fragmentation_warning_ratio)

