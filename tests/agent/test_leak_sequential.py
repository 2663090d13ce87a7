"""The sequential leak test: a CUSUM on floor increments, armed once the floor settled, and its
confirmation by the trend checks on the points since the change point."""

import math

import pytest
from vramscope.agent.analysis import sequential
from vramscope.agent.analysis.leaks import LeakDetector, confirm
from vramscope.agent.analysis.sequential import Cusum
from vramscope.agent.analysis.thresholds import Thresholds
from vramscope.agent.records import Phase, Sample

T = Thresholds(leak_warmup_s=300.0)  # the timings below are derived with a 5-min warm-up


def feed(c, ys, k=1.0, t0=0):
    return [c.update(float(t0 + i), y, y, k) for i, y in enumerate(ys)]


def test_a_flat_floor_arms_the_test_and_a_clean_rise_crosses_where_derived():
    c = Cusum()
    assert not any(feed(c, [0.0] * 10))
    # the first point has no increment; the next 8 are quiet: armed at the 9th point
    assert (c.armed, c.quiet) == (True, 8) and sequential.QUIET_POINTS == 8
    assert c.h == 16.0  # no noise: 8 points of 2k
    # +5 a point, k = 1: S = 4, 8, 12, 16 (not over h), 20 (over)
    assert feed(c, [5.0 * i for i in range(1, 6)], t0=10) == [False] * 4 + [True]
    assert (c.s, c.start_ts) == (20.0, 9.0)


def test_noise_is_measured_from_excursions_that_fell_back():
    c = Cusum()
    feed(c, [0.0, 10.0] * 10)  # +10, -10, ...: every excursion falls back
    # |step - median| = 10 for each: sigma = 10 / (1.2816 sqrt 2), h = 8 sigma
    assert c.noise() == pytest.approx(10 / (1.2815515655446004 * math.sqrt(2)))
    assert c.h == pytest.approx(8 * c.noise()) and c.armed
    # a leak's own steps do not raise the threshold while it is being tested
    h = c.h
    feed(c, [10.0 + 20 * i for i in range(1, 4)], t0=20)
    assert c.h == h


def test_a_warm_up_ramp_restarts_the_test_until_the_floor_settles():
    c = Cusum()
    ramp = [50.0 * i for i in range(20)] + [950.0] * 12
    fired = feed(c, ramp)
    assert not any(fired)  # never a leak: it rose before the floor ever settled
    assert c.restarts == 19 and c.armed  # each point of the ramp; armed on the plateau
    assert c.s == 0.0


def _pts(ys, dt=60.0):
    return [(dt * i, y) for i, y in enumerate(ys)]


def test_confirm_a_steady_rise_and_reject_a_step_or_too_little_time():
    limit = 10**9  # minimum slope 0.25 %/h: 694 B/s, 41.7 kB a minute
    rise = confirm(_pts([10**8 + 10**5 * i for i in range(11)]), limit, T, 0.0, 5e5, 1e5)
    assert rise.detected and rise.slope_bytes_per_s == pytest.approx(10**5 / 60)
    assert rise.evidence.startswith("leak (sequential test): CUSUM 0.477 MiB")
    step = confirm(_pts([10**8] + [10**8 + 10**7] * 11), limit, T, 0.0, 9e6, 1e5)
    assert not step.detected and "not rising recently" in step.evidence
    # ten points a minute apart span 9 min: under MIN_CONFIRM_S (10 min)
    short = confirm(_pts([10**8 + 10**5 * i for i in range(10)]), limit, T, 0.0, 5e5, 1e5)
    assert not short.detected
    assert "9.0 min of floor since the change point, too little" in short.evidence


def _idle_floor(values, dt=1.0, total=8 * 10**9):
    """Idle samples, one a second; 4 to a floor window once the windows are chosen."""
    return [Sample(dt * i, 0, Phase.IDLE, allocated_bytes=v, device_total_bytes=total)
            for i, v in enumerate(values)]


def test_a_clean_step_leak_after_a_settled_floor_is_found_after_ten_minutes_of_it():
    # 1 GB flat for 20 minutes, then +2 MB a second (9 %/h of 80 GB: it would fill the device
    # in 11 h, too slow for the growth model's fast route). No requests: the windows are the
    # bounds (60 s floor windows, 300 s warm-up) after 120 s of records.
    flat, n = 1200, 2400
    d = LeakDetector(T)
    values = [10**9 + 2 * 10**6 * max(0, t - flat) for t in range(n)]
    first = next(v for s in _idle_floor(values, total=80 * 10**9)
                 if (v := d.update(s)) is not None and v.detected)
    # floor points at 300, 360, ... (each window's first sample); the raw point of 1260 s is
    # the first up, the least of the last five first rises at the point of 1500 s by 120 MB,
    # crossing h at once (8 x 2k = 26.7 MB, the floor has no noise), from the change point
    # 1440 s; confirmation needs 10 min since it: 1440..2040 s, closed at 2100 s, 15 minutes
    # after the leak began (4 of them the least-of-five's lag)
    assert (first.first_detected_ts_s, first.start_ts_s) == (2100.0, 1440.0)
    assert first.slope_bytes_per_s == pytest.approx(2 * 10**6)
    assert "(sequential test)" in first.evidence
