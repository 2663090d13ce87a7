"""The causal OOM-risk model on literal samples."""

import pytest
from vramscope.agent.analysis.risk import risk_timeline
from vramscope.agent.analysis.risk_model import RiskModel
from vramscope.agent.analysis.thresholds import Thresholds
from vramscope.agent.records import Phase, Sample

P, D = Phase.PREFILL, Phase.DECODE
LIMIT = 1000
NO_WARMUP = Thresholds(leak_warmup_s=0.0)


def S(ts, phase=D, alloc=None, **kw):
    kw.setdefault("device_total_bytes", LIMIT)
    return Sample(float(ts), 0, phase, "t", allocated_bytes=alloc, **kw)


def levels(samples, thresholds=None):
    m = RiskModel(thresholds or Thresholds())
    return [(p.level, p.headroom_bytes, round(p.headroom_ratio, 6), p.reasons)
            for s in samples if (p := m.update(s)) is not None]


def test_headroom_after_the_largest_prefill_spike():
    # decode 900; a prefill to 960 is a 60-byte spike; back at 900 the projection is 960:
    # 4 % left -> warning (under 5 %); a prefill to 985 -> 1.5 % -> critical (under 2 %)
    got = levels([S(0, D, 900), S(1, P, 960), S(2, D, 900), S(3, P, 985), S(4, D, 900)])
    assert got == [
        ("ok", 100, 0.1, ()),
        ("warning", 40, 0.04, ("headroom",)),
        ("warning", 100, 0.04, ("headroom",)),
        ("critical", 15, 0.015, ("headroom",)),
        ("critical", 100, 0.015, ("headroom",)),
    ]


def test_memory_outside_the_allocator_counts_against_the_limit():
    # device used 950 - reserved 900 = 50 bytes of context: demand 900 + 50
    got = levels([S(0, D, 900, reserved_bytes=900, device_used_bytes=950)])
    assert got == [("ok", 50, 0.05, ())]  # exactly 5 % is not under 5 %
    assert levels([S(0, D, 901, reserved_bytes=900, device_used_bytes=950)])[0][0] == "warning"


def test_no_limit_means_no_verdict():
    m = RiskModel()
    p = m.update(Sample(0.0, 0, D, allocated_bytes=10))
    assert (p.level, p.headroom_bytes, p.headroom_ratio, p.time_to_oom_s) == ("ok", None, None,
                                                                               None)


def test_time_to_oom_from_the_trend_of_the_peaks():
    # allocated = 500 + t on a 2,500-byte limit: 60 s peaks 559, 619, ... slope exactly 1 B/s.
    # At t=600 the 10th window closes, 10 min of peaks (alerts.trend_min_span_s): level
    # max(1100, 559 + 600) = 1159 -> 1341 s to OOM, within 3 x the 600 s fitted on.
    # (No warm-up here; the trend's warm-up is tested below.)
    m = RiskModel(NO_WARMUP)
    points = [m.update(S(t, D, 500 + t, device_total_bytes=2_500)) for t in range(601)]
    assert all(p.time_to_oom_s is None for p in points[:600])
    last = points[600]
    assert (last.time_to_oom_s, last.time_to_oom_low_s, last.time_to_oom_high_s) == (
        1341.0, 1341.0, 1341.0)
    assert last.level == "warning" and last.reasons == ("trend",)


def test_a_forecast_never_reaches_further_than_three_times_its_evidence():
    # the same rise on a 10,000-byte limit: 8841 s to OOM on 600 s of peaks is no forecast
    m = RiskModel(NO_WARMUP)
    points = [m.update(S(t, D, 500 + t, device_total_bytes=10_000)) for t in range(601)]
    assert (points[600].time_to_oom_s, points[600].level) == (None, "ok")


def test_growth_that_flattens_is_not_a_trend_to_the_limit():
    # a warm-up that rises fast, then slows to a tenth (a cache filling up): significant over
    # the span, but its recent half rises at under half the whole span's slope
    m = RiskModel(NO_WARMUP)
    alloc = [500 + (t if t < 600 else 600 + (t - 600) // 10) for t in range(1201)]
    points = [m.update(S(t, D, a, device_total_bytes=2_500)) for t, a in enumerate(alloc)]
    assert points[600].time_to_oom_s is not None  # while it rose steadily: a forecast
    assert points[1200].time_to_oom_s is None and points[1200].level == "ok"


def _ramp_after_flat_peaks(limit):
    """Ten minutes of flat peaks (500 + t mod 7), then a ramp of 1 B/s (a load ramp beginning
    inside the trend's span): the point at t=1200, and the model."""
    m = RiskModel(NO_WARMUP)
    alloc = [500 + (t % 7) if t < 600 else 500 + (t - 600) for t in range(1201)]
    points = [m.update(S(t, D, a, device_total_bytes=limit)) for t, a in enumerate(alloc)]
    return points[1200], m


def test_an_accelerating_rise_is_forecast_from_the_recent_half_of_its_span():
    # the whole span's line (0.539 B/s, band 0.377-0.539 B/s) dilutes the ramp with the flat
    # peaks before it: 1341 B of room over it is 2489 s, no warning. The recent half rises at
    # 1 B/s, above that band: 1341 s to OOM, within 3 x its 600 s, a warning
    point, m = _ramp_after_flat_peaks(2_500)
    assert (point.level, point.reasons, point.time_to_oom_s) == ("warning", ("trend",), 1341.0)
    assert m.trend is not None and (m.trend.span_s, m.trend.slope) == (600.0, 1.0)
    assert m.trend.steady is not None and round(m.trend.steady.slope, 3) == 0.539
    assert round(1341.0 / m.trend.steady.slope) == 2489


def test_an_accelerating_forecast_stands_only_within_its_half_spans_reach():
    # 1841 B of room: 1841 s at the recent half's 1 B/s is past 3 x its 600 s; the whole span's
    # line answers instead (3527 s, within 3 x its 1200 s): a forecast, no warning
    point, m = _ramp_after_flat_peaks(3_000)
    assert (point.level, point.time_to_oom_s) == ("ok", 3526.875)
    assert m.trend is not None and m.trend.span_s == 1200.0 and m.trend.steady is None


def test_a_short_time_to_oom_warns_and_then_goes_critical():
    t = Thresholds(time_to_oom_warning_s=1400.0, time_to_oom_critical_s=1341.5, leak_warmup_s=0.0)
    m = RiskModel(t)
    for ts in range(600):
        m.update(S(ts, D, 500 + ts, device_total_bytes=2_500))
    p = m.update(S(600, D, 1100, device_total_bytes=2_500))
    assert (p.level, p.reasons) == ("critical", ("trend",))


def test_flat_peaks_give_no_forecast():
    m = RiskModel()
    points = [m.update(S(t, D, 500 + (t % 7), device_total_bytes=10_000)) for t in range(900)]
    assert points[-1].time_to_oom_s is None


def test_rising_alloc_retries_warn():
    got = levels([S(0, D, 100, num_alloc_retries=0), S(30, D, 100, num_alloc_retries=2),
                  S(95, D, 100, num_alloc_retries=2)])
    # retries rose within 60 s at t=30; at t=95 the window [35, 95] holds no rise
    assert [g[0] for g in got] == ["ok", "warning", "ok"]
    assert got[1][3] == ("alloc_retries",)


def test_fragmentation_leaves_no_room_for_the_largest_request():
    # largest request 100 (a prefill spike); reserved 920 of 1000, largest free block 40:
    # it fits neither in a free block (40) nor in a new segment (80 unreserved) although 320
    # are free in the cache: external fragmentation 1 - 40/320 > 0.5
    base = dict(reserved_bytes=920, largest_free_block_bytes=40)
    got = levels([S(0, D, 600, **base), S(1, P, 700, **base), S(2, D, 600, **base)])
    assert got[2][0] == "warning"
    assert got[2][3] == ("fragmentation",)
    # with retries and room below one request: critical
    crit = dict(reserved_bytes=950, largest_free_block_bytes=40)
    got = levels([S(0, D, 600, num_alloc_retries=0, **crit), S(1, P, 700, **crit),
                  S(2, D, 600, num_alloc_retries=1, **crit)])
    assert got[2][0] == "critical"
    assert set(got[2][3]) >= {"alloc_retries", "fragmentation"}


# (reserved, largest free block, retries at the third sample) around a 100-byte prefill spike
# over a decode baseline of 600 on a 1000-byte limit -> level and reasons at the third sample
FRAGMENTATION_CASES = [
    # fits in neither the largest free block (40) nor a new segment (80): warning
    ("no_block_no_segment", 920, 40, None, ("warning", ("fragmentation",))),
    # the same with the allocator retrying: critical
    ("retrying", 920, 40, 1, ("critical", ("alloc_retries", "fragmentation"))),
    # a new segment of 150 holds it, however fragmented the 250 cached free bytes: no risk
    # (this was a warning while the rule wanted twice the request in contiguous room)
    ("segment_fits", 850, 40, None, ("ok", ())),
    # a free block of 100 holds it
    ("block_fits", 920, 100, None, ("ok", ())),
    # 80 free in the cache, 40 of it in one block: external fragmentation 0.5 is not above 0.5
    ("little_cached", 680, 40, None, ("ok", ())),
]


@pytest.mark.parametrize("name, reserved, largest, retries, expected", FRAGMENTATION_CASES,
                         ids=[c[0] for c in FRAGMENTATION_CASES])
def test_fragmentation_cases(name, reserved, largest, retries, expected):
    kw = dict(reserved_bytes=reserved, largest_free_block_bytes=largest)
    first = dict(kw, num_alloc_retries=0) if retries is not None else kw
    last = dict(kw, num_alloc_retries=retries) if retries is not None else kw
    got = levels([S(0, D, 600, **first), S(1, P, 700, **kw), S(2, D, 600, **last)])
    assert got[2][0] == expected[0]
    assert got[2][3] == expected[1]


def test_healthy_unchunked_prefills_on_a_fragmented_cache_are_no_risk():
    # the demo's healthy server without chunked prefill (8k-token prompts), in MiB: a
    # 672 MiB prefill spike, largest free block 224 MiB (external fragmentation 0.91), but 732
    # MiB still to reserve under the 22,614 MiB limit and 11 % headroom after the spike: it
    # served 3 simulated hours without one allocator retry. Not a fragmentation risk.
    M = 2**20
    limit, reserved = 22614 * M, (22614 - 732) * M
    decode = dict(reserved_bytes=reserved, largest_free_block_bytes=224 * M,
                  device_total_bytes=limit, num_alloc_retries=0)
    got = levels([S(0, D, reserved - 2469 * M, **decode),
                  S(1, P, reserved - 2469 * M + 672 * M, **decode),
                  S(2, D, reserved - 2469 * M, **decode)])
    assert [g[0] for g in got] == ["ok", "ok", "ok"]
    assert got[2][2] == round((732 + 2469 - 672) / 22614, 6)  # 11 %


def test_risk_timeline_is_per_device_and_causal():
    samples = [Sample(0.0, 0, D, allocated_bytes=10, device_total_bytes=100),
               Sample(0.5, 1, D, allocated_bytes=99, device_total_bytes=100),
               Sample(1.0, 0, D, allocated_bytes=99)]
    tl = risk_timeline(samples)
    assert [(p.ts_s, p.device, p.level) for p in tl] == [
        (0.0, 0, "ok"), (0.5, 1, "critical"), (1.0, 0, "critical")]
    # causal: the prefix gives the same points as the whole
    assert risk_timeline(samples[:2]) == tl[:2]


@pytest.mark.parametrize("config, level", [
    ({"alerts.headroom_warning_ratio": 0.2, "alerts.headroom_critical_ratio": 0.01}, "warning"),
    ({"alerts.headroom_warning_ratio": 0.1, "alerts.headroom_critical_ratio": 0.01}, "ok"),
])
def test_thresholds_come_from_the_config(config, level):
    tl = risk_timeline([S(0, D, 850)], config=config)
    assert tl[0].level == level


def test_trend_window_from_the_config():
    # 100 B/s in 0.1 s steps; 1 s windows (a 20 s span: 1 s bins) peak at k + 0.9 s:
    # 590 + 100 k. At t = 10 s the 10th window closes, 10 s of peaks: level
    # max(1500, 590 + 1000) = 1590 -> (4,000 - 1590) / 100 s (the windows are chosen within
    # 2 floor windows of 0.5 s; no warm-up)
    m = RiskModel(Thresholds(trend_window_s=1.0, leak_floor_window_s=0.5, leak_warmup_s=0.0,
                             trend_span_s=20.0, trend_min_span_s=10.0))
    points = [m.update(S(i / 10, D, 500 + 10 * i, device_total_bytes=4_000)) for i in range(101)]
    assert points[99].time_to_oom_s is None
    assert points[100].time_to_oom_s == pytest.approx(24.1)


def test_a_per_process_cap_is_the_limit_and_other_processes_do_not_count_against_it():
    nvml = Sample(0.0, 0, source="nvml", device_used_bytes=990, device_total_bytes=1000)
    capped = Sample(1.0, 0, D, "torch", allocated_bytes=100, reserved_bytes=120,
                    device_total_bytes=200)
    uncapped = capped._replace(ts_s=2.0, device_total_bytes=1000)
    m = RiskModel()
    assert m.update(nvml).headroom_bytes == 10  # NVML alone: device total - device used
    p = m.update(capped)
    assert (m.limit_bytes, p.headroom_bytes, p.headroom_ratio) == (200, 100, 0.5)
    p = m.update(uncapped)  # no cap: 990 - 120 of others' memory counts
    assert (m.limit_bytes, p.headroom_bytes) == (1000, 1000 - 100 - 870)


def test_torch_total_a_little_under_nvml_total_is_not_a_cap():
    nvml = Sample(0.0, 0, source="nvml", device_used_bytes=500, device_total_bytes=1000)
    torch = Sample(1.0, 0, D, "torch", allocated_bytes=100, reserved_bytes=120,
                   device_total_bytes=995)
    m = RiskModel()
    m.update(nvml)
    assert m.update(torch).headroom_bytes == 995 - 100 - (500 - 120)


def test_a_snapshot_sample_is_read_against_the_latest_allocator_figures():
    m = RiskModel()
    m.update(S(0, D, 600, reserved_bytes=1000))
    m.update(Sample(1.0, 0, D, "torch_snapshot", largest_free_block_bytes=100))
    assert m.external_fragmentation_ratio == pytest.approx(0.75)  # 1 - 100 / 400


def test_risk_timeline_max_points_keeps_the_worst_level_and_least_headroom_per_bucket():
    # limit 1000; device 0 over 0..9 s: allocated 900 (10 % headroom, ok), a spike to 960
    # at 3 s (warning, 4 %) and 990 at 7 s (critical, 1 %); device 1 has two points
    alloc = [900, 900, 900, 960, 900, 900, 900, 990, 900, 900]
    samples = [S(t, P if t in (3, 7) else D, a) for t, a in enumerate(alloc)]
    samples += [Sample(0.5, 1, D, allocated_bytes=10, device_total_bytes=100),
                Sample(8.5, 1, D, allocated_bytes=20, device_total_bytes=100)]
    full = risk_timeline(samples)
    got = risk_timeline(samples, max_points=3)
    # device 0 buckets of 3 s: [0, 3) ok; [3, 6) from the spike at 3 s on; [6, 9] critical at 7
    assert [(p.ts_s, p.device, p.level, p.headroom_bytes, round(p.headroom_ratio, 6),
             p.reasons) for p in got] == [
        (0.0, 0, "ok", 100, 0.1, ()),
        (0.5, 1, "ok", 90, 0.9, ()),
        (3.0, 0, "warning", 40, 0.04, ("headroom",)),
        (7.0, 0, "critical", 10, 0.01, ("headroom",)),
        (8.5, 1, "ok", 80, 0.8, ()),
    ]
    assert len(full) == 12
    assert risk_timeline(samples, max_points=100) == full  # fewer points than asked: as is
    with pytest.raises(ValueError, match="max_points must be at least 1, got 0"):
        risk_timeline(samples, max_points=0)


def test_the_trend_waits_out_its_warm_up():
    # The same rise with the default warm-up (300 s, all of which the OOM trend waits): no
    # peak before t=300 counts. The fast route's 15-s peaks from t=300 on establish the rise
    # once the limit is within 2x their span: at t=885, 1101 s to the 2,500-byte limit; the
    # slow route's 10 minute-peaks after the warm-up are there at t=900: level
    # max(1400, 859 + 600) = 1459, 1041 s, the sooner then.
    m = RiskModel()
    points = [m.update(S(t, D, 500 + t, device_total_bytes=2_500)) for t in range(901)]
    assert all(p.time_to_oom_s is None for p in points[:885])
    assert m.windows.warmup_s == 300.0
    assert (points[885].time_to_oom_s, points[885].level) == (1101.0, "warning")
    assert points[900].time_to_oom_s == 1041.0


def test_a_one_time_fill_in_setup_is_no_trend():
    # A KV pool allocated in setup (a step of 5,000 B) between flat serving peaks: the step
    # samples are setup, so the peaks stay flat and nothing forecasts an OOM.
    m = RiskModel(NO_WARMUP)
    points = [m.update(S(t, Phase.SETUP if 300 <= t < 360 else D,
                         500 + (5000 if t >= 300 else 0) * (t < 360), device_total_bytes=10_000))
              for t in range(1200)]
    assert [p.time_to_oom_s for p in points if p.time_to_oom_s is not None] == []


def test_a_headroom_warning_holds_with_hysteresis_instead_of_flapping():
    # headroom hovering at the 5 % threshold: 4.9 %, 5.1 %, 4.9 %, 5.1 % is one warning held
    # (it cleared and fired at every sample); it clears at 7 %, above 5 % + 1 % of the limit
    got = levels([S(t, D, a) for t, a in enumerate((951, 949, 951, 949, 941, 930, 949))])
    assert [g[0] for g in got] == ["warning"] * 5 + ["ok", "ok"]


def test_a_fragmentation_warning_holds_while_the_request_fits_nowhere():
    # entered at external fragmentation 1 - 40/320 = 0.875; then 800 allocated of 920 reserved
    # leaves 120 cached free with a 60-byte block: 0.5, not above the 0.5 that enters a warning,
    # but the 100-byte request still fits neither in 60 nor in the 80 unreserved: the warning
    # holds (it cleared); a 100-byte block ends it
    base = dict(reserved_bytes=920, largest_free_block_bytes=40)
    tight = dict(reserved_bytes=920, largest_free_block_bytes=60)
    got = levels([S(0, D, 600, **base), S(1, P, 700, **base), S(2, D, 600, **base),
                  S(3, D, 800, **tight), S(4, D, 800, **tight),
                  S(5, D, 800, reserved_bytes=920, largest_free_block_bytes=100)])
    assert [g[0] for g in got[2:]] == ["warning", "warning", "warning", "ok"]
