"""The growth model (agent/analysis/growth.py, fast_growth.py): one rate with its interval,
and the state, what is missing and the time to OOM that follow from it; its fast route in the
leak detector."""

import math

import pytest
from vramscope.agent.analysis.fast_growth import (
    NO_WORK,
    FastGrowth,
    rises_steadily,
    rises_step_by_step,
    since_serving,
)
from vramscope.agent.analysis.growth import (
    Rate,
    describe_forecast,
    judge,
    more_time_s,
    rate_interval,
    rate_interval_with_load,
    step_margin,
    time_to_oom,
    widened,
)
from vramscope.agent.analysis.leaks import LeakDetector, rising_recently
from vramscope.agent.records import Event, Phase, Sample

MB = 10**6


def test_a_clean_line_has_its_rate_exactly_and_no_width():
    rate = rate_interval([(float(t), 100.0 + 2 * t) for t in range(10)])
    assert (rate.slope, rate.low, rate.high, rate.span_s, rate.points) == (2.0, 2.0, 2.0, 9.0, 10)


def test_wiggles_in_runs_widen_the_interval_by_their_autocorrelation():
    # the same +-5 around the same line: alternating, the points are independent; in runs of
    # three, each run counts for about one point (effective count 5.3 of 12)
    alternating = rate_interval([(float(t), 2 * t + (5 if t % 2 else -5)) for t in range(12)])
    runs = rate_interval([(float(t), 2 * t + (5 if (t // 3) % 2 else -5)) for t in range(12)])
    assert alternating is not None and runs is not None
    assert alternating.effective_points == 12.0
    assert runs.effective_points == pytest.approx(5.2562, rel=1e-4)
    assert runs.high - runs.low > 1.5 * (alternating.high - alternating.low)


# a flat floor estimated less 10 MB per request in flight too much, while the requests in
# flight climb from 2 to 12 over 15 min: the corrected points fall 400 MB/h
OVER_LOADS = [2, 2, 3, 4, 4, 5, 6, 6, 7, 8, 8, 9, 10, 10, 11, 12]
OVER_WIGGLE = [0.3, -0.2, 0.1, -0.4, 0.2, 0.0, -0.1, 0.3, -0.3, 0.1, 0.2, -0.2, 0.0, 0.1, -0.1, 0.2]
OVER_POINTS = [(60.0 * t, 10**9 - 10 * MB * n + w * MB)
               for t, (n, w) in enumerate(zip(OVER_LOADS, OVER_WIGGLE))]
MIN_20_MB_PER_H = 20 * MB / 3600


def test_a_rate_fitted_with_the_load_carries_the_error_of_what_was_taken_off():
    plain = rate_interval(OVER_POINTS)
    joint = rate_interval_with_load(OVER_POINTS, OVER_LOADS)
    assert plain is not None and joint is not None
    # taken as exact, the correction makes a fall that rules any rise out ...
    assert round(plain.slope * 3600 / MB, 1) == -401.3
    assert judge(plain, MIN_20_MB_PER_H) == "no_leak"
    # ...fitted beside the time, the bytes per request leave the rate about flat, and unknown
    assert (round(joint.low * 3600 / MB, 1), round(joint.high * 3600 / MB, 1)) == (-8.6, 20.4)
    assert judge(joint, MIN_20_MB_PER_H) == "insufficient_data"
    # a load that never varied: the plain interval
    assert rate_interval_with_load(OVER_POINTS, [3] * 16) == plain


def test_a_recent_stretch_of_estimated_floors_rules_a_rise_out_only_with_its_load_fitted():
    assert rising_recently(OVER_POINTS, MIN_20_MB_PER_H, 900.0) is None
    recent = rising_recently(OVER_POINTS, MIN_20_MB_PER_H, 900.0, OVER_LOADS)
    assert recent is not None and recent[0] == 900.0


def test_a_short_stretch_takes_the_floors_noise_from_before_it():
    pts = [(float(t), 2.0 * t) for t in range(6)]
    assert rate_interval(pts).low == 2.0
    assert rate_interval(pts, noise=10.0).low == pytest.approx(-3.0548, rel=1e-4)


# a leak in steps: 300 MB at 3 min, 200 MB more at 21 min, read each minute to 33 min
STAIRS = [(60.0 * i, 0 if i < 3 else 300 * MB if i < 21 else 500 * MB) for i in range(34)]


def test_a_floor_in_steps_has_its_rate_known_to_a_step_either_side():
    rate = rate_interval(STAIRS)
    assert rate is not None
    per_h = [round(v * 3600 / MB, 1) for v in (rate.slope, rate.low, rate.high)]
    # least squares reads 756.3 MB/h where the stairs added 500 MB in the 30.5 min since
    # their first step (983.6 MB/h); one step (300 MB, less what the line adds in the
    # minute) over the 33 min either side holds it
    assert per_h == [756.3, 447.7, 1064.9]
    assert round(step_margin(STAIRS, rate) * 3600 / MB, 1) == 522.5
    # a floor that falls back as far as it steps wanders about a line: no step
    wandering = [(t, y - 250 * MB if i == 10 else y) for i, (t, y) in enumerate(STAIRS)]
    assert step_margin(wandering, rate_interval(wandering)) == 0.0
    # a steady rise: no step
    line = [(60.0 * i, 10 * MB * i) for i in range(34)]
    assert step_margin(line, rate_interval(line)) == 0.0


def test_a_leak_that_rose_before_its_latest_rise_reports_its_average_since_it_began_too():
    detector = LeakDetector()
    detector.limit_bytes = 80 * 2**30  # the minimum slope adds 53.7 MB over 15 min
    base = 20 * 2**30
    # flat for an hour, 1300 MB at 5 min, flat again, then 110 MB a minute from 35 min
    horizon = ([(60.0 * i, base) for i in range(-60, 1)]
               + [(60.0 * i, base + 1300 * MB) for i in range(5, 36)]
               + [(60.0 * i, base + 1300 * MB + 110 * MB * (i - 35)) for i in range(36, 57)])
    burst = [p for p in horizon if p[0] >= 35 * 60]
    rate = rate_interval(burst)
    assert rate is not None and round(rate.slope * 3600 / MB) == 6600
    out = detector._misfit(rate, rate.slope, burst, horizon, [0] * len(horizon))
    # the latest rise, 6600 MB/h (widened to the model's error), and the average since the
    # floor first rose, 3867.9 MB/h (3610 MB over 56 min), both inside
    assert (round(out.low * 3600 / MB, 1), round(out.high * 3600 / MB, 1)) == (-24.4, 7590.0)
    # the same rise over a floor flat until it began: the interval is the rise's only
    onset = [(t, y - 1300 * MB) for t, y in burst]
    flat = [(60.0 * i, base) for i in range(-60, 35)] + onset
    assert detector._misfit(rate, rate.slope, onset, flat, [0] * len(flat)) == widened(
        rate, rate.slope)


def test_the_state_follows_the_interval_and_what_is_missing_scales_with_the_effect():
    rate = Rate(2.0, 1.0, 3.0, 600.0, 10, 10.0, 1.0)
    assert (judge(rate, 0.5), judge(rate, 2.5), judge(rate, 3.5)) == (
        "leak", "insufficient_data", "no_leak")
    # the half-width (1.0) must fall under the gap to the minimum: 600 x (1 / gap)^(2/3)
    assert more_time_s(rate, 2.5) == pytest.approx(600 * 2 ** (2 / 3) - 600)
    assert more_time_s(rate, 2.9) < more_time_s(rate, 2.5)  # no: a nearer minimum needs more
    assert more_time_s(rate._replace(slope=2.0), 2.0) == 24 * 3600.0


def test_time_to_oom_is_the_headroom_over_the_rate_with_its_range():
    rate = Rate(2.0, 1.0, 3.0, 600.0, 10, 10.0, 1.0)
    f = time_to_oom(7200.0, rate)
    assert f is not None and (f.seconds, f.soonest, f.latest) == (3600.0, 2400.0, 7200.0)
    assert describe_forecast(f) == "full in about 60 min (40 min – 2 h)"
    assert time_to_oom(7200.0, rate._replace(low=-1.0)).latest is None
    assert time_to_oom(7200.0, rate._replace(slope=0.0)) is None


def _fed(values, loads=None, start=0.0, step=10.0):
    f = FastGrowth()
    for i, v in enumerate(values):
        f.add(start + step * i, int(v), 0 if loads is None else loads[i])
    return f


def test_fast_growth_is_established_on_a_steady_rise_not_on_a_step_a_warmup_or_a_load():
    flat = [10 * MB] * 30
    rise = flat + [10 * MB + 5 * MB * k for k in range(1, 13)]  # 0.5 MB/s for 2 min
    # 10 GB of headroom at 0.5 MB/s: full in 5.6 h, beyond the fast route's hour
    assert _fed(rise).established(1.0, 10 * 10**9, -1e4, 1e9) is None
    # full in 33 min: fast, on a stretch of 5 % of that (100 s): 13 points, shortest first
    rate = _fed(rise).established(1.0, 1 * 10**9, -1e4, 1e9)
    assert rate is not None and rate.slope == pytest.approx(0.5 * MB)
    assert (rate.points, rate.span_s) == (13, 120.0)
    step = flat + [70 * MB] * 12  # one step of 60 MB
    assert _fed(step).established(1.0, 10**9, -1e4, 1e9) is None
    warmup = flat + [10 * MB + 30 * MB * (1 - 0.6**k) for k in range(1, 13)]  # it flattens
    assert _fed(warmup).established(1.0, 10**9, -1e4, 1e9) is None
    loads = [4] * 30 + [4 + k for k in range(1, 13)]  # the requests in flight rise with it
    assert _fed(rise, loads).established(1.0, 10**9, -1e4, 1e9) is None
    # a floor less the tokens held (not estimated): the requests in flight beside it rising
    # with it are the load's activations, not growth; steady beside it, growth
    worked = FastGrowth()
    for i, v in enumerate(rise):
        worked.add(10.0 * i, int(v), 0, loads[i])
    assert worked.established(1.0, 10**9, -1e4, 1e9) is None
    steady = FastGrowth()
    for i, v in enumerate(rise):
        steady.add(10.0 * i, int(v), 0, 4 + i % 3)
    assert steady.established(1.0, 10**9, -1e4, 1e9).points == 13
    # 70 s of a rise that fills 100 MB in 200 s: the least stretch, a minute, is 9 points (two
    # of them flat: its rate is read since the knee, 8 points), unless it began in the
    # process's first 15 min (then it needs 2 min of floor, and to have added 10 % of the limit)
    short = flat + [10 * MB + 5 * MB * k for k in range(1, 8)]
    since = _fed(short).established(1.0, 10**8, -1e4, 1e9)
    assert (since.points, since.slope) == (8, 0.5 * MB)
    assert _fed(short).established(1.0, 10**8, 0.0, 1e9) is None
    # in the first 15 min a steady rise (every step 5 MB) is growth, whatever its size: 60 MB
    # is 6 % of a 1 GB limit (a warm-up's size)
    assert _fed(rise).established(1.0, 10**8, 0.0, 1e9).points == 13


def test_a_rise_early_in_a_process_in_a_warmups_jumps_waits_for_the_cap():
    # the same 60 MB over 2 min in the process's first minutes, in 4 jumps of 15 MB with the
    # floor flat between them (a warm-up's segments): a quarter of the rise in one step
    flat = [10 * MB] * 30
    jumps = flat + [10 * MB + 15 * MB * (k // 3) for k in range(1, 13)]
    assert _fed(jumps).established(1.0, 10**8, 0.0, 1e9) is None
    # ...unless it has outgrown the cap: 12 % of a 500 MB limit, filling 100 MB in 200 s
    assert _fed(jumps).established(1.0, 10**8, 0.0, 5e8) is not None
    # past the first 15 min the same jumps are growth (no warm-up to take them for)
    assert _fed(jumps, start=1e4).established(1.0, 10**8, 0.0, 1e9) is not None


def test_a_steady_rise_steps_up_at_most_points_and_none_carries_much_of_it():
    rate = Rate(1.0, 0.9, 1.1, 100.0, 11, 11.0, 0.0)  # 100 B over the stretch
    even = [(10.0 * i, 10 * i) for i in range(11)]  # 10 steps of 10 B: 10 % each
    assert rises_steadily(even, rate)
    lumpy = even[:5] + [(10.0 * i, 20 + 10 * i) for i in range(5, 11)]  # one step of 30 B
    assert not rises_steadily(lumpy, rate)
    flat_runs = [(10.0 * i, 10 * (i // 2) * 2) for i in range(11)]  # half the steps flat
    assert not rises_steadily(flat_runs, rate)
    assert not rises_steadily(even[:1], rate)


def test_on_points_finer_than_a_warmups_jumps_a_lumpy_rise_at_every_step_is_steady():
    rate = Rate(1.0, 0.9, 1.1, 80.0, 9, 9.0, 0.0)  # 80 B over 8 steps: 10 B a step on average
    # a per-request floor's lumps: every step rises, the largest 19 B (24 % of the rise, which
    # rises_steadily's 15 % refuses; 1.9 x the mean step)
    lumpy = list(zip([15.0 * i for i in range(9)], [0, 6, 25, 31, 42, 50, 58, 71, 80]))
    assert not rises_steadily(lumpy, rate)
    assert rises_step_by_step(lumpy, rate)
    # a warm-up's jumps seen between flat points: 3 of 8 steps rise (the rest under 2.5 B)
    jumps = list(zip([15.0 * i for i in range(9)], [0, 0, 1, 30, 30, 31, 55, 55, 80]))
    assert not rises_step_by_step(jumps, rate)
    # every step rises, but one carries 3 x the mean step: a jump among the lumps
    one_jump = list(zip([15.0 * i for i in range(9)], [0, 5, 10, 15, 20, 50, 60, 70, 80]))
    assert not rises_step_by_step(one_jump, rate)


def test_a_load_that_rose_and_fell_beside_the_floor_is_told_apart_from_its_growth():
    # a floor less the tokens held rising 1 MB/s while the requests in flight beside it (each
    # holding 2 MB of activations) climb from 4 to 18 and drop back to 12: on the newest 9
    # points (1.34 MB/s by least squares), fitted beside them, the rate is the growth's
    loads = [4] * 8 + [10, 12, 14, 16, 18, 12]
    apart = FastGrowth()
    for i, n in enumerate(loads):
        apart.add(10.0 * i, 10**9 + MB * 10 * i + 2 * MB * n, 0, n)
    assert round(rate_interval(list(apart.points)[-9:]).slope / MB, 2) == 1.34
    rate = apart.established(1.0, 10**9, -1e4, 1e9)
    assert (rate.points, rate.slope) == (9, pytest.approx(MB))
    # requests that only climbed with the time leave the two unknown apart
    with_time = FastGrowth()
    for i in range(14):
        with_time.add(10.0 * i, 10**9 + MB * 10 * i + 2 * MB * (4 + 2 * i), 0, 4 + 2 * i)
    assert with_time.established(1.0, 10**9, -1e4, 1e9) is None
    # the same climb and drop where the first points had no tokens taken off: not fitted
    unread = FastGrowth()
    for i, n in enumerate(loads):
        unread.add(10.0 * i, 10**9 + MB * 10 * i + 2 * MB * n, 0, NO_WORK if i < 9 else n)
    assert unread.established(1.0, 10**9, -1e4, 1e9) is None


def test_the_wandering_before_an_early_stretch_is_read_from_the_first_request():
    # weights loading (no request in flight), then serving: read from the first request, also
    # where fewer than 6 points remain (the loading's step read as wandering hid the first
    # minutes' growth under gigabytes of noise)
    loads = [(float(i), 0) for i in range(4)] + [(float(i), 2) for i in range(4, 12)]
    assert since_serving(loads, 0, 12) == 4
    assert since_serving(loads, 0, 9) == 4  # only 5 points after it: no wandering read
    assert since_serving([(float(i), 0) for i in range(12)], 0, 12) == 0  # never served


def test_a_stretch_of_exact_floors_takes_its_wandering_from_exact_floors_only():
    # 20 exact floors flat at 10 MB, 10 floors estimated with requests in flight at 90 MB (what
    # they hold not yet known), then 2 min of exact floors rising 0.5 MB/s (full in 33 min):
    # read on all 30 points before it the wandering is ~60 MB, and a 60 MB rise hides in it;
    # read on the exact ones, none: growth on the 13 points 5 % of its time to fill spans
    values = [10 * MB] * 20 + [90 * MB] * 10 + [10 * MB + 5 * MB * k for k in range(1, 14)]
    loads = [0] * 20 + [3] * 10 + [0] * 13
    rate = _fed(values, loads).established(1.0, 10**9, -1e4, 1e9)
    assert (rate.points, rate.span_s, rate.slope) == (13, 120.0, pytest.approx(0.5 * MB))


def _idle(values, total):
    return [Sample(float(i), 0, Phase.IDLE, allocated_bytes=v, device_total_bytes=total)
            for i, v in enumerate(values)]


def test_growth_that_fills_the_device_in_an_hour_is_named_in_minutes_with_its_time_to_oom():
    # 1 GB flat for 20 min, then +2 MB/s on 8 GB (full in 52 min): floor windows of 60 s, so
    # at 1500 s, 5 min after it began, the newest 6 floor points are the last flat one and 5
    # of the rise: their least squares, diluted by the flat point, would fill the headroom in
    # just over the hour, but their interval holds a fill within it; read since the knee
    d = LeakDetector()
    first = next(v for s in _idle([10**9 + 2 * MB * max(0, t - 1200) for t in range(2400)],
                                  8 * 10**9) if (v := d.update(s)) is not None and v.detected)
    assert (first.first_detected_ts_s, first.start_ts_s) == (1500.0, 1200.0)
    assert first.slope_bytes_per_s == pytest.approx(2 * MB)
    assert first.time_to_oom_s == pytest.approx(3200.0)  # 8 GB - the 1.6 GB peak, at 2 MB/s
    assert first.evidence.startswith("leak (growth): the floor rises 6866.5 MiB/h")
    assert "over its last 4 min (5 points); full in about 53 min (46 min – 63 min)" \
        in first.evidence


def test_a_no_leak_answer_waits_while_the_interval_still_reaches_the_minimum_slope():
    # a floor that wanders +-40 MB in runs of 8 min over 20 min on 8 GB (the minimum slope
    # 20 MB/h): the test finds no rise, but the interval's top is above the minimum
    d = LeakDetector()
    values = [10**9 + (40 * MB if (t // 480) % 2 else 0) for t in range(1800)]
    for s in _idle(values, 8 * 10**9):
        d.update(s)
    r = d.result
    assert r.state == "insufficient_data"
    assert r.evidence.startswith("not enough data yet: the floor's rate ")
    assert "more of floor at this noise" in r.evidence
    assert r.rate_high_bytes_per_s > 20 * MB / 3600


def test_an_orphan_count_is_not_a_rate():
    d = LeakDetector()
    d.update(Sample(0.0, 0, allocated_bytes=1))
    r = d.on_event(Event(1.0, "kv_orphaned_blocks", data={"blocks": 3}))
    assert r is not None and r.detected and r.time_to_oom_s is None


GIB = 2**30


def _pair(until_s, oom_at_s=None):
    """pid 1 grows 60 MiB/s from 300 s on a device of 80 GiB beside pid 2 at a flat 10 GiB (no
    requests: 60 s floor windows); NVML sees both. pid 1's OOM, if any, at ``oom_at_s``."""
    out = []
    for t in range(until_s):
        a1 = 10 * GIB + max(0, t - 300) * 60 * 2**20
        ooms = 1 if oom_at_s is not None and t >= oom_at_s else 0
        out += [Sample(float(t), 0, Phase.DECODE, pid=1, allocated_bytes=a1, reserved_bytes=a1,
                       device_total_bytes=80 * GIB, num_ooms=ooms),
                Sample(t + 0.1, 0, Phase.DECODE, pid=2, allocated_bytes=10 * GIB,
                       reserved_bytes=10 * GIB, device_total_bytes=80 * GIB),
                Sample(t + 0.2, 0, device_used_bytes=a1 + 11 * GIB, device_total_bytes=80 * GIB)]
    return out


def test_the_grower_is_named_with_its_time_to_oom_and_its_neighbour_is_at_risk_from_it():
    from vramscope.agent.alerts.engine import AlertEngine

    e = AlertEngine.from_config(None)
    fired = [c for c in e.feed(_pair(1000)) if c.kind == "fired"]
    assert [(c.rule, c.ts_s) for c in fired] == [
        ("memory_leak", 600.0), ("oom_risk", 616.0), ("oom_risk_critical", 949.0)]
    # read since the onset (the knee of the stretch): 60 MiB/s exactly, its interval widened
    # to the model's error (15 % either side); 52.4 GiB left
    assert fired[0].message.endswith(
        "210.94 GiB/h (179.30 GiB/h to 242.58 GiB/h), 263.67 % of the limit per hour "
        "since 1970-01-01T00:05:00.000Z, over 4.0 min of floor (leak); full in about 14.9 min "
        "(13.0 min to 17.5 min) [pid 1]")
    assert "likely growth;" in fired[1].message  # pid 1's own growth: its time to OOM
    victim = [v for v in e.verdicts.history if v.pid == 2 and v.risk_level != "ok"]
    # pid 2's demand holds pid 1's growth (NVML's used less its own reserved): its peaks'
    # fast route warns it at 660.1 s, from pid 1's growth
    assert (victim[0].ts_s, victim[0].risk_level, victim[0].risk_cause) == (
        660.1, "warning", "growth")
    # its rows say whose growth (RiskModel.at_risk_from); the grower's own say no one's
    assert [(v.ts_s, v.risk_at_risk_from_pid) for v in victim] == [(660.1, 1), (949.1, 1)]
    assert {v.risk_at_risk_from_pid for v in e.verdicts.history if v.pid == 1} == {None}
    assert all(v.leak_state != "leak" for v in e.verdicts.history if v.pid == 2)
    d = e.devices[0]
    from vramscope.agent.alerts.explain import risk_text
    assert "; likely growth (at risk from pid 1's growth); " in risk_text(
        d.risks[2].last, d.risks[2], d.leaks[2], "pid 2")


def test_a_victims_rows_follow_the_growth_it_is_at_risk_from():
    """pid 1 and pid 2 as in ``_pair``, and pid 3 from 5 GiB growing 120 MiB/s from 420 s:
    pid 3's leak is named first (540.15 s), pid 1's later (600 s), and the victim's row says
    whose growth at each (the one the engine names: the soonest to fill), a new row at once
    where only that changed (the level and the cause stay). 640 s: 70 GiB of 80 used."""
    from vramscope.agent.alerts.engine import AlertEngine

    out = []
    for t in range(640):
        a1 = 10 * GIB + max(0, t - 300) * 60 * 2**20
        a3 = 5 * GIB + max(0, t - 420) * 120 * 2**20
        out += [Sample(float(t), 0, Phase.DECODE, pid=1, allocated_bytes=a1, reserved_bytes=a1,
                       device_total_bytes=80 * GIB),
                Sample(t + 0.1, 0, Phase.DECODE, pid=2, allocated_bytes=10 * GIB,
                       reserved_bytes=10 * GIB, device_total_bytes=80 * GIB),
                Sample(t + 0.15, 0, Phase.DECODE, pid=3, allocated_bytes=a3, reserved_bytes=a3,
                       device_total_bytes=80 * GIB),
                Sample(t + 0.2, 0, device_used_bytes=a1 + a3 + 11 * GIB,
                       device_total_bytes=80 * GIB)]
    e = AlertEngine.from_config(None)
    e.feed(out)
    rows = [(v.ts_s, v.pid, v.leak_state, v.risk_level, v.risk_cause, v.risk_at_risk_from_pid)
            for v in e.verdicts.history if v.ts_s > 500]
    assert rows == [
        (510.0, 1, "insufficient_data", "critical", "batch", None),
        (510.1, 2, "insufficient_data", "critical", "batch", None),
        (510.15, 3, "insufficient_data", "critical", "growth", None),
        (540.15, 3, "leak", "critical", "growth", None),
        # pid 1 grows too, but no leak of its own is named yet: at risk from pid 3's growth
        (550.0, 1, "insufficient_data", "critical", "growth", 3),
        (550.1, 2, "insufficient_data", "critical", "growth", 3),
        (600.0, 1, "leak", "critical", "growth", None),  # its own leak is its answer
        (600.1, 2, "insufficient_data", "critical", "growth", 1)]


def test_a_process_is_at_risk_from_anothers_growth_only_where_it_does_not_grow_itself():
    from vramscope.agent.analysis.risk_model import RiskModel

    m = RiskModel()
    assert m.at_risk_from("growth", leaking=False) is None  # no other process grows
    m.grower = 7
    assert m.at_risk_from("growth", leaking=False) == 7
    assert m.at_risk_from("batch", leaking=False) is None  # a cause of its own
    assert m.at_risk_from(None, leaking=False) is None
    assert m.at_risk_from("growth", leaking=True) is None  # its own leak is the answer
    m.growth = (1e6, 5e5, 2e6)  # its own growth is the forecast
    assert m.at_risk_from("growth", leaking=False) is None


def test_an_oom_ends_the_risk_of_the_process_it_killed():
    from vramscope.agent.alerts.engine import AlertEngine

    e = AlertEngine.from_config(None)
    e.feed(_pair(951, oom_at_s=950))  # pid 1's OOM at 950 s, its last sample
    rows = [v for v in e.verdicts.history if v.pid == 1]
    assert rows[-2].risk_level == "critical"
    assert (rows[-1].ts_s, rows[-1].risk_level, rows[-1].time_to_oom_s) == (950.0, "ok", None)
    # the leak that killed it stays its answer (history, not "no leak"), marked as ended
    leak = e.devices[0].leaks[1].result
    assert leak.state == "leak"
    assert leak.evidence.endswith("; the growth ended with the OOM at 1970-01-01T00:15:50.000Z")
    # its forecast came true: none is left on it (no "full in about 0 s")
    assert (leak.time_to_oom_s, leak.time_to_oom_low_s, leak.time_to_oom_high_s) == (
        None, None, None)
    assert "full in" not in leak.evidence
    # and when it was first named stays (the Leaks page's "first detected" of the dead grower)
    named = next(v.leak_first_detected_ts_s for v in rows if v.leak_state == "leak")
    assert leak.first_detected_ts_s == named == rows[-1].leak_first_detected_ts_s


def _wandering(onset_s: float, minutes: int = 170):
    # an idle floor of 1 GB on 8 GB that steps 6 MiB up and down every 4 min; from onset_s
    # on it also rises 1 %/h of the limit (80 MB/h, four times the minimum slope)
    d = LeakDetector()
    for t in range(0, minutes * 60, 2):
        grow = max(0, t - onset_s) * 0.01 * 8 * 10**9 / 3600
        d.update(Sample(float(t), 0, Phase.IDLE, device_total_bytes=8 * 10**9,
                        allocated_bytes=int(10**9 + grow + (6 * MB if (t // 240) % 2 else 0))))
    return d.result


def test_no_leak_needs_every_recent_stretch_below_the_minimum_too():
    # a flat wandering floor: no leak over the two-hour horizon and over each of its recent
    # stretches (the last 15, 30 and 60 min)
    assert _wandering(math.inf).state == "no_leak"
    # the same floor rising for its last 20 min: diluted in the horizon's flat 100 min, the
    # whole fit's top is below the minimum; its last 15 min are above it, so no answer yet
    r = _wandering(150 * 60.0)
    assert r.state == "insufficient_data"
    assert r.evidence.startswith(
        "not enough data yet: the floor's rate over the last 15 min 74.9 MiB/h (58.4 MiB/h to "
        "91.5 MiB/h, 90 %) is above the minimum 19.1 MiB/h: a rise too recent for the leak "
        "tests (the test so far: no leak")
    # rising for its last 10 min: the last 15 min cannot tell yet, and say how long to wait
    r = _wandering(160 * 60.0)
    assert r.state == "insufficient_data"
    assert r.evidence.startswith(
        "not enough data yet: the floor's rate over the last 15 min 21.3 MiB/h (2.0 MiB/h to "
        "40.6 MiB/h, 90 %) is not yet below the minimum 19.1 MiB/h; about 48 min more of "
        "floor at this noise")


def test_no_leak_is_not_kept_while_the_floor_goes_unseen():
    # a flat idle floor for 170 min (no leak), then a request that never ends (busy without a
    # break): once no floor has been read for two floor windows, "no leak" is no longer an
    # answer about now (a 5 %/h leak begun since would hold 0.1 % of the limit in 72 s)
    d = LeakDetector()
    for t in range(0, 170 * 60, 2):
        d.update(Sample(float(t), 0, Phase.IDLE, device_total_bytes=8 * 10**9,
                        allocated_bytes=10**9 + (6 * MB if (t // 240) % 2 else 0)))
    assert d.result.state == "no_leak"
    d.on_event(Event(170 * 60.0, "request_start", request_id="r"))
    changed = []
    for t in range(170 * 60, 190 * 60, 2):
        r = d.update(Sample(float(t), 0, Phase.DECODE, device_total_bytes=8 * 10**9,
                            allocated_bytes=2 * 10**9 + (t % 60) * MB))
        if r is not None:
            changed.append((t, r.state))
    # the newest floor read (a fine floor window's idle least, at 10,186 s) over 2 min old at
    # 10,308 s: one change, kept
    assert changed == [(10308, "insufficient_data")]
    assert d.result.evidence.startswith(
        "not enough data yet: no floor read for over 2 min (busy since); the last answer: "
        "no leak (")


def test_no_leak_waits_for_a_newest_floor_above_the_line_of_those_before():
    # the wandering floor, rising 10 %/h of the limit for its last 4 min: the trend's points
    # (a rolling least of five) have not risen yet, the newest idle floor has, beyond the
    # wandering of the idle floors of the last 40 min
    d = LeakDetector()
    states = {}
    for t in range(0, 180 * 60, 2):
        grow = max(0, t - 176 * 60) * 0.10 * 8 * 10**9 / 3600
        r = d.update(Sample(float(t), 0, Phase.IDLE, device_total_bytes=8 * 10**9,
                            allocated_bytes=int(10**9 + grow + (6 * MB if (t // 240) % 2 else 0))))
        if r is not None and t >= 174 * 60:
            states[t // 60] = r.state
    # the floor's own 6 MiB steps are within its wandering; a fine floor read 16.1 MiB above
    # the line 1.5 min into the rise is not: the trend's no_leak is held back at once (10,650
    # s), and stays held until the trend has had 15 min of points after that read
    assert states == {175: "no_leak", 177: "insufficient_data", 179: "insufficient_data"}
    assert d.result.evidence.startswith(
        "not enough data yet: a floor read 16.1 MiB above the line of those before it, "
        "a rise too recent to test; the last answer: no leak (")


def test_no_leak_waits_while_the_floor_holds_what_a_leak_added():
    # a leak of 4 %/h of the limit for 30 min (from 60 min on), then a flat floor for hours: a
    # leak that grows only under load rests through quiet hours. Once the horizon (2 h) is flat
    # the routes say no leak; that waits while the floor still holds over half of what the
    # leak answers added, for at most 6 h after the last one (HELD_CAP_S)
    d = LeakDetector()
    changes, last, held = [], None, None
    for t in range(0, 10 * 3600, 5):
        grow = min(max(0, t - 3600), 1800) * 0.04 * 8 * 10**9 / 3600
        r = d.update(Sample(float(t), 0, Phase.IDLE, device_total_bytes=8 * 10**9,
                            allocated_bytes=int(10**9 + grow + (6 * MB if (t // 240) % 2 else 0))))
        doubt = d._doubted[0] if d._doubted and d._doubted[1] is r else None
        now = None if r is None else (r.state, doubt)
        if now is not None and now != last:
            changes.append((t // 60, *now))
            last = now
        if doubt == "held" and held is None:
            held = r.evidence
    assert changes == [
        (6, "insufficient_data", None), (21, "no_leak", None),
        (63, "insufficient_data", "above"),  # 3 min into the rise
        (67, "insufficient_data", None),  # the routes' own: not yet a leak, nor none
        (74, "leak", None),
        (179, "insufficient_data", None),  # the horizon's line flattening
        (205, "insufficient_data", "held"),  # the routes' no_leak, held back
        (537, "no_leak", None)]  # 6 h after the last leak answer
    assert held is not None and held.startswith(
        "not enough data yet: the floor still holds 152.6 MiB of the 196.6 MiB the leak added "
        "(a leak answered 28 min ago): a leak that grows only under load rests when the load "
        "does; the last answer: no leak (")
