"""Leak detection: idle floor, verdicts on literal floors, the causal detector end to end."""

import pytest
from vramscope.agent.analysis.leaks import LeakDetector, detect_leak, evaluate_floor, idle_floor
from vramscope.agent.analysis.thresholds import Thresholds
from vramscope.agent.records import Event, Phase, Sample

T = Thresholds()


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


def test_too_few_points_gives_no_verdict():
    v = evaluate_floor(_line(29, lambda i: 1000 * i), 1_000_000, T)
    assert (v.detected, v.p_value) == (False, None)


def _rising(n_s, rate, limit=8_000_000_000, phase=Phase.IDLE):
    return [Sample(float(t), 0, phase, allocated_bytes=1_000_000_000 + rate * t,
                   device_total_bytes=limit) for t in range(n_s)]


def test_detector_fires_at_the_first_evaluation_with_30_points_after_warm_up():
    # warm-up 300 s: floor points at 300, 360, ...; the 30th (t=2040) closes at t=2100
    d = LeakDetector(T)
    verdicts = [v for s in _rising(2200, 10_000) if (v := d.update(s)) is not None]
    assert len(verdicts) == 1
    assert verdicts[0].detected
    assert verdicts[0].first_detected_ts_s == 2100.0
    assert verdicts[0].slope_bytes_per_s == pytest.approx(10_000)
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
    assert "3 orphaned block(s)" in r.evidence


def test_a_found_leak_stays_found_while_it_still_rises_at_half_the_minimum():
    # 0.25 %/h minimum on 1 GB = 694 B/s; after detection the rate falls to 400 B/s
    limit = 1_000_000_000
    fast = [(60.0 * i, 10**8 + 2000 * 60 * i) for i in range(30)]
    slow = [(60.0 * i, fast[-1][1] + 400 * 60 * (i - 29)) for i in range(30, 60)]
    assert evaluate_floor(fast, limit, T).detected
    assert not evaluate_floor((fast + slow)[-30:], limit, T).detected
    assert evaluate_floor((fast + slow)[-30:], limit, T, was_detected=True).detected


def test_short_windows_from_the_config_for_short_recordings():
    # 1-second floor windows and no warm-up: the 30th point (t=29) closes at t=30
    cfg = {"alerts.leak_floor_window_s": 1.0, "alerts.leak_warmup_s": 0.0}
    samples = [Sample(t / 10, 0, Phase.IDLE, allocated_bytes=10**9 + 10**6 * t,
                      device_total_bytes=8 * 10**9) for t in range(400)]
    r = detect_leak(samples, config=cfg)
    assert (r.detected, r.first_detected_ts_s) == (True, 30.0)
    assert r.slope_bytes_per_s == pytest.approx(10**7)
    assert not detect_leak(samples).detected  # a 40 s recording is too short by default


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
    cfg = Thresholds(leak_warmup_s=0.0, leak_floor_window_s=1.0)
    d = LeakDetector(cfg)
    for t, v in enumerate([10, 20, 5, 30, 40, 50, 60, 70]):
        d.update(Sample(float(t), 0, Phase.IDLE, allocated_bytes=v))
    assert list(d.points) == [(0.0, 10), (1.0, 10), (2.0, 5), (3.0, 5), (4.0, 5), (5.0, 5),
                              (6.0, 5)]
