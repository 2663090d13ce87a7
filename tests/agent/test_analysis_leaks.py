"""Leak detection: idle floor, verdicts on literal floors, the causal detector end to end."""

import pytest
from vramscope.agent.analysis.floor import FloorTracker, idle_floor
from vramscope.agent.analysis.leaks import LeakDetector, detect_leak, evaluate_floor, floor_line
from vramscope.agent.analysis.thresholds import Thresholds
from vramscope.agent.records import Event, Phase, Sample

T = Thresholds(leak_warmup_s=300.0)  # the timings below are derived with a 5-min warm-up


def test_idle_floor_prefers_samples_with_no_request_in_flight():
    alloc = [50, 60, 70, 80, 90, 95, 40, 45, 42, 41, 100, 100, 10]
    samples = [Sample(10.0 * i, 0, Phase.UNKNOWN, allocated_bytes=a) for i, a in enumerate(alloc)]
    events = [Event(0, "request_start"), Event(25, "request_end"),
              Event(60, "request_start"), Event(95, "request_end")]
    # minute 1: busy at 0-20 (50, 60, 70), idle at 30-50 -> 80; minute 2: idle at 100-110 -> 100
    assert idle_floor(samples, events) == [(30.0, 80), (100.0, 100)]


def test_idle_floor_without_idle_samples_is_the_minimum_of_the_minute():
    samples = [Sample(float(t), 0, Phase.DECODE, allocated_bytes=100 - t % 7) for t in range(125)]
    # minute [0,60): min 94 first at t=6; [60,120): min 94 first at t=62
    assert idle_floor(samples) == [(6.0, 94), (62.0, 94)]


def test_idle_floor_falls_back_to_device_used_and_filters_the_device():
    samples = [Sample(float(t), 1, device_used_bytes=500 + t) for t in range(0, 130, 10)]
    samples.append(Sample(5.0, 0, allocated_bytes=1))
    assert idle_floor(samples, device=1) == [(0.0, 500), (60.0, 560)]


def _line(n, step, start=1_000_000, dt=60.0):
    return [(dt * i, start + step(i)) for i in range(n)]


def test_a_steady_rise_is_a_leak_with_the_exact_slope():
    v = evaluate_floor(_line(30, lambda i: 1000 * i), 1_000_000, T)
    assert v.detected
    assert v.slope_bytes_per_s == pytest.approx(1000 / 60)
    assert v.growth_bytes == 29000  # 1000/60 B/s over 29 minutes
    assert v.trend_line == ((0.0, 1_000_000.0), (1740.0, 1_029_000.0))
    assert v.evidence.startswith("leak: idle floor moved")


@pytest.mark.parametrize("name, step, reason", [
    ("warm-up step then plateau", lambda i: 1000 * min(i, 10), "not rising recently"),
    ("sawtooth", lambda i: 1000 * (i % 5), "not significant"),
    ("flat", lambda i: 0, "not significant"),
    ("too slow for the limit", lambda i: i, "too slow"),
])
def test_not_a_leak(name, step, reason):
    v = evaluate_floor(_line(30, step), 1_000_000_000, T)
    assert not v.detected, name
    assert reason in v.evidence


def test_less_than_the_minimum_span_is_insufficient_data_saying_what_is_missing():
    # 15 points a minute apart span 14 min, under alerts.leak_min_span_s (15 min)
    v = evaluate_floor(_line(15, lambda i: 1000 * i), 1_000_000, T)
    assert (v.detected, v.state, v.p_value) == (False, "insufficient_data", None)
    assert v.evidence.startswith("not enough data yet: 1.0 more min of idle floor (has 14.0 of "
                                 "the 15 min")
    assert evaluate_floor(_line(16, lambda i: 1000 * i), 1_000_000, T).state == "leak"


def _rising(n_s, rate, limit=8_000_000_000, phase=Phase.IDLE):
    return [Sample(float(t), 0, phase, allocated_bytes=1_000_000_000 + rate * t,
                   device_total_bytes=limit) for t in range(n_s)]


def test_detector_answers_insufficient_data_until_15_min_of_floor_after_the_warm_up():
    # warm-up 300 s: floor points at 300, 360, ...; the one at 1200 (15 min after the first)
    # closes at t=1260: the first verdict
    d = LeakDetector(T)
    verdicts = [(s.ts_s, v) for s in _rising(2200, 10_000) if (v := d.update(s)) is not None]
    states = [(ts, v.state) for ts, v in verdicts]
    assert states[:2] == [(360.0, "insufficient_data"), (420.0, "insufficient_data")]
    assert states[14:16] == [(1200.0, "insufficient_data"), (1260.0, "leak")]
    first = verdicts[15][1]
    assert (first.first_detected_ts_s, first.span_s) == (1260.0, 900.0)
    assert first.slope_bytes_per_s == pytest.approx(10_000)
    assert verdicts[14][1].evidence.startswith("not enough data yet: 1.0 more min of idle floor")
    assert d.points[0] == (300.0, 1_003_000_000)


def test_detect_leak_reports_too_slow_growth_as_no_leak():
    # 100 B/s on an 8 GB device is 0.0045 %/h, under the 0.25 %/h minimum
    r = detect_leak(_rising(2200, 100))
    assert not r.detected
    assert r.first_detected_ts_s is None
    assert "too slow" in r.evidence


def test_orphaned_kv_blocks_are_a_leak_signal_of_their_own():
    samples = _rising(100, 0)
    events = [Event(50.0, "kv_orphaned_blocks", data={"blocks": 5}),
              Event(60.0, "kv_orphaned_blocks", data={"blocks": 3, "block_ids": [1, 2, 3]})]
    r = detect_leak(samples, events)
    assert (r.detected, r.first_detected_ts_s, r.orphaned_blocks) == (True, 50.0, 3)
    assert r.evidence.startswith("KV pool check: 3 orphaned KV blocks (latest check); a rate "
                                 "after 4 checks (has 2)")


def test_many_orphan_reports_keep_one_line_of_evidence_the_newest():
    # a leaking pool reports its orphans at every idle moment (hundreds an hour during a
    # warm-up, when no trend point rewrites the evidence): the evidence names the newest count
    # once, it does not grow with each report
    samples = _rising(100, 0)
    events = [Event(10.0 + i, "kv_orphaned_blocks", data={"blocks": 12 * (i + 1)})
              for i in range(200)]
    r = detect_leak(samples, events)
    assert r.orphaned_blocks == 2400 and r.evidence.count("orphaned KV blocks") == 1
    assert r.evidence.startswith("KV pool check: 2400 orphaned KV blocks (latest check); "
                                 "rising 12 blocks/s (12 blocks/s to 12 blocks/s, 90 %)")


def test_a_found_leak_stays_found_while_it_still_rises_at_half_the_minimum():
    # 0.25 %/h minimum on 1 GB = 694 B/s; after detection the rate falls to 400 B/s
    limit = 1_000_000_000
    fast = [(60.0 * i, 10**8 + 2000 * 60 * i) for i in range(30)]
    slow = [(60.0 * i, fast[-1][1] + 400 * 60 * (i - 29)) for i in range(30, 60)]
    assert evaluate_floor(fast, limit, T).detected
    assert not evaluate_floor((fast + slow)[-30:], limit, T).detected
    assert evaluate_floor((fast + slow)[-30:], limit, T, was_detected=True).detected


def test_short_time_scales_are_set_in_the_config_not_taken_from_the_cycle():
    # 1-second floor windows, no warm-up, a one-minute span: the point at 60 s closes at 61 s
    cfg = {"alerts.leak_floor_window_s": 1.0, "alerts.leak_warmup_s": 0.0,
           "alerts.leak_min_span_s": 60.0, "alerts.leak_horizon_s": 120.0}
    samples = [Sample(t / 10, 0, Phase.IDLE, allocated_bytes=10**9 + 10**6 * t,
                      device_total_bytes=8 * 10**9) for t in range(1000)]
    r = detect_leak(samples, config=cfg)
    assert (r.detected, r.first_detected_ts_s) == (True, 61.0)
    assert r.slope_bytes_per_s == pytest.approx(10**7)
    # with the defaults a 100 s recording says what it lacks, not "no leak"
    by_default = detect_leak(samples)
    assert by_default.state == "insufficient_data"
    assert by_default.evidence.startswith("not enough data yet: warming up (the first 5 min")


@pytest.mark.parametrize("ys, start", [
    ([100] * 10 + [100 + 7 * i for i in range(1, 21)], 540.0),  # flat to point 9, then up
    ([100 + 7 * i for i in range(30)], 120.0),  # rising from the start: median of first 5
    ([100, 103, 99, 101, 100, 102, 100] + [100 + 50 * i for i in range(1, 24)], 360.0),
])
def test_rise_start(ys, start):
    from vramscope.agent.analysis.leaks import rise_start

    assert rise_start([(60.0 * i, y) for i, y in enumerate(ys)]) == start


def test_a_leak_that_starts_mid_recording_reports_when_it_started():
    limit = 1_000_000_000
    pts = [(60.0 * i, 10**8) for i in range(10)] + [(60.0 * i, 10**8 + 5000 * 60 * (i - 9))
                                                     for i in range(10, 40)]
    v = evaluate_floor(pts, limit, T)
    assert v.detected and v.start_ts_s == 540.0


def test_never_idle_the_floor_is_taken_right_after_a_request_ends():
    # busy all minute; a request ends at 35 s: the sample after it (70) is the floor, not the
    # dip to 50 while requests were in flight
    alloc = [100, 50, 120, 130, 70, 110, 115]
    samples = [Sample(10.0 * i, 0, Phase.DECODE, allocated_bytes=a) for i, a in enumerate(alloc)]
    events = [Event(0.0, "request_start"), Event(0.0, "request_start"), Event(35.0, "request_end")]
    assert idle_floor(samples, events) == [(40.0, 70)]


def test_the_detector_uses_the_least_of_the_last_five_floor_points():
    # a 120 s horizon: a trend point per second, each floor window's point
    cfg = Thresholds(leak_warmup_s=0.0, leak_floor_window_s=1.0, leak_horizon_s=120.0)
    d = LeakDetector(cfg)
    for t, v in enumerate([10, 20, 5, 30, 40, 50, 60, 70]):
        d.update(Sample(float(t), 0, Phase.IDLE, allocated_bytes=v))
    assert list(d.points) == [(0.0, 10), (1.0, 10), (2.0, 5), (3.0, 5), (4.0, 5), (5.0, 5),
                              (6.0, 5)]


def test_trend_points_are_the_least_floor_point_of_each_minute_whatever_the_cycle():
    # 1-second floor windows (a fast cycle) under the default 2 h horizon: one trend point per
    # minute, the least floor point of its minute, so the cycle never shortens the time scale
    d = LeakDetector(Thresholds(leak_warmup_s=0.0, leak_floor_window_s=1.0))
    for t in range(185):
        d.update(Sample(float(t), 0, Phase.IDLE, allocated_bytes=2000 - t + (t % 60) ** 2))
    # each minute's least is its first second's (2000 - t, then the square grows faster);
    # the fourth minute (180-240 s) is not over yet
    assert list(d.points) == [(0.0, 2000), (60.0, 1940), (120.0, 1880)]


def test_a_model_reload_starts_a_new_warm_up():
    # a settled floor of 1 GB for an hour, then the weights go (allocated 10 MB) and come back
    # 2 GB higher (a bigger model): no verdict on the old floor, a new warm-up from the drop
    d = LeakDetector(T)
    before = [Sample(float(t), 0, Phase.IDLE, allocated_bytes=10**9, device_total_bytes=8 * 10**9)
              for t in range(0, 3600, 2)]
    gone = [Sample(3600.0, 0, Phase.IDLE, allocated_bytes=10**7, device_total_bytes=8 * 10**9)]
    after = [Sample(float(t), 0, Phase.IDLE, allocated_bytes=3 * 10**9,
                    device_total_bytes=8 * 10**9) for t in range(3602, 3602 + 900, 2)]
    for s in before:
        d.update(s)
    assert d.result.state == "no_leak"
    for s in gone + after:
        d.update(s)
    assert d.reloads == 1 and d.result.state == "insufficient_data"
    assert d.result.evidence.startswith("not enough data yet: 6.0 more min of idle floor "
                                         "(has 9.0 of the 15 min")
    assert d.result.first_detected_ts_s is None and not d.result.detected


def _settled_then_gone(d: LeakDetector, gone_for_s: int) -> None:
    """An hour of a flat 1 GB floor, then the weights freed (10 MB) for ``gone_for_s``."""
    for t in range(0, 3600, 2):
        d.update(Sample(float(t), 0, Phase.IDLE, allocated_bytes=10**9,
                        device_total_bytes=8 * 10**9))
    assert d.result.state == "no_leak"
    for t in range(3600, 3600 + gone_for_s, 2):
        d.update(Sample(float(t), 0, Phase.IDLE, allocated_bytes=10**7,
                        device_total_bytes=8 * 10**9))


def test_a_server_shutting_down_keeps_its_last_answer():
    # the GPU recording of docs/gpu-verification.md section 17: a healthy server's weights and
    # KV pool freed at its exit, a few samples later it is gone. Its answer stays "no leak"
    d = LeakDetector(T)
    _settled_then_gone(d, 10)
    assert d.reloads == 1 and d.result.state == "no_leak"


def test_memory_gone_for_two_minutes_is_a_reload():
    # the same fall, and the samples go on (a process that unloaded its model and waits):
    # RELOAD_CONFIRM_S after the fall the answer is the new warm-up's
    d = LeakDetector(T)
    _settled_then_gone(d, 120)
    assert d.result.state == "no_leak"  # 3600..3718 s: not yet 120 s of samples after it
    d.update(Sample(3720.0, 0, Phase.IDLE, allocated_bytes=10**7, device_total_bytes=8 * 10**9))
    assert d.result.state == "insufficient_data"
    assert d.result.evidence.startswith("model reloaded at 3600.000 (allocated fell to 9.5 MiB)")


def test_after_hours_without_floor_points_the_span_is_the_horizons_points():
    # an hour of idle floor, then four hours without any record (the agent down), then ten
    # minutes: the verdict rests on those ten minutes alone (the first hour left the 2 h
    # horizon), less than the 15 min a verdict needs, so not enough data yet: never a
    # "no_leak" on the span since the first point of the process (which read 5 h)
    d = LeakDetector(Thresholds(leak_warmup_s=0.0))
    for t in [*range(0, 3600, 10), *range(18000, 18600, 10)]:
        d.update(Sample(float(t), 0, Phase.IDLE, allocated_bytes=10 * 2**30,
                        device_total_bytes=80 * 2**30))
    assert d.result.state == "insufficient_data"
    assert d.result.evidence.startswith("not enough data yet: 7.0 more min of idle floor "
                                        "(has 8.0 of the 15 min")


def test_without_kv_figures_a_wave_after_its_prefill_is_the_floor_not_its_prefill():
    # static batching, never idle, no KV figures: a wave of 4 ends at 25 s as the next wave
    # of 4 starts; the sample after (30 s) holds the new wave's prefill activations (140), the
    # next (40 s) its decode KV only (115). As many requests in flight at both: the least of
    # the window is the floor, not the moment the old wave ended
    tracker = FloorTracker(60.0)
    for i in range(4):
        tracker.on_event(Event(0.0, "request_start", request_id=f"a{i}"))
    points = []
    for ts, phase, alloc in [(0.0, Phase.DECODE, 130), (10.0, Phase.DECODE, 150),
                             (20.0, Phase.DECODE, 170), (30.0, Phase.PREFILL, 140),
                             (40.0, Phase.DECODE, 115), (50.0, Phase.DECODE, 125),
                             (60.0, Phase.DECODE, 135)]:
        if ts == 30.0:
            for i in range(4):
                tracker.on_event(Event(25.0, "request_start", request_id=f"b{i}"))
                tracker.on_event(Event(25.0, "request_end", request_id=f"a{i}"))
        point = tracker.update(Sample(ts, 0, phase, allocated_bytes=alloc), anytime=False)
        if point is not None:
            points.append((point, tracker.last_load))
    assert points == [((40.0, 115), 5)]  # RESIDUAL + 4 in flight: an estimated floor


def test_a_floor_less_the_tokens_held_is_read_between_prefills():
    # a per-request cache less its tokens (explained 40 a sample): a prefill's activations are
    # still in allocated memory, so the window's least is read outside the prefill phase; a
    # window of prefills only gives its least as a floor read with its requests in flight
    tracker = FloorTracker(60.0)
    for i in range(3):
        tracker.on_event(Event(0.0, "request_start", request_id=f"r{i}"))
    points = []
    for ts, phase, alloc in [(0.0, Phase.PREFILL, 100), (20.0, Phase.DECODE, 150),
                             (40.0, Phase.PREFILL, 120), (60.0, Phase.PREFILL, 190),
                             (80.0, Phase.PREFILL, 170), (120.0, Phase.DECODE, 160)]:
        point = tracker.update(Sample(ts, 0, phase, allocated_bytes=alloc), explained=40,
                               between_prefills=True)
        if point is not None:
            points.append((point, tracker.last_load))
    assert points == [((20.0, 110), 1),  # RESIDUAL: the decode moment, not the prefills' 60
                      ((80.0, 130), 4)]  # prefills only: RESIDUAL + 3 in flight


def test_leak_rate_is_the_rise_since_a_real_knee_the_average_of_steps_and_robust_to_a_low_stretch():
    from vramscope.agent.analysis.leaks import leak_rate

    xs = [60.0 * i for i in range(60)]
    # flat for 30 minutes, then 10 bytes/s, with +-100 bytes of alternating noise: the knee
    # (F far beyond the noise) at minute 30, the rate since it
    bent = [1e6 + 10.0 * max(0.0, x - 1800.0) + (100.0 if i % 2 else -100.0)
            for i, x in enumerate(xs)]
    rate, knee = leak_rate(xs, bent, 5.0, 1.0)
    assert knee == 1800.0 and rate == pytest.approx(10.0, rel=0.01)
    # the same noise on a straight line: no knee, the line's slope
    line = [1e6 + 10.0 * x + (100.0 if i % 2 else -100.0) for i, x in enumerate(xs)]
    rate, knee = leak_rate(xs, line, 9.0, 1.0)
    assert knee is None and rate == pytest.approx(10.0, rel=0.01)
    # a leak in three steps of 12,000 bytes (minutes 5, 25 and 55: 10.2 bytes/s over the
    # span): least squares reads 7.9, the median pair slope 6.9 (pairs within a step's flat)
    steps = [1e6 + 12_000.0 * ((i >= 5) + (i >= 25) + (i >= 55)) for i in range(60)]
    rate, knee = leak_rate(xs, steps, 6.9, 3.9)
    assert knee is None and round(rate, 2) == 7.92
    # the first ten points 36,000 bytes low (a residual floor read with a wrong bytes per
    # block): least squares would read 1.7x; outside Sen's band, the Theil-Sen slope stands
    low = [y - (36_000.0 if i < 10 else 0.0) for i, y in enumerate(line)]
    rate, knee = leak_rate(xs, low, 0.0, 25.0)
    assert knee is None and rate == pytest.approx(10.0, rel=0.02)


def test_a_server_that_idles_rarely_has_its_newest_read_judged_against_the_horizons_reads():
    # idle reads every 15 min over two hours, the last two in its last third (40 min): too few
    # for a line of the last third alone, so the line is the horizon's (flat at 1 GB, the
    # reads 1 MB apart: their median between); a read 60 MB above 1 GB is a rise (beyond
    # what the minimum slope of 20 MB/h adds over 15 min), one 4 MB above is the wandering
    reads = [(900.0 * i, 10**9 + (10**6 if i % 2 else 0)) for i in range(8)]
    line = floor_line(reads, Thresholds(), 20 * 10**6 / 3600)
    assert line is not None
    assert (line.intercept, line.slope, line.allowed) == (1_000_500_000, 0.0, 5_000_000)
    assert line.above((6400.0, 10**9 + 60 * 10**6)) == 59_500_000
    assert line.above((6400.0, 10**9 + 4 * 10**6)) is None
    assert floor_line(reads[-5:], Thresholds(), 20 * 10**6 / 3600) is None  # too few reads
