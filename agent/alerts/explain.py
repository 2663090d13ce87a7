"""What an alert says: the reason that fired, with its numbers, the process and the cause.

An ``oom_risk`` alert names the one condition behind it ("headroom 1.9 % of the 80.00 GiB limit
after the largest prefill spike (2.40 GiB)", "peaks rising 1.2 GiB/h over 20 min: OOM in
14.0 min (9.0 min to 25.0 min)"), not a list of what might have; a ``memory_leak`` alert says
its rate and since when. The cause is the one :func:`warning_cause` gives, by the same words
the post-mortem uses (``vramscope.agent.analysis.diagnosis``).
"""

from __future__ import annotations

from vramscope.agent.analysis.diagnosis import REMEDIES
from vramscope.agent.analysis.leaks import LeakResult
from vramscope.agent.analysis.risk import RiskModel, RiskPoint
from vramscope.agent.timefmt import iso_utc


def size(n: float | None) -> str:
    if n is None:
        return "unknown"
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.1f} MiB"


def duration(s: float | None) -> str:
    if s is None:
        return "unknown"
    if s < 120:
        return f"{s:.0f} s"
    return f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def warning_cause(point: RiskPoint, model: RiskModel, leaking: bool) -> str:
    """The likely cause of a risk warning: fragmentation (a request fits no block, or the
    allocator retries), growth (a rising trend, or a leak on this process), a prefill spike
    (the room is gone only once the largest spike is added), else batch (the load itself)."""
    reasons = point.reasons
    if "fragmentation" in reasons or "alloc_retries" in reasons:
        return "fragmentation"
    if "trend" in reasons or leaking:
        return "growth"
    if "headroom" in reasons:
        limit, headroom = model.limit_bytes, point.headroom_bytes
        spike = model.spikes.largest_bytes
        if limit and headroom is not None and headroom - spike < 0.05 * limit <= headroom:
            return "prefill_spike"
        return "batch"
    return "unknown"


def risk_reasons(point: RiskPoint, model: RiskModel) -> str:
    """Each reason that holds, with its numbers."""
    parts = []
    limit = model.limit_bytes
    if "headroom" in point.reasons and point.headroom_ratio is not None:
        parts.append(f"headroom {100 * point.headroom_ratio:.1f} % of the {size(limit)} limit "
                     f"after the largest prefill spike ({size(model.spikes.largest_bytes)}); "
                     f"{size(point.headroom_bytes)} free now")
    trend = model.trend
    if "trend" in point.reasons and trend is not None:
        parts.append(f"peaks rising {size(trend.slope * 3600)}/h over {duration(trend.span_s)}: "
                     f"OOM in {duration(point.time_to_oom_s)} ({duration(point.time_to_oom_low_s)}"
                     f" to {duration(point.time_to_oom_high_s)})")
    if "alloc_retries" in point.reasons:
        parts.append("the allocator is retrying (it freed its cache to find room), reserved "
                     f"{size(model.reserved_bytes)}")
    if "fragmentation" in point.reasons:
        frag = model.external_fragmentation_ratio
        parts.append(f"the largest request ({size(model.largest_request_bytes)}) fits neither "
                     f"the largest free block ({size(model.largest_free_bytes)}) nor a new "
                     f"segment; external fragmentation {100 * (frag or 0.0):.0f} %")
    return "; ".join(parts) or "risk level " + point.level


def risk_text(point: RiskPoint, model: RiskModel, leaking: bool, who: str | None) -> str:
    cause = warning_cause(point, model, leaking)
    where = f" [{who}]" if who else ""
    return (f"OOM risk {point.level}{where}: {risk_reasons(point, model)}; likely {cause}; "
            f"try: {REMEDIES[cause][0]}")


def leak_text(result: LeakResult, limit_bytes: int | None, who: str | None) -> str:
    if result.orphaned_blocks and result.p_value is None:
        text = f"KV pool holds {result.orphaned_blocks} orphaned block(s) (leak)"
    else:
        rate = result.slope_bytes_per_s * 3600
        share = f", {100 * rate / limit_bytes:.2f} % of the limit" if limit_bytes else ""
        since = "" if result.start_ts_s is None else f" since {iso_utc(result.start_ts_s)}"
        text = (f"idle floor rising {size(rate)}/h{share}{since}, over "
                f"{duration(result.span_s)} of floor after the warm-up (leak)")
    return text + (f" [{who}]" if who else "")


__all__ = ["leak_text", "risk_reasons", "risk_text", "warning_cause"]
