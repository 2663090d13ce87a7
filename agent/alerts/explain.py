"""What an alert says: the reason that fired, with its numbers, the process and the cause.

An ``oom_risk`` alert names the one condition behind it ("headroom 1.9 % of the 80.00 GiB limit
after the largest prefill spike (2.40 GiB)", "peaks rising 1.2 GiB/h over 20 min: OOM in
14.0 min (9.0 min to 25.0 min)"), not a list of what might have; a ``memory_leak`` alert says
its rate and since when. The cause is the one :func:`warning_cause` gives, by the same words
the post-mortem uses (``vramscope.agent.analysis.diagnosis``), kept for the whole risk episode
by :class:`CauseEpisode`: the alert, the stored verdict and the post-mortem name one cause.
"""

from __future__ import annotations

from typing import Protocol

from vramscope.agent.alerts.rules import RISK_HOLD_S, format_value
from vramscope.agent.analysis.diagnosis import FULL_RATIO, REMEDIES, SPIKE_RATIO, cause_words
from vramscope.agent.analysis.kv_leak import kv_words
from vramscope.agent.analysis.leaks import LeakDetector, LeakResult
from vramscope.agent.analysis.risk_model import RiskModel, RiskPoint
from vramscope.agent.analysis.stats import theil_sen
from vramscope.agent.timefmt import iso_utc

FLOOR_SHARE = 0.5  # the floor rose less than this share of the peaks' rise: the load did
# a request taking more than this share of the free memory in total is a prefill spike, not
# fragmentation: however the free memory were arranged, a somewhat longer prompt would not fit
SPIKE_SHARE = 0.5
# an episode ends once its process's risk has been ok this long (the risk alerts' own hold: the
# alert that named the cause is still active until then), or with an OOM
EPISODE_OK_S = RISK_HOLD_S
CAUSE_EVERY_S = 10.0  # during an episode the evidence is read again this often (record time)
# the causes an episode may change to, in rank: a change goes up this order only, so an episode
# never goes back and forth (fragmentation and the others never replace a cause)
RANK = {"prefill_spike": 1, "batch": 2, "growth": 3}


def size(n: float | None) -> str:
    """Bytes as every alert says them (``rules.format_value``), whole bytes under a MiB."""
    if n is None:
        return "unknown"
    return format_value("x_bytes", n) if abs(n) >= 2**20 else f"{n:,.0f} B"


def duration(s: float | None) -> str:
    """Seconds as every alert says them (``rules.format_value``), whole seconds under 2 min."""
    if s is None:
        return "unknown"
    return f"{s:.0f} s" if s < 120 else format_value("x_s", s)


def floor_share(model: RiskModel, leak: LeakDetector) -> float | None:
    """How much of the peaks' rise over the trend's span the idle floor rose too (None: no
    trend, or too few floor points over it): near 1 for growth (a leak, a cache), near 0 for
    a rising load (more requests, longer contexts) over a floor that stays."""
    trend = model.trend
    if trend is None or trend.slope <= 0:
        return None
    # the floor points of the span's recent half (warm-up or not; an accelerating trend is
    # that half already), at most 60 of them; where the floor is read with requests in flight
    # (never idle, no KV figures) the trend's own points with what the requests hold fitted
    # out: a load ramp lifts the raw ones too
    since = trend.t0 + (0.0 if trend.steady is not None else trend.span_s / 2)
    pts = [p for p in leak.load_free_points() if p[0] >= since]
    if len(pts) < 4:
        pts = [p for p in leak.recent_floor if p[0] >= since]
    if len(pts) < 4:  # a fast rise (minutes) spans few floor windows: the fine floor's points
        pts = [p for p in leak.fast_fine.points if p[0] >= since]
    if len(pts) < 4:
        return None
    pts = pts[::max(1, len(pts) // 60)]
    return theil_sen([p[0] for p in pts], [float(p[1]) for p in pts]).slope / trend.slope


def _fits_in_all(model: RiskModel) -> bool:
    """The largest request would fit in the free memory taken together (cached free and what
    may still be reserved): retries then mean no block holds it, fragmentation; else the
    memory is short in all, and the allocator retries for that."""
    limit, headroom = model.limit_bytes, model.headroom_bytes
    return bool(limit) and headroom is not None and model.largest_request_bytes <= headroom


def _full(model: RiskModel) -> bool:
    """The free memory in total would not hold the largest request with ``FULL_RATIO`` of the
    limit to spare: the device is full, whatever shape its free memory has."""
    limit, headroom = model.limit_bytes, model.headroom_bytes
    if not limit or headroom is None:
        return False
    return headroom - (model.largest_request_bytes or 0) < FULL_RATIO * limit


def _spike_fills_free(model: RiskModel) -> bool:
    """The largest request takes more than ``SPIKE_SHARE`` of the free memory in total now
    (the headroom): one long prompt, not memory in pieces."""
    headroom = model.headroom_bytes
    if headroom is None or not model.largest_request_bytes:
        return False
    return model.largest_request_bytes > SPIKE_SHARE * headroom


def warning_cause(point: RiskPoint, model: RiskModel, leak: LeakDetector) -> str:
    """The likely cause of a risk warning: fragmentation (a request fits no block, or the
    allocator retries, while it is small beside the free memory in total; one that takes most
    of it is a prefill spike); growth (a leak on this process, or peaks rising with the floor under
    them); batch, the load (peaks rising over a floor that stays, or the room gone without a
    spike); a prefill spike (the room is gone only once the largest spike is added)."""
    reasons = point.reasons
    if "growth" in reasons or (model.grower is not None and not leak.result.detected):
        # the floor's own growth (a leak verdict's rate) is the forecast; or another process's
        # growth is filling the device this one shares
        return "growth"
    # how much of the peaks' rise the floor rose too (None: no trend, or too few floor points)
    share = floor_share(model, leak) if "trend" in reasons else None
    floor_rose = share is not None and share >= FLOOR_SHARE
    if floor_rose or (leak.result.detected and _full(model)):
        # the floor's rise is filling the device: its free memory is in pieces too, and the
        # largest prefill needs more than is left, but compacting the pieces or bounding the
        # prefill would only buy time (the post-mortem's rule: diagnosis, "fragmentation")
        return "growth"
    load_rose = share is not None and share < FLOOR_SHARE  # peaks rising over a flat floor
    if "trend" in reasons and load_rose and not leak.result.detected:
        # the load is filling the device: the largest prefill then fits no block or segment
        # either, but it is the work in flight that grew (the post-mortem's rule: "load")
        return "batch"
    if "fragmentation" in reasons or ("alloc_retries" in reasons and _fits_in_all(model)):
        return "prefill_spike" if _spike_fills_free(model) else "fragmentation"
    if leak.result.detected:
        return "growth"
    if "trend" in reasons:
        return "batch" if load_rose else "growth"
    if "headroom" in reasons or "alloc_retries" in reasons:
        # without a prefill's activations (the one in progress, or the largest seen) would the
        # headroom be above the warning line? then the spike took it away, else the load did
        limit, headroom = model.limit_bytes, point.headroom_bytes
        spike = max(model.spikes.current_bytes(), model.spikes.largest_bytes)
        base = None if headroom is None else headroom + model.spikes.current_bytes()
        if limit and base is not None and spike and base >= model.t.headroom_warning_ratio * limit:
            return "prefill_spike"
        return "batch"
    return "unknown"


class CauseEpisode:
    """One process's risk episode, from its first warning until its risk has been ok for
    ``EPISODE_OK_S`` (or an OOM), and the cause it was named with (``cause``; ``ended_cause``:
    the last episode's, for the post-mortem of the OOM that ended it).

    The first warning names the cause (:func:`warning_cause`). Later readings (at each level
    change, and every ``CAUSE_EVERY_S``) change it only where the evidence for another is
    decisive by the documented definitions (:func:`decisive`), and only up ``RANK``.
    """

    __slots__ = ("cause", "ended_cause", "_ok_since", "_next_ts", "_level")

    def __init__(self) -> None:
        self.cause: str | None = None
        self.ended_cause: str | None = None
        self._ok_since: float | None = None
        self._next_ts = 0.0
        self._level = 0

    def observe(self, model: RiskModel, leak: LeakDetector, ts_s: float) -> None:
        """The model's latest point (at ``ts_s``), read for the episode's cause."""
        level = model.level_index
        if not level:
            if self.cause is not None:
                if self._ok_since is None:
                    self._ok_since = ts_s
                elif ts_s - self._ok_since >= EPISODE_OK_S:
                    self.end()
            self._level = 0
            return
        self._ok_since = None
        if self.cause is not None and level == self._level and ts_s < self._next_ts:
            return
        point = model.last
        if point is None or not point.reasons:
            return
        self._level, self._next_ts = level, ts_s + CAUSE_EVERY_S
        said = warning_cause(point, model, leak)
        if self.cause is None:
            self.cause, self.ended_cause = said, None
        elif said != self.cause and decisive(said, self.cause, point, model, leak):
            self.cause = said

    def end(self, by_oom: bool = False) -> None:
        """The episode is over: back to ok long enough, or an OOM (whose post-mortem then
        takes the episode's cause: ``ended_cause``)."""
        self.ended_cause = self.cause if by_oom else None
        self.cause, self._ok_since, self._level = None, None, 0


def decisive(said: str, cause: str, point: RiskPoint, model: RiskModel,
             leak: LeakDetector) -> bool:
    """Whether the evidence for ``said`` is decisive enough to replace an episode's ``cause``:
    growth once the growth model names it (this process's leak verdict, its floor's rate as the
    forecast, another process's named growth); the load once the peaks' trend, established by
    its interval, is the forecast; a prefill spike once the largest prefill needs more than all
    the free memory (no arrangement of the free memory would hold it: not fragmentation), or is
    one long prompt by the post-mortem's measure (at least ``SPIKE_RATIO`` of the limit) that
    takes more than ``SPIKE_SHARE`` of the free memory."""
    if RANK.get(said, 0) <= RANK.get(cause, 0):
        return False
    if said == "growth":
        return "growth" in point.reasons or leak.result.detected or model.grower is not None
    if said == "batch":
        return "trend" in point.reasons
    headroom, limit, need = model.headroom_bytes, model.limit_bytes, model.largest_request_bytes
    if said != "prefill_spike" or headroom is None:
        return False
    return need > headroom or bool(limit) and need >= SPIKE_RATIO * (limit or 0) \
        and need > SPIKE_SHARE * headroom


def risk_reasons(point: RiskPoint, model: RiskModel) -> str:
    """Each reason that holds, with its numbers."""
    parts = []
    limit = model.limit_bytes
    if "headroom" in point.reasons and point.headroom_ratio is not None:
        spike = max(model.spikes.current_bytes(), model.spikes.largest_bytes)
        after = f" after the largest prefill spike ({size(spike)})" if spike else ""
        parts.append(f"headroom {100 * point.headroom_ratio:.1f} % of the {size(limit)} "
                     f"limit{after}; {size(point.headroom_bytes)} free now")
    trend = model.trend
    if "trend" in point.reasons and trend is not None:
        parts.append(f"peaks rising {size(trend.slope * 3600)}/h over {duration(trend.span_s)}: "
                     f"OOM in {time_range(point)}")
    if "growth" in point.reasons and model.growth is not None:
        rate, low, high = model.growth
        parts.append(f"the floor growing {size(rate * 3600)}/h ({size(low * 3600)}/h to "
                     f"{size(high * 3600)}/h): OOM in {time_range(point)}")
    if "alloc_retries" in point.reasons:
        parts.append("the allocator is retrying (it freed its cache to find room), reserved "
                     f"{size(model.reserved_bytes)}")
    if "fragmentation" in point.reasons:
        frag = model.external_fragmentation_ratio
        parts.append(f"the largest request ({size(model.largest_request_bytes)}) fits neither "
                     f"the largest free block ({size(model.largest_free_bytes)}) nor a new "
                     f"segment; external fragmentation {100 * (frag or 0.0):.0f} %")
    return "; ".join(parts) or "risk level " + point.level


class _Forecast(Protocol):
    @property
    def time_to_oom_s(self) -> float | None: ...
    @property
    def time_to_oom_low_s(self) -> float | None: ...
    @property
    def time_to_oom_high_s(self) -> float | None: ...


def time_range(f: _Forecast) -> str:
    """"5.2 min (4.1 min to 7.0 min)"; the bounds only where they read differently from the
    figure (a trend fitted on regular peaks can be that sure)."""
    mid = duration(f.time_to_oom_s)
    low, high = duration(f.time_to_oom_low_s), duration(f.time_to_oom_high_s)
    return mid if low == mid == high else f"{mid} ({low} to {high})"


def risk_text(point: RiskPoint, model: RiskModel, leak: LeakDetector, who: str | None,
              cause: str | None = None) -> str:
    """The risk alert's text; ``cause``: the episode's (else read from the point now)."""
    cause = cause or warning_cause(point, model, leak)
    where = f" [{who}]" if who else ""
    likely = cause_words(cause, model.at_risk_from(cause, leak.result.detected))
    return (f"OOM risk {point.level}{where}: {risk_reasons(point, model)}; likely {likely}; "
            f"try: {REMEDIES[cause][0]}")


def leak_text(result: LeakResult, limit_bytes: int | None, who: str | None) -> str:
    k = result.kv
    if k is not None and k.sets_slope:  # the pool's orphaned blocks are the whole answer
        text = f"KV pool leaking blocks: {kv_words(k)} (leak)"
    else:
        rate = result.slope_bytes_per_s * 3600
        share = f", {100 * rate / limit_bytes:.2f} % of the limit per hour" if limit_bytes else ""
        since = "" if result.start_ts_s is None else f" since {iso_utc(result.start_ts_s)}"
        about = "about " if result.estimated_floor else ""
        low, high = result.rate_low_bytes_per_s, result.rate_high_bytes_per_s
        band = "" if low is None or high is None else \
            f" ({size(low * 3600)}/h to {size(high * 3600)}/h)"
        text = (f"idle floor rising {about}{size(rate)}/h{band}{share}{since}, over "
                f"{duration(result.span_s)} of floor (leak)")
        if result.time_to_oom_s is not None:
            text += f"; full in about {time_range(result)}"
        if result.estimated_floor:
            text += ("; a rough rate: the floor is estimated (rarely or never idle, no KV "
                     "figures), KV figures make it exact")
        if k is not None:
            text += f"; and the KV pool: {kv_words(k)}"
    return text + (f" [{who}]" if who else "")


__all__ = ["CauseEpisode", "decisive", "leak_text", "risk_reasons", "risk_text",
           "warning_cause"]
