"""Phase tracking: process-wide state, transition events, true per-phase peaks, requests."""

from __future__ import annotations

import threading

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.records import Phase
from vramscope.hooks import phase as ph
from vramscope.hooks.allocator import Counters, FakeAllocatorSource
from vramscope.hooks.sink import ListSink

MiB = 2**20


@pytest.fixture
def wired():
    clock = FakeClock(1_700_000_000.0)
    sink = ListSink()
    alloc = FakeAllocatorSource(Counters(10 * MiB, 10 * MiB, 20 * MiB, 10 * MiB, 0, 10 * MiB,
                                         0, 0), clock=clock)
    stamps: list[str] = []
    ph.configure(sink=sink, clock=clock, sources=[alloc], stamp=stamps.append)
    yield clock, sink, alloc, stamps
    ph.reset()


def phase_events(sink):
    return [e for e in sink.events() if e.name == "phase"]


def test_unconfigured_phase_is_unknown_and_switching_costs_no_sink():
    ph.reset()
    assert ph.current_phase() is Phase.UNKNOWN
    assert ph.set_phase("prefill") is Phase.UNKNOWN
    assert ph.current_phase() is Phase.PREFILL
    ph.reset()


def test_transition_is_one_event_that_closes_the_span(wired):
    clock, sink, alloc, stamps = wired
    ph.set_phase("prefill", "r1", prefill_tokens=512)
    clock.advance(0.25)
    alloc.set(allocated=300 * MiB)  # the prefill spike sets a new high...
    alloc.set(allocated=40 * MiB)   # ...and is freed before the span ends
    ph.set_phase("decode", "r1", decode_tokens=1)
    [first, second] = phase_events(sink)
    assert first.phase is Phase.PREFILL and first.request_id == "r1"
    assert second.phase is Phase.DECODE
    assert second.data == {
        "ended_phase": "prefill", "ended_duration_s": 0.25, "ended_steps": 1,
        "ended_prefill_tokens": 512, "ended_decode_tokens": 0, "ended_mixed_steps": 0,
        "ended_peak_allocated_bytes": 300 * MiB, "ended_peak_exact": True}
    assert stamps == ["vramscope.phase=prefill", "vramscope.phase=decode"]


def test_same_phase_again_counts_steps_without_events_or_reads(wired):
    clock, sink, alloc, _ = wired
    ph.set_phase("decode", decode_tokens=16)
    reads = alloc.reads
    for _ in range(9):
        ph.set_phase("decode", decode_tokens=16)
    assert alloc.reads == reads  # the hot path reads nothing
    ph.set_phase("idle")
    ended = phase_events(sink)[-1].data
    assert (ended["ended_steps"], ended["ended_decode_tokens"]) == (10, 160)


def test_span_below_an_earlier_high_reports_a_flagged_lower_bound(wired):
    _, sink, alloc, _ = wired
    alloc.set(allocated=500 * MiB)
    alloc.set(allocated=50 * MiB)  # the process peak (500 MiB) was before this span
    ph.set_phase("decode")
    alloc.set(allocated=120 * MiB)
    assert alloc.read().phase is Phase.DECODE  # the sampler saw 120 MiB in decode
    alloc.set(allocated=80 * MiB)
    ph.set_phase("idle")
    ended = phase_events(sink)[-1].data
    assert ended["ended_peak_allocated_bytes"] == 120 * MiB
    assert ended["ended_peak_exact"] is False
    assert alloc.now.allocated_peak == 500 * MiB  # observe mode never resets the server's peak


def test_reset_mode_makes_every_span_exact(wired):
    _, sink, alloc, _ = wired
    ph.use_peak_resets(True, reset_peak=alloc.reset_peak)
    alloc.set(allocated=500 * MiB)
    alloc.set(allocated=50 * MiB)
    ph.set_phase("decode")  # resets the peak to 50 MiB
    alloc.set(allocated=130 * MiB)
    alloc.set(allocated=60 * MiB)
    ph.set_phase("idle")
    ended = phase_events(sink)[-1].data
    assert (ended["ended_peak_allocated_bytes"], ended["ended_peak_exact"]) == (130 * MiB, True)
    assert ph.process_peak_allocated_bytes(0) == 500 * MiB


def test_context_manager_restores_and_owns_its_request(wired):
    _, sink, _, _ = wired
    ph.set_phase("idle")
    with ph.phase("prefill", request_id="r7"):
        assert ph.current_phase() is Phase.PREFILL
        assert ph.requests_in_flight() == ("r7",)
    assert ph.current_phase() is Phase.IDLE
    assert ph.requests_in_flight() == ()
    names = [(e.name, e.phase.value) for e in sink.events()]
    assert names == [("phase", "idle"), ("request_start", "idle"), ("phase", "prefill"),
                     ("phase", "idle"), ("request_end", "idle")]


def test_phase_is_process_wide_not_per_thread(wired):
    ph.set_phase("decode")
    seen = []
    t = threading.Thread(target=lambda: seen.append(ph.current_phase()))
    t.start()
    t.join()
    assert seen == [Phase.DECODE]


def test_mixed_steps_are_counted(wired):
    _, sink, _, _ = wired
    ph.set_phase("prefill", prefill_tokens=100, decode_tokens=7)
    ph.set_phase("prefill", prefill_tokens=28)
    ph.set_phase("decode", decode_tokens=8)
    ended = phase_events(sink)[-1].data
    assert (ended["ended_steps"], ended["ended_prefill_tokens"], ended["ended_decode_tokens"],
            ended["ended_mixed_steps"]) == (2, 128, 7, 1)


def test_unknown_phase_name_is_a_clear_error(wired):
    with pytest.raises(ValueError, match="unknown phase 'prefil'"):
        ph.set_phase("prefil")


def test_a_failing_source_never_reaches_the_caller():
    class Broken:
        device = 0

        def counters(self):
            raise RuntimeError("driver gone")

    sink = ListSink()
    ph.configure(sink=sink, clock=FakeClock(), sources=[Broken()])
    try:
        ph.set_phase("prefill")
        assert ph.current_phase() is Phase.PREFILL
        assert "ended_peak_allocated_bytes" not in phase_events(sink)[0].data
    finally:
        ph.reset()


def test_cuda_initialized_mid_span_counts_from_zero():
    sink = ListSink()
    alloc = FakeAllocatorSource(None)  # CUDA not initialized yet
    ph.configure(sink=sink, clock=FakeClock(), sources=[alloc])
    try:
        ph.set_phase("prefill")
        alloc.set(allocated=64 * MiB)
        ph.set_phase("decode")
        ended = phase_events(sink)[-1].data
        assert (ended["ended_peak_allocated_bytes"], ended["ended_peak_exact"]) == (64 * MiB, True)
    finally:
        ph.reset()
