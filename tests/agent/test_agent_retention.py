"""Retention: per-minute rollups (min, max, mean, last) and raw deletion in small steps."""

from __future__ import annotations

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.records import Phase, Sample
from vramscope.agent.retention import Retention

from tests.support.rollup_rows import read_rollups

T0 = 1_700_000_040.0  # a minute boundary (1_700_000_040 = 28_333_334 * 60)


def _s(t: float, used: int, device: int = 0, source: str = "nvml") -> Sample:
    return Sample(T0 + t, device, Phase.UNKNOWN, source, device_used_bytes=used,
                  device_total_bytes=100)


@pytest.fixture
def filled(any_url):
    """The same rows on SQLite and on a real PostgreSQL (the rollup reads the driver's cursor)."""
    from vramscope.agent.store import Store

    store = Store.open(any_url, host_name="testhost")
    store.write([_s(0, 10), _s(20, 30), _s(40, 20),  # minute 0
                 _s(60, 5), _s(61, 7, device=1),      # minute 1
                 _s(125, 50),                          # minute 2
                 _s(600, 1)])                          # minute 10, after a gap
    yield store
    store.close()


def _rows(store):
    return [(r["bucket_s"] - T0, r["device_id"], r["source"], r["metric"], r["min_value"],
             r["max_value"], r["mean_value"], r["last_value"], r["count"])
            for r in read_rollups(store)]


def test_rollups_are_min_max_mean_last_per_device_minute_source_metric(filled):
    clock = FakeClock(T0 + 5 * 60 + 30)  # grace 120 s: minutes 0-2 are complete
    result = Retention(raw_s=3600, rollup_s=86400, step_rows=100, clock=clock,
                       minutes_per_step=5).step(filled)
    assert (result.rolled_up_minutes, result.rollup_rows) == (3, 8)
    d0, d1 = filled.device_id(0), filled.device_id(1)
    assert _rows(filled) == [
        (0.0, d0, "nvml", "device_total_bytes", 100, 100, 100.0, 100, 3),
        (0.0, d0, "nvml", "device_used_bytes", 10, 30, 20.0, 20, 3),
        (60.0, d0, "nvml", "device_total_bytes", 100, 100, 100.0, 100, 1),
        (60.0, d0, "nvml", "device_used_bytes", 5, 5, 5.0, 5, 1),
        (60.0, d1, "nvml", "device_total_bytes", 100, 100, 100.0, 100, 1),
        (60.0, d1, "nvml", "device_used_bytes", 7, 7, 7.0, 7, 1),
        (120.0, d0, "nvml", "device_total_bytes", 100, 100, 100.0, 100, 1),
        (120.0, d0, "nvml", "device_used_bytes", 50, 50, 50.0, 50, 1),
    ]


def test_steps_are_small_resume_after_the_watermark_and_skip_gaps(filled):
    clock = FakeClock(T0 + 20 * 60)
    r = Retention(raw_s=3600, rollup_s=86400, step_rows=100, clock=clock, minutes_per_step=2)
    assert r.step(filled).rolled_up_minutes == 2  # minutes 0, 1
    assert {row[0] for row in _rows(filled)} == {0.0, 60.0}
    assert r.step(filled).rolled_up_minutes == 2  # minutes 2, 3
    assert r.step(filled).rolled_up_minutes == 2  # jumps the gap: minutes 10, 11
    assert {row[0] for row in _rows(filled)} == {0.0, 60.0, 120.0, 600.0}
    assert r.step(filled).rolled_up_minutes == 0  # nothing new: no work


def test_raw_samples_are_deleted_in_steps_only_once_old_and_rolled_up(filled):
    clock = FakeClock(T0 + 5 * 60 + 30)
    r = Retention(raw_s=60, rollup_s=86400, step_rows=2, clock=clock, minutes_per_step=5)
    first = r.step(filled)  # rolls up minutes 0-2, then deletes 2 of the 6 rows before minute 3
    assert first.deleted["samples"] == 2
    assert r.step(filled).deleted["samples"] == 2
    assert r.step(filled).deleted["samples"] == 2
    assert r.step(filled).deleted["samples"] == 0
    assert [s.ts_s - T0 for s in filled.samples(device=None)] == [600.0]
    assert len(_rows(filled)) == 8  # the rollups stay


def test_nothing_raw_is_deleted_before_it_is_rolled_up(filled):
    clock = FakeClock(T0 + 30)  # minute 0 not complete yet: no rollup, no deletion
    r = Retention(raw_s=60, rollup_s=86400, step_rows=100, clock=clock)
    assert r.step(filled).deleted["samples"] == 0
    assert len(filled.samples()) == 7


def test_old_rollups_are_deleted_a_few_minutes_at_a_time(filled):
    clock = FakeClock(T0 + 5 * 60 + 30)
    r = Retention(raw_s=3600, rollup_s=240, step_rows=100, clock=clock, minutes_per_step=5)
    first = r.step(filled)  # rolls up minutes 0-2, then drops those starting before now-240 s
    assert (first.rollup_rows, first.deleted["rollups"]) == (8, 6)
    assert {row[0] for row in _rows(filled)} == {120.0}
    clock.advance(60)
    assert r.step(filled).deleted["rollups"] == 2
    assert _rows(filled) == []


def test_bad_settings_are_refused_with_the_values():
    with pytest.raises(ValueError, match="raw_s=0, rollup_s=1, step_rows=1"):
        Retention(raw_s=0, rollup_s=1, step_rows=1)


def _minute_rows(store, minute_s: float, device: int = 0):
    d = store.device_id(device)
    return [(r["min_value"], r["max_value"], r["mean_value"], r["last_value"], r["count"])
            for r in read_rollups(store)
            if r["bucket_s"] == T0 + minute_s and r["device_id"] == d
            and r["metric"] == "device_used_bytes"]


def test_late_samples_get_their_rolled_up_minutes_rolled_up_again(filled):
    clock = FakeClock(T0 + 20 * 60)
    r = Retention(raw_s=3600, rollup_s=86400, step_rows=100, clock=clock, minutes_per_step=20)
    assert r.step(filled).rolled_up_minutes == 18  # up to now - grace: minutes 0-17
    assert _minute_rows(filled, 60) == [(5, 5, 5.0, 5, 1)]
    # a backlog lands after the database came back: minutes 1 and 2 are already rolled up
    late = [_s(70, 99), _s(130, 1)]
    filled.write(late)
    r.note_written(late)
    result = r.step(filled)
    assert (result.rolled_up_minutes, result.late_minutes, result.busy) == (0, 2, True)
    assert _minute_rows(filled, 60) == [(5, 99, 52.0, 99, 2)]
    assert _minute_rows(filled, 120) == [(1, 50, 25.5, 1, 2)]  # last: the sample at 130 s
    assert r.step(filled).late_minutes == 0  # done once


def test_live_samples_and_minutes_past_the_rollup_retention_are_not_redone(filled):
    clock = FakeClock(T0 + 20 * 60)
    r = Retention(raw_s=3600, rollup_s=600, step_rows=100, clock=clock, minutes_per_step=20)
    r.step(filled)
    fresh = [_s(20 * 60 - 30, 7)]  # within the grace: the regular path rolls it up later
    old = [_s(70, 99)]  # minute 1 is older than rollup_s: its rollups are being deleted
    filled.write(fresh + old)
    r.note_written(fresh + old)
    assert r.step(filled).late_minutes == 0
    assert _minute_rows(filled, 60) == []


def test_late_minutes_kept_are_bounded(filled, monkeypatch):
    import vramscope.agent.retention as retention_mod

    monkeypatch.setattr(retention_mod, "MAX_LATE_MINUTES", 2)
    r = Retention(raw_s=3600, rollup_s=86400, step_rows=100, clock=FakeClock(T0 + 20 * 60))
    r.note_written([_s(0, 1), _s(60, 1), _s(61, 1), _s(120, 1)])
    assert r.late_minutes_lost == 1


def test_backlog_only_when_a_budget_ran_out(filled):
    # The agent re-runs a step after 1 s only on a backlog: a step that deleted a few rows
    # (the steady state, every 30 s) is busy but has none.
    clock = FakeClock(T0 + 5 * 60 + 30)
    r = Retention(raw_s=60, rollup_s=86400, step_rows=2, clock=clock, minutes_per_step=5)
    steps = [r.step(filled) for _ in range(4)]
    assert [(s.deleted["samples"], s.busy, s.backlog) for s in steps] == [
        (2, True, True), (2, True, True), (2, True, True), (0, False, False)]
    r.close()  # a second agent after the first stopped (on PostgreSQL: it held the lock)
    relaxed = Retention(raw_s=60, rollup_s=86400, step_rows=100, clock=clock,
                        minutes_per_step=5)
    filled.write([_s(130, 3)])
    step = relaxed.step(filled)
    assert (step.busy, step.backlog) == (True, False)  # rolled up and deleted, within budget


def _counts(store):
    from sqlalchemy import select
    from vramscope.agent.store.schema import event_counts

    with store.engine.connect() as c:
        return [(r.minute_s - T0, r.device_id, r.name, r.count) for r in c.execute(
            select(event_counts).order_by(event_counts.c.device_id, event_counts.c.minute_s,
                                          event_counts.c.name))]


def test_the_frequent_events_are_counted_per_minute_before_they_are_deleted(filled):
    """Requests, KV block moves and phase changes go after raw_s; their counts per minute stay
    with the rollups. A rare event (an OOM) is neither counted nor deleted with them; a
    minute's events are deleted only once the minute is counted (the watermark)."""
    from vramscope.agent.records import Event

    e = [Event(T0 + t, name, 0, 7) for t, name in
         [(1, "request_start"), (2, "kv_alloc"), (30, "request_start"), (50, "request_end"),
          (59.9, "request_end"), (61, "request_start"), (62, "oom"), (130, "request_start"),
          (400, "request_start")]]
    filled.write([], e)
    clock = FakeClock(T0 + 5 * 60 + 30)  # grace 120 s: minutes 0-2 can be rolled up
    r = Retention(raw_s=60, rollup_s=86400, step_rows=100, clock=clock, minutes_per_step=2)
    first = r.step(filled)  # minutes 0 and 1 counted: their frequent events may go, not 2's
    d0 = filled.device_id(0)
    assert _counts(filled) == [(0.0, d0, "kv_alloc", 1), (0.0, d0, "request_end", 2),
                               (0.0, d0, "request_start", 2), (60.0, d0, "request_start", 1)]
    assert first.deleted["events"] == 6
    assert sorted(ev.ts_s - T0 for ev in filled.events(0)) == [62.0, 130.0, 400.0]
    r.step(filled)  # minute 2 counted, then its request deleted (past raw_s, under the cutoff)
    assert _counts(filled)[-1] == (120.0, d0, "request_start", 1)
    assert sorted(ev.ts_s - T0 for ev in filled.events(0)) == [62.0, 400.0]
    # a late request in minute 1 (written after the minute was counted) is counted again
    late = Event(T0 + 70, "request_end", 0, 7)
    filled.write([], [late])
    r.note_written([], [late])
    assert r.step(filled).late_minutes == 1
    assert (60.0, d0, "request_end", 1) in _counts(filled)
    # the counts go with the rollups, at rollup_s (another agent's, after the first stopped)
    r.close()
    old = Retention(raw_s=60, rollup_s=150, step_rows=100, clock=clock, minutes_per_step=2)
    old.step(filled)
    assert [row[0] for row in _counts(filled)] == [120.0]


def test_an_event_name_no_table_lists_goes_with_the_raw_samples(any_url):
    """A client's own event name is cheap (agent/event_kinds.py): deleted once older than
    raw_s, like a request, and not counted per minute; a listed kept name (an OOM, a
    server_load) stays with the rollups. No name's index range finds the unlisted ones, so
    retention walks the time index from the oldest event, UNLISTED_SCAN_S a step, and a step
    whose row budget ran out reads its stretch again."""
    from vramscope.agent.records import Event
    from vramscope.agent.retention import UNLISTED_SCAN_S as hour
    from vramscope.agent.store import Store

    # events only: no samples, so no rollup holds the raw cutoff back (now - raw_s)
    store = Store.open(any_url, host_name="testhost")
    e = [Event(T0 + t, name, 0, 7) for t, name in
         [(1, "my_custom_event"), (2, "oom"), (3, "my_custom_event"), (4, "another_one"),
          (5, "server_load"), (hour + 10, "my_custom_event"), (2 * hour + 10, "another_one"),
          (3 * hour, "my_custom_event")]]
    store.write([], e)
    try:
        _walk_the_unlisted(store)
    finally:
        store.close()


def _walk_the_unlisted(store) -> None:
    from vramscope.agent.retention import UNLISTED_SCAN_S

    hour = UNLISTED_SCAN_S
    # the raw cutoff at 1 h 30 s: the events of the first hour and 10 s are past it
    clock = FakeClock(T0 + 3 * hour + 60)
    r = Retention(raw_s=2 * hour + 30, rollup_s=86400, step_rows=2, clock=clock)
    left = lambda: sorted((ev.ts_s - T0, ev.name) for ev in store.events(0))  # noqa: E731
    first = r.step(store)  # the first hour from the oldest event: two of its three, the budget
    assert first.deleted["events"] == 2
    assert len(left()) == 6
    r.step(store)  # the same hour again: its last one; the walk moves on
    assert left() == [(2.0, "oom"), (5.0, "server_load"), (hour + 10, "my_custom_event"),
                      (2 * hour + 10, "another_one"), (3 * hour, "my_custom_event")]
    r.step(store)  # on up to the raw cutoff (1 h 30 s): the one at 1 h 10 s
    assert left() == [(2.0, "oom"), (5.0, "server_load"), (2 * hour + 10, "another_one"),
                      (3 * hour, "my_custom_event")]
    assert r.step(store).deleted["events"] == 0  # at the cutoff: nothing more until it moves
    clock.advance(hour)  # the cutoff at 2 h 30 s
    r.step(store)
    assert left() == [(2.0, "oom"), (5.0, "server_load"), (3 * hour, "my_custom_event")]
    assert _counts(store) == []  # unlisted: never counted per minute
    r.close()
