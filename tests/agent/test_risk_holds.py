"""Warnings that hold while their condition holds (issue 20): allocator retries on a cache
reserved to the limit, and a KV pool whose fill trend reaches the total, on literal samples."""

import numpy as np
import pytest
from vramscope.agent.alerts.engine import AlertEngine
from vramscope.agent.analysis.kv import KvTracker
from vramscope.agent.analysis.risk_model import RETRY_HOLD_S, RiskModel
from vramscope.agent.records import Phase, Sample

LIMIT = 1000


def retry_samples(reserved, times, retries_at=30):
    """Decode samples on a 1000-byte limit, 100 allocated; one retry at ``retries_at``."""
    return [Sample(float(t), 0, Phase.DECODE, "t", allocated_bytes=100, reserved_bytes=reserved,
                   device_total_bytes=LIMIT, num_alloc_retries=int(t >= retries_at))
            for t in times]


def reasons(samples):
    m = RiskModel()
    return [(p.ts_s, p.level, p.reasons) for s in samples if (p := m.update(s)) is not None]


def test_retries_hold_the_warning_while_reserved_stays_at_the_limit():
    # reserved 960 of 1000 (96 %, at least 95 % of what may be reserved) and one retry at
    # 30 s: the warning holds for RETRY_HOLD_S after it, not 60 s (it cleared at 100 s before)
    times = [0, 30, 100, 1000, 30 + RETRY_HOLD_S, 31 + RETRY_HOLD_S]
    got = reasons(retry_samples(960, times))
    assert [(ts, level) for ts, level, _ in got] == [
        (0.0, "ok"), (30.0, "warning"), (100.0, "warning"), (1000.0, "warning"),
        (30.0 + RETRY_HOLD_S, "warning"), (31.0 + RETRY_HOLD_S, "ok")]
    assert got[3][2] == ("alloc_retries",)


def test_retries_with_room_to_reserve_warn_for_a_minute_only():
    # reserved 900 (90 %): the allocator may still grow its cache, so a retry is a moment
    got = reasons(retry_samples(900, [0, 30, 90, 91]))
    assert [level for _, level, _ in got] == ["ok", "warning", "warning", "ok"]


def kv_sample(t, used, total=1000):
    return Sample(float(t), 0, Phase.DECODE, "kv", kv_blocks_used=used, kv_blocks_total=total)


def sawtooth(seconds, start=500, rise_per_s=0.5, period=20, drop=60):
    """A pool of 1000 blocks filling at ``rise_per_s`` blocks a second with a batch admitted
    every ``period`` seconds (``drop`` blocks, drained until the next one)."""
    return [kv_sample(t, min(1000, int(start + rise_per_s * t
                                       + drop * (0.5 - (t % period) / period))))
            for t in range(seconds)]


def test_the_kv_forecast_follows_the_fill_trend_through_the_sawtooth():
    samples = sawtooth(300)
    k = KvTracker()
    for s in samples:
        k.observe(s)
    # the least-squares line through the ten minutes of history (here 299 s), computed apart:
    # room above the line's value at 299 s (higher than the 622 blocks then used) over its
    # slope. The 30 s change is negative here (a draining tooth): the old rate-only forecast
    # had nothing to say
    ts = np.array([s.ts_s for s in samples])
    used = np.array([s.kv_blocks_used for s in samples])
    slope, intercept = np.polyfit(ts, used, 1)
    level = intercept + slope * 299.0
    assert used[-1] == 622 and level > 622
    assert k.trend_span_s == 299.0
    assert k.exhaustion_s == pytest.approx((1000 - level) / slope, rel=1e-9)


def test_a_full_pool_is_exhausted_now():
    k = KvTracker()
    for t in range(10):
        k.observe(kv_sample(t, 100 * t + 100))
    assert k.exhaustion_s == 0.0


def kv_alerts(samples):
    return [(c.kind, c.rule, c.ts_s) for c in AlertEngine.from_config(None).feed(samples)
            if c.rule == "kv_exhaustion"]


def test_kv_exhaustion_is_warned_over_the_horizon_its_trend_covers():
    # 1 block/s from 500 of 1000, a batch of 100 blocks admitted every 30 s: past 80 % from
    # 270 s, full at 450 s. The ten-minute trend says "full in under 270 s" within its horizon
    # (the 270 s of history): fired at 275 s, once the gate has held 5 s, 175 s ahead. With the
    # 30 s rate and a fixed 60 s look-ahead it fired at 425 s, 25 s ahead
    samples = sawtooth(700, rise_per_s=1.0, period=30, drop=100)
    full = next(s.ts_s for s in samples if s.kv_blocks_used >= 1000)
    first = next(s.ts_s for s in samples if s.kv_blocks_used >= 800)
    assert (first, full) == (270.0, 450.0)
    assert kv_alerts(samples) == [("fired", "kv_exhaustion", 275.0)]


def test_the_horizon_is_the_trend_span_when_the_trend_reaches_the_total_within_it():
    flat = AlertEngine.from_config(None)
    flat.feed([kv_sample(t, 500) for t in range(100)])
    assert flat.devices[0].value("kv_exhaustion_horizon_s", 99.0) == 60.0  # the setting alone
    ramp = [kv_sample(t, 500 + t) for t in range(300)]  # 1 block a second
    e = AlertEngine.from_config(None)
    e.feed(ramp[:101])
    d = e.devices[0]
    assert d.kv.exhaustion_s == pytest.approx(400.0)  # at 100 s: 400 blocks left
    assert d.value("kv_exhaustion_horizon_s", 100.0) == 60.0  # beyond its 100 s of history
    e.feed(ramp[101:])
    assert d.kv.exhaustion_s == pytest.approx(201.0)  # at 299 s: 201 blocks left
    assert d.value("kv_exhaustion_horizon_s", 299.0) == 299.0  # within its 299 s of history


def test_a_steady_full_pool_admitting_batches_is_not_running_out():
    # 85-95 % used for 20 minutes, a batch of 100 blocks every 30 s drained until the next: no
    # trend; the 30 s rate after each admission says "full in ~60-90 s", which is held to the
    # 60 s look-ahead (stretched to the trend's ten minutes, it would fire at every batch)
    samples = sawtooth(1200, start=900, rise_per_s=0.0, period=30, drop=100)
    assert max(s.kv_blocks_used for s in samples) == 950
    assert kv_alerts(samples) == []


def risk_alerts(allocated):
    """OOM-risk alert changes over 1 s decode samples on a 1000-byte limit."""
    samples = [Sample(float(t), 0, Phase.DECODE, "t", allocated_bytes=a, device_total_bytes=LIMIT)
               for t, a in enumerate(allocated)]
    return [(c.kind, c.ts_s) for c in AlertEngine.from_config(None).feed(samples)
            if c.rule == "oom_risk"]


def test_a_risk_that_keeps_coming_back_holds_longer_each_time():
    # 30 s at warning (4 % headroom) every 40 minutes for 12 hours: the first alert resolves
    # 30 min after its dip, the risk is back 10 min later; the second alert then holds an hour,
    # longer than the gaps, until the end. Two alerts (18 with a fixed 30 min hold, 18 with the
    # old one-minute hold)
    got = risk_alerts(([960] * 30 + [900] * 2370) * 18)
    assert got == [("fired", 15.0), ("resolved", 30.0 + 1800.0), ("fired", 2415.0)]


def test_a_risk_gone_for_six_hours_starts_over():
    # two dips 8 h apart: each alert holds 30 min (the second is not a return of the first)
    dip = [960] * 30
    got = risk_alerts(dip + [900] * (8 * 3600 - 30) + dip + [900] * 1900)
    second = 8 * 3600.0
    assert got == [("fired", 15.0), ("resolved", 1830.0), ("fired", second + 15.0),
                   ("resolved", second + 1830.0)]
