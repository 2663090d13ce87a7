"""The per-second tier: its packing, and retention keeping each tier for its own horizon."""

from __future__ import annotations

import pytest
from sqlalchemy import delete, func, select
from vramscope.agent.clock import FakeClock
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS, Event, Phase, Sample
from vramscope.agent.retention import Retention
from vramscope.agent.store import maintenance
from vramscope.agent.store import seconds as tier
from vramscope.agent.store.schema import seconds as seconds_table

from tests.support.rollup_rows import read_rollups

T0 = 1_700_000_040.0  # a minute boundary
ALLOC = SAMPLE_COUNTER_FIELDS.index("allocated_bytes")
ACTIVE = SAMPLE_COUNTER_FIELDS.index("active_bytes")
USED = SAMPLE_COUNTER_FIELDS.index("device_used_bytes")


def _torch(t: float, allocated: int, phase: Phase = Phase.DECODE, device: int = 0) -> Sample:
    return Sample(T0 + t, device, phase, "torch", 7, allocated_bytes=allocated,
                  reserved_bytes=allocated + 100, active_bytes=allocated + 1)


def _raw(samples: list[Sample]) -> list[tuple[object, ...]]:
    """Rows as retention reads them: (ts_s, phase, *counters)."""
    return [(s.ts_s, s.phase.value, *s[5:5 + len(SAMPLE_COUNTER_FIELDS)]) for s in samples]


# second 0: three samples; second 1: none; second 2: one, in prefill
SCRIPT = [_torch(0.0, 500), _torch(0.4, 300), _torch(0.8, 400), _torch(2.5, 900, Phase.PREFILL)]


def test_a_second_keeps_its_count_last_phase_and_min_max_last():
    first, third = tier.summarize(_raw(SCRIPT))
    assert (first.ts_s - T0, first.n_samples, first.phase) == (0.0, 3, Phase.DECODE)
    assert (first.low[ALLOC], first.high[ALLOC], first.last[ALLOC]) == (300, 500, 400)
    assert first.low[USED] is None  # not measured by this source
    assert (third.ts_s - T0, third.n_samples, third.phase) == (2.0, 1, Phase.PREFILL)


def test_packing_round_trips_what_is_kept_and_reports_last_for_the_rest():
    seconds = tier.summarize(_raw(SCRIPT))
    back = tier.unpack(T0, tier.pack(seconds))
    assert [s.ts_s - T0 for s in back] == [0.0, 2.0]  # the empty second stays absent
    first = back[0]
    assert (first.low[ALLOC], first.high[ALLOC], first.last[ALLOC]) == (300, 500, 400)
    # active_bytes keeps only its last value (KEPT): its min and max read as that value
    assert (first.low[ACTIVE], first.high[ACTIVE], first.last[ACTIVE]) == (401, 401, 401)
    assert back[1] == seconds[1]._replace(low=back[1].low)  # one sample: min = max = last
    assert first.sample(3, "min").allocated_bytes == 300
    assert first.sample(3, "max")[:4] == (T0, 3, Phase.DECODE, "seconds")


def test_columns_hold_what_the_seconds_hold():
    """``unpack_columns``: the second starts and, per counter asked for, its low, high and
    last series, as ``unpack``'s seconds hold them: kept statistics, last values where a
    statistic is not kept (active bytes), None where a counter was not measured (device used)."""
    seconds = tier.summarize(_raw(SCRIPT))
    blob = tier.pack(seconds)
    back = tier.unpack(T0, blob)
    fields = [ACTIVE, ALLOC, USED]
    ts, stats = tier.unpack_columns(T0, blob, fields)
    assert ts == [s.ts_s for s in back] == [T0, T0 + 2]
    assert stats == [([s.low[i] for s in back], [s.high[i] for s in back],
                      [s.last[i] for s in back]) for i in fields]
    assert stats[0] == ([401, 901], [401, 901], [401, 901])
    assert stats[1] == ([300, 900], [500, 900], [400, 900])
    assert stats[2] == ([None, None],) * 3
    with pytest.raises(ValueError, match="format"):
        tier.unpack_columns(T0, b"\x09" + blob[1:], fields)


def test_a_minute_compresses_to_a_small_blob():
    """600 samples of a busy minute (10 Hz, allocated moving every sample) fit in well under
    the page a SQLite row may keep in place."""
    samples = [_torch(i / 10, 2**34 + (i * 7919 % 1000) * 65536) for i in range(600)]
    blob = tier.pack(tier.summarize(_raw(samples)))
    assert len(blob) < 1_500
    assert [s.high[ALLOC] for s in tier.unpack(T0, blob)][:2] == [
        2**34 + max(i * 7919 % 1000 for i in range(10)) * 65536,
        2**34 + max(i * 7919 % 1000 for i in range(10, 20)) * 65536]


def test_bad_blobs_and_mixed_minutes_are_refused_with_the_minute():
    seconds = tier.summarize(_raw([_torch(59.5, 1), _torch(60.5, 2)]))
    with pytest.raises(ValueError, match=f"seconds outside the minute starting at {T0}"):
        tier.pack(seconds)
    with pytest.raises(ValueError, match=f"minute {T0}: format 9, expected 1"):
        tier.unpack(T0, b"\x09rest")
    with pytest.raises(ValueError, match="no seconds to pack"):
        tier.pack([])


@pytest.fixture
def store(any_url):
    from vramscope.agent.store import Store

    s = Store.open(any_url, host_name="testhost")
    s.write([_torch(t / 2, 1000 + 10 * t) for t in range(0, 8 * 60 * 2)])  # 8 min at 2 Hz
    s.write((), [Event(T0 + 1, "request_start", 0, request_id="r1"),
                    Event(T0 + 2, "oom", 0, data={"message": "CUDA out of memory"})])
    yield s
    s.close()


def _count(store, table) -> int:
    with store.engine.connect() as c:
        return int(c.execute(select(func.count()).select_from(table)).scalar())


def test_each_tier_is_kept_for_its_own_horizon(store):
    clock = FakeClock(T0 + 10 * 60)  # minutes 0-7 are past the 120 s grace
    r = Retention(raw_s=300, second_s=3600, rollup_s=86_400, step_rows=10_000, clock=clock,
                  minutes_per_step=8)
    first = r.step(store)
    assert first.rolled_up_minutes == 8
    assert _count(store, seconds_table) == 8  # one row per device, source and minute
    assert first.deleted["samples"] == 5 * 60 * 2  # older than 300 s and rolled up
    assert first.deleted["events"] == 1  # the request; the OOM stays with the rollups
    # what the raw samples said, the tier still says: second 30 had samples 1600 and 1610
    (source, second), = store.seconds(0, T0 + 30, T0 + 31)
    assert (source, second.n_samples, second.low[ALLOC], second.high[ALLOC]) == (
        "torch", 2, 1600, 1610)
    assert [e.name for e in store.events(0, T0, T0 + 600)] == ["oom"]
    # the phases alone, as columns: seconds 30 to 89 of the window [T0 + 30.5, T0 + 90), cut
    # from two minute rows
    rows = store.seconds_phases(0, T0 + 30.5, T0 + 90)
    assert [(row.source, row.starts[0] - T0, row.starts[-1] - T0, sum(row.counts))
            for row in rows] == [("torch", 31.0, 59.0, 2 * 29), ("torch", 60.0, 89.0, 2 * 30)]
    assert {p for row in rows for p in row.phases} == {"decode"}

    clock.advance(3600)  # the seconds pass their horizon a few minutes a step; rollups stay
    assert sum(r.step(store).deleted["seconds"] for _ in range(4)) == 8
    assert _count(store, seconds_table) == 0
    assert len(read_rollups(store)) == 8 * 3  # allocated, reserved, active
    assert store.time_range(0) == (T0, T0 + 480.0)  # the rollups, from first to last minute


def test_a_store_from_before_the_tier_rolls_its_raw_samples_up_again_before_deleting(store):
    """Upgraded from 0004: minute rollups, no seconds. The watermark starts at the first raw
    sample, so nothing raw is deleted before its seconds exist."""
    maintenance.rollup_window(store, T0, T0 + 8 * 60)
    with store.engine.begin() as c:
        c.execute(delete(seconds_table))
    clock = FakeClock(T0 + 10 * 60)
    r = Retention(raw_s=60, second_s=3600, rollup_s=86_400, step_rows=10_000, clock=clock,
                  minutes_per_step=2)
    first = r.step(store)
    assert (first.rolled_up_minutes, first.backlog) == (2, True)
    assert first.deleted["samples"] == 2 * 60 * 2  # only the two minutes with their seconds
    while r.step(store).backlog:
        pass
    assert _count(store, seconds_table) == 8
    assert store.samples(0) == []  # all older than 60 s, and all rolled up now


def test_phases_alone_are_unpacked_as_columns():
    blob = tier.pack(tier.summarize(_raw(SCRIPT)))
    starts, counts, phases = tier.unpack_phases(T0, blob)
    assert ([t - T0 for t in starts], counts, phases) == ([0.0, 2.0], [3, 1], ["decode", "prefill"])
    assert phases == [s.phase.value for s in tier.unpack(T0, blob)]
