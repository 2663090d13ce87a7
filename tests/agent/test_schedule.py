"""The one drift-free scheduler (vramscope.agent.clock.Schedule), as the agent's loop and the
hooks' sampler use it."""

from __future__ import annotations

import pytest
from vramscope.agent.clock import FakeClock, Schedule
from vramscope.hooks.sampler import Sampler
from vramscope.hooks.sink import ListSink


def test_schedule_is_drift_free_and_skips_instead_of_bursting():
    s = Schedule(0.25, 0.0)
    assert [s.due(t) for t in (0.0, 0.1, 0.25, 0.3, 0.5)] == [True, False, True, False, True]
    assert s.next_s == 0.75
    assert s.due(1.6) and s.next_s == 1.75 and s.missed == 3  # 0.75, 1.0 ... 1.5 skipped: 3
    assert not s.due(1.7)


def test_a_float_quotient_one_short_still_lands_past_now():
    s = Schedule(0.1, 0.3)
    s.advance(0.05 + 0.07 + 0.08 + 5.0)  # 5.2 as a FakeClock sums it
    assert s.next_s > 5.2 and s.next_s == pytest.approx(5.3)


def test_advance_takes_the_interval_a_task_set_while_it_ran():
    s = Schedule(1.0, 10.0)
    assert s.is_due(10.0)
    s.advance(10.0, 60.0)  # e.g. the snapshot source backing off
    assert (s.next_s, s.interval_s, s.is_due(69.9), s.is_due(70.0)) == (70.0, 60.0, False, True)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_a_bad_interval_is_refused_with_its_value(bad):
    with pytest.raises(ValueError, match=rf"interval must be > 0 s, got {bad!r}"):
        Schedule(bad, 0.0)
    with pytest.raises(ValueError, match="interval must be > 0 s"):
        Schedule(1.0, 0.0).advance(1.0, bad)


def test_the_sampler_follows_a_task_that_changes_its_own_interval():
    clock = FakeClock()

    class BackingOff:
        """Reads at 1 s, then asks for 5 s after its second read."""

        interval_s = 1.0
        reads: list[float] = []

        def read(self):
            self.reads.append(clock.monotonic_s())
            if len(self.reads) == 2:
                self.interval_s = 5.0
            return None

    task = BackingOff()
    sampler = Sampler(ListSink(), [task], clock=clock)
    for _ in range(12):
        sampler.run_once()
        clock.advance(1.0)
    assert task.reads == [0.0, 1.0, 6.0, 11.0]
