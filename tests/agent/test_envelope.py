"""The lower envelope of a never-idle process (agent/analysis/envelope.py) and the rate fitted
beside the load and the requests' ages (growth.rate_interval_beside) that the fast route reads
it with (fast_growth.ENVELOPE)."""

import random

import pytest
from vramscope.agent.analysis.envelope import EnvelopePoint, EnvelopeTracker
from vramscope.agent.analysis.growth import rate_interval, rate_interval_beside
from vramscope.agent.analysis.leaks import LeakDetector, LeakResult
from vramscope.agent.records import Event, Phase, Sample

MB = 10**6


def _start(ts: float, rid: str | None) -> Event:
    return Event(ts_s=ts, name="request_start", pid=1, request_id=rid)


def _end(ts: float, rid: str | None) -> Event:
    return Event(ts_s=ts, name="request_end", pid=1, request_id=rid)


def test_a_window_gives_its_least_memory_with_the_requests_and_their_ages_then():
    env = EnvelopeTracker(15.0)
    env.on_event(_start(1.0, "a"))
    env.on_event(_start(4.0, "b"))
    assert env.update(Sample(ts_s=5.0, pid=1, allocated_bytes=900)) is None
    assert env.update(Sample(ts_s=10.0, pid=1, allocated_bytes=800)) is None  # the least
    env.on_event(_end(12.0, "a"))
    assert env.update(Sample(ts_s=13.0, pid=1, allocated_bytes=850)) is None
    # the window [0, 15) closes at the first sample after it: at 10 s, a is 9 s old, b 6 s
    assert env.update(Sample(ts_s=16.0, pid=1, allocated_bytes=870)) \
        == EnvelopePoint(15.0, 800, 2, 15.0, False)
    env.on_event(_end(20.0, "b"))
    env.update(Sample(ts_s=21.0, pid=1, allocated_bytes=700))  # a moment with none in flight
    assert env.update(Sample(ts_s=31.0, pid=1, allocated_bytes=700)) \
        == EnvelopePoint(30.0, 700, 0, 0.0, True)


def test_requests_without_an_id_count_in_flight_with_no_age():
    env = EnvelopeTracker(15.0)
    env.on_event(_start(1.0, None))
    env.on_event(_start(2.0, "a"))
    env.update(Sample(ts_s=3.0, pid=1, allocated_bytes=500))
    env.on_event(_end(4.0, None))
    assert env.in_flight == 1
    assert env.update(Sample(ts_s=15.0, pid=1, allocated_bytes=600)) \
        == EnvelopePoint(15.0, 500, 2, 1.0, False)
    assert env.update(Sample(ts_s=16.0, allocated_bytes=None)) is None  # no memory, no point


# 20 points 15 s apart: a weights' 1 GB, 4-6 requests of mixed ages (their ages' sum wanders,
# it does not climb), each holding 50 MB and 1 MB per second of its age
LOADS = [4, 5, 6, 5, 4, 4, 5, 6, 6, 5, 4, 5, 6, 5, 4, 4, 5, 6, 5, 4]
AGES = [150.0, 210.0, 260.0, 190.0, 140.0, 170.0, 230.0, 280.0, 240.0, 180.0,
        150.0, 220.0, 270.0, 200.0, 140.0, 160.0, 220.0, 290.0, 210.0, 150.0]


def _memory(growth_per_s: float, ages: list[float]) -> list[tuple[float, float]]:
    return [(15.0 * i, 10**9 + growth_per_s * 15.0 * i + 50 * MB * n + MB * a)
            for i, (n, a) in enumerate(zip(LOADS, ages))]


def test_fitted_beside_the_load_and_ages_only_growth_is_left_in_the_rate():
    points = _memory(2 * MB, AGES)
    rate = rate_interval_beside(points, [LOADS, AGES])
    assert rate is not None
    assert rate.slope == pytest.approx(2 * MB)
    assert rate.high - rate.low == pytest.approx(0.0, abs=1e-3)  # the fit is exact
    # the plain line over the same points reads the load's wandering as noise about it
    plain = rate_interval(points)
    assert plain is not None and plain.high - plain.low > 0.5 * MB


def test_requests_that_aged_with_the_time_alone_leave_no_rate():
    # a burst after an idle moment: the same 5 requests, all young, aging together; their
    # caches fill as they decode, which the time alone cannot be told from
    ages = [5 * 15.0 * i for i in range(20)]
    points = [(15.0 * i, 10**9 + 50 * MB * 5 + MB * a) for i, a in enumerate(ages)]
    assert rate_interval_beside(points, [[5] * 20, ages]) is None
    # fitted without the ages the same points read as growth of 5 MB/s
    alone = rate_interval(points)
    assert alone is not None and alone.slope == pytest.approx(5 * MB)


def test_covariates_that_never_varied_are_left_out_and_each_needs_a_value_per_point():
    points = [(15.0 * i, 10**9 + 3 * MB * 15.0 * i) for i in range(10)]
    assert rate_interval_beside(points, [[4] * 10, [100.0] * 10]) == rate_interval(points)
    with pytest.raises(ValueError, match="one value per point"):
        rate_interval_beside(points, [[4] * 9])


def _never_idle(growth_from_s: float, growth_per_s: float, until_s: float) -> list:
    """A never-idle server without KV figures: a request every 10 s living 50-70 s (5-7 in
    flight, of mixed ages), each holding 200 MB and 20 MB per second of its age; 20 GB of
    weights on an 80 GB device; growth of ``growth_per_s`` from ``growth_from_s``."""
    rnd = random.Random(1)
    starts = [(10.0 * i, 10.0 * i + rnd.uniform(50, 70), f"r{i}")
              for i in range(int(until_s / 10))]
    recs: list = []
    for began, ended, rid in starts:
        recs.append(Event(ts_s=began, name="request_start", pid=1, request_id=rid))
        recs.append(Event(ts_s=ended, name="request_end", pid=1, request_id=rid))
    for k in range(int(until_s / 2)):
        ts = 2.0 * k + 1.0
        held = sum(200 * MB + 20 * MB * (ts - a) for a, b, _ in starts if a <= ts < b)
        grown = growth_per_s * max(0.0, ts - growth_from_s)
        recs.append(Sample(ts, 0, Phase.DECODE, pid=1, allocated_bytes=int(20e9 + held + grown),
                           device_total_bytes=80 * 10**9))
    return sorted(recs, key=lambda r: r.ts_s)


def _first_leak(records: list) -> tuple[LeakDetector, LeakResult | None]:
    d = LeakDetector()
    for r in records:
        v = d.on_event(r) if isinstance(r, Event) else d.update(r)
        if v is not None and v.detected:
            return d, v
    return d, None


def test_growth_under_a_never_idle_load_is_named_on_the_envelope_in_minutes():
    # 50 MB/s from 30 min in (the device full in about 14 min): named 135 s after its onset,
    # on the lower envelope, its rate fitted beside the requests and their ages
    d, first = _first_leak(_never_idle(1800.0, 50 * MB, 3000.0))
    assert first is not None and d._fast_on is d.fast_envelope
    assert first.first_detected_ts_s == 1935.0
    assert first.evidence.startswith("leak (growth): the floor rises 192.1 GiB/h "
                                     "(150.3 GiB/h to 233.8 GiB/h, 90 %)")
    assert "full in about 14 min (11 min – 17 min)" in first.evidence
    # the same server without the growth: its requests' waves are never a leak
    assert _first_leak(_never_idle(1800.0, 0.0, 3000.0))[1] is None
