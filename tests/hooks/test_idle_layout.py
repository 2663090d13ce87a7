"""IdleLayoutSource: one memory_layout event per new idle point, rate-limited, never early."""

from __future__ import annotations

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.records import Phase
from vramscope.hooks import phase as ph
from vramscope.hooks.idle_layout import LAYOUT_EVENT, IdleLayoutSource
from vramscope.hooks.sampler import Sampler
from vramscope.hooks.sink import ListSink

MIB = 2**20


@pytest.fixture(autouse=True)
def fresh_phase():
    ph.reset()
    yield
    ph.reset()


def take_counting(calls):
    def take():
        calls.append(1)
        return [{"device": 0, "total_size": 20 * MIB, "stream": 3,
                 "blocks": [{"size": 2 * MIB * len(calls), "state": "active_allocated"}]}]
    return take


def test_one_layout_per_new_idle_point_and_none_while_busy():
    clock, calls, sink = FakeClock(), [], ListSink()
    ph.configure(sink=ListSink(), clock=clock)
    src = IdleLayoutSource(0, take_counting(calls), min_interval_s=10.0, poll_s=0.1,
                           clock=clock, pid=5)
    sampler = Sampler(sink, [src], clock=clock)
    got = []
    for step in ("decode", "idle", "idle", "prefill", "idle", "decode", "idle"):
        ph.set_phase(step)
        sampler.run_once()
        clock.advance(6.0)
        got.append(len(sink.events()))
    # idle at 6 s: taken; still idle: nothing new; idle again at 24 s: taken (18 s later);
    # idle again at 36 s, 12 s later: taken
    assert got == [0, 1, 1, 1, 2, 2, 3]
    assert len(calls) == 3
    e = sink.events()[-1]
    assert (e.name, e.phase, e.pid, e.data["allocated_bytes"]) == (LAYOUT_EVENT, Phase.IDLE, 5,
                                                                   6 * MIB)


def test_an_idle_point_within_the_interval_waits_and_the_next_is_taken():
    clock, calls = FakeClock(), []
    ph.configure(sink=ListSink(), clock=clock)
    src = IdleLayoutSource(0, take_counting(calls), min_interval_s=10.0, clock=clock)
    ph.set_phase("idle")
    assert src.read() is not None
    ph.set_phase("decode")
    ph.set_phase("idle")
    clock.advance(4.0)
    assert src.read() is None  # too soon after the last one
    clock.advance(6.0)
    assert src.read() is not None  # the same idle point, now that the interval has passed
    assert len(calls) == 2


def test_no_snapshot_before_cuda_is_ready_and_a_costly_one_spaces_them_out():
    clock, calls, ready = FakeClock(), [], [False]

    def slow_take():
        clock.advance(0.2)
        return take_counting(calls)()

    ph.configure(sink=ListSink(), clock=clock)
    src = IdleLayoutSource(0, slow_take, min_interval_s=1.0, max_cost_s=0.05, clock=clock,
                           ready=lambda: ready[0])
    ph.set_phase("idle")
    assert src.read() is None and calls == []
    ready[0] = True
    e = src.read()
    assert e.data["cost_s"] == pytest.approx(0.2) and src.min_interval_s == 2.0


def test_bad_intervals_are_refused():
    with pytest.raises(ValueError, match="min_interval_s=0"):
        IdleLayoutSource(0, list, min_interval_s=0)
