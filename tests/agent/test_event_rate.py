"""The request rate of a window (``event_rate.request_rate``) on SQLite and a real PostgreSQL:
counts retention made for the rolled-up minutes, raw events after them, the same rate before
and after retention deleted the events."""

from __future__ import annotations

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.records import Event, Phase, Sample
from vramscope.agent.retention import Retention
from vramscope.agent.store import Store
from vramscope.agent.store.event_rate import request_rate

T0 = 1_700_000_400.0  # a ten-minute boundary


def test_the_rate_reads_the_counts_then_the_raw_events_and_outlives_them(any_url):
    # one sample and one request a minute for 30 minutes, three more in minute 12; device 1
    # has samples but no request
    samples = [Sample(T0 + 60 * m + 5, d, Phase.DECODE, "torch", 1, allocated_bytes=m)
               for m in range(30) for d in (0, 1)]
    starts = [T0 + 60 * m + 30 for m in range(30)] + [T0 + 720 + t for t in (1, 2, 3)]
    events = [Event(t, "request_start", 0, 1) for t in starts]
    events += [Event(t + 1, "request_end", 0, 1) for t in starts]  # not counted as a start
    with Store.open(any_url, host_name="h") as store:
        store.write(samples, events)
        clock = FakeClock(T0 + 30 * 60)
        retention = Retention(raw_s=10 * 60, rollup_s=86_400, step_rows=1000, clock=clock,
                              minutes_per_step=20)
        retention.step(store)  # minutes 0-19 rolled up (and counted): the rest is raw
        before = request_rate(store, 0, "h", T0 + 17, T0 + 30 * 60, 300.0)
        assert before.bucket_s == 300.0 and before.ts == [T0 + 300 * i for i in range(6)]
        # five a bucket, eight in the bucket of minute 12; a minute's five requests / 5 min
        assert before.per_min == [1.0, 1.0, 1.6, 1.0, 1.0, 1.0]
        retention.step(store)  # deletes the events of minutes 0-19, past 10 minutes old
        assert [e.ts_s for e in store.events(0, names=("request_start",))][0] == T0 + 1230
        assert request_rate(store, 0, "h", T0 + 17, T0 + 30 * 60, 300.0) == before
        # buckets finer than a minute: a minute each
        fine = request_rate(store, 0, "h", T0 + 700, T0 + 800, 0.05)
        assert (fine.bucket_s, fine.ts, fine.per_min) == (
            60.0, [T0 + 660, T0 + 720, T0 + 780], [1.0, 4.0, 1.0])
        assert set(request_rate(store, 1, "h", T0, T0 + 1800, 600.0).per_min) == {0.0}
        assert request_rate(store, 7, "h", T0, T0 + 600, 600.0).per_min == [0.0]  # unknown
        with pytest.raises(ValueError, match="bad window: start .*, end .*, bucket_s 0"):
            request_rate(store, 0, "h", T0, T0 + 60, 0)


def test_a_device_with_requests_but_no_samples_keeps_its_rate_after_the_events_go(any_url):
    # device 0 samples a minute for 30 minutes; device 2 never samples (its samples stopped
    # long ago, or never came) but starts two requests a minute: retention counts them with
    # device 0's minutes and deletes them once counted
    samples = [Sample(T0 + 60 * m + 5, 0, Phase.DECODE, "torch", 1, allocated_bytes=m)
               for m in range(30)]
    events = [Event(T0 + 60 * m + s, "request_start", 2, 1) for m in range(30) for s in (10, 40)]
    with Store.open(any_url, host_name="h") as store:
        store.write(samples, events)
        retention = Retention(raw_s=10 * 60, rollup_s=86_400, step_rows=1000,
                              clock=FakeClock(T0 + 30 * 60), minutes_per_step=20)
        retention.step(store)  # minutes 0-19 rolled up, counted, and their events deleted
        assert [e.ts_s for e in store.events(2, names=("request_start",))][0] == T0 + 1210
        rate = request_rate(store, 2, "h", T0, T0 + 30 * 60, 600.0)
        assert (rate.ts, rate.per_min) == ([T0, T0 + 600, T0 + 1200], [2.0, 2.0, 2.0])
        retention.step(store)  # nothing more due: the same
        assert request_rate(store, 2, "h", T0, T0 + 30 * 60, 600.0) == rate
