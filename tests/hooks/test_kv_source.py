"""KVSource: pool activity into Samples and Events, on a real pool, a ListSink and a FakeClock."""

from __future__ import annotations

import io

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.records import Phase, Sample
from vramscope.agent.trace import parse_lines, write_trace
from vramscope.hooks.kv_source import KVSource
from vramscope.hooks.kvpool import KVBlockPool, KVPoolError
from vramscope.hooks.sink import ListSink

T0 = 1_700_000_000.0


@pytest.fixture
def setup():
    clock = FakeClock(T0)
    sink = ListSink()
    pool = KVBlockPool(num_layers=1, num_kv_heads=1, head_dim=2, dtype="float16", block_size=4,
                       num_blocks=8, buffer=False)
    source = KVSource(sink, device=1, clock=clock, sample_interval_s=1.0, pid=4242).attach(pool)
    return clock, sink, pool, source


def test_allocate_puts_an_event_and_samples_at_a_rate(setup):
    clock, sink, pool, _ = setup
    pool.allocate("a", token_ids=list(range(6)))
    pool.allocate("b", 3)
    events, samples = sink.events(), sink.samples()
    assert [(e.name, e.request_id, e.data) for e in events] == [
        ("kv_alloc", "a", {"blocks": 2, "tokens": 6, "hit_tokens": 0}),
        ("kv_alloc", "b", {"blocks": 1, "tokens": 3, "hit_tokens": 0}),
    ]
    assert all((e.ts_s, e.device, e.pid) == (T0, 1, 4242) for e in events)
    assert samples == [Sample(T0, 1, Phase.UNKNOWN, "kv", 4242, kv_blocks_used=2,
                              kv_blocks_total=8, kv_blocks_cached=0, kv_tokens_used=6)]
    pool.extend("b", 1)  # fits in b's block: decode steps are not reported at all
    assert len(sink.records) == 3
    clock.advance(1.0)
    pool.extend("b", 1)  # takes a block: shows in the next sample, at the next event
    pool.allocate("c", 1)
    assert len(sink.events()) == 3
    last = sink.samples()[-1]
    assert (last.ts_s, last.kv_blocks_used, last.kv_tokens_used) == (T0 + 1.0, 5, 12)


def test_extend_that_takes_blocks_is_a_kv_alloc_when_asked(setup):
    clock, sink, pool, source = setup
    pool.allocate("a", 4)
    pool.extend("a", 5)
    assert len(sink.events()) == 1  # by default growth shows in the samples only
    assert pool._on_extend is None  # and the pool does not even call the source
    KVSource(sink, clock=clock, extend_events=True).attach(pool)
    pool.extend("a", 5)
    assert sink.events()[-1].data == {"blocks": 1, "tokens": 14, "extend": True}


def test_free_reports_released_and_cached_blocks_and_the_idle_check_passes(setup):
    _, sink, pool, _ = setup
    pool.allocate("a", token_ids=list(range(9)))
    pool.free("a")
    names = [e.name for e in sink.events()]
    assert names == ["kv_alloc", "kv_free"]  # the idle check ran and found nothing
    assert sink.events()[-1].data == {"blocks_released": 1, "blocks_cached": 2}


def test_orphaned_blocks_become_a_leak_event_with_a_sample(setup):
    clock, sink, pool, source = setup
    pool.allocate("live", 2)
    pool.allocate("forgotten", 9)
    clock.advance(5.0)
    report = source.check(live_request_ids=["live"])
    assert report.orphaned_blocks == (1, 2, 3)
    event = sink.events()[-1]
    assert event.name == "kv_orphaned_blocks" and event.ts_s == T0 + 5.0
    assert event.data == {"blocks": 3, "block_ids": [1, 2, 3], "owners": ["forgotten"],
                          "problems": [], "bytes_per_block": pool.bytes_per_block}
    assert sink.samples()[-1].kv_blocks_used == 4


def test_failed_allocation_is_an_event(setup):
    _, sink, pool, _ = setup
    with pytest.raises(KVPoolError):
        pool.allocate("huge", 33)
    event = sink.events()[-1]
    assert (event.name, event.request_id, event.data["tokens"]) == ("kv_alloc_failed", "huge", 33)
    assert event.data["reason"] == "not enough free or evictable blocks"


def test_detach_restores_the_free_path_and_read_samples_on_demand(setup):
    _, sink, pool, source = setup
    pool.allocate("a", 5)
    assert source.read().kv_blocks_used == 2
    source.detach()
    assert pool.observer is None and source.read() is None
    pool.allocate("b", 5)
    assert [e.request_id for e in sink.events()] == ["a"]


def test_phase_comes_from_the_phase_function():
    sink = ListSink()
    pool = KVBlockPool(num_layers=1, num_kv_heads=1, head_dim=2, num_blocks=4, buffer=False)
    KVSource(sink, clock=FakeClock(T0), phase_fn=lambda: Phase.PREFILL).attach(pool)
    pool.allocate("a", 3)
    assert sink.events()[0].phase is Phase.PREFILL
    assert sink.samples()[0].phase is Phase.PREFILL


def test_records_are_valid_trace_v1(setup):
    clock, sink, pool, source = setup
    pool.allocate("a", token_ids=list(range(9)))
    clock.advance(2.0)
    pool.allocate("b", token_ids=list(range(9)))
    pool.allocate("c", 2)
    source.check(live_request_ids=["a", "b"])
    out = io.StringIO()
    lines = write_trace(out, sink.samples(), sink.events())
    trace = parse_lines(out.getvalue().splitlines())
    assert lines == len(sink.records) == 7  # 3 samples, 4 events
    assert trace.samples == sink.samples()
    assert [(e.name, e.request_id, e.data) for e in trace.events] == [
        (e.name, e.request_id, e.data) for e in sink.events()]
    assert trace.events[1].data["hit_tokens"] == 8


def test_a_bad_sample_interval_is_refused():
    with pytest.raises(ValueError, match="sample_interval_s must be >= 0, got -1"):
        KVSource(ListSink(), sample_interval_s=-1)


class _SteppedWallClock(FakeClock):
    """The FakeClock, plus a wall clock an operator (or NTP) can set back."""

    def set_back(self, seconds: float) -> None:
        with self._lock:
            self._now_s -= seconds


def test_a_wall_clock_set_back_makes_the_next_sample_due_at_once():
    clock, sink = _SteppedWallClock(T0), ListSink()
    pool = KVBlockPool(num_layers=1, num_kv_heads=1, head_dim=2, num_blocks=8, buffer=False)
    KVSource(sink, clock=clock, sample_interval_s=1.0).attach(pool)
    pool.allocate("a", 3)  # the first event samples
    clock.advance(0.5)
    pool.allocate("b", 3)  # half an interval later: not yet
    clock.set_back(3600.0)
    pool.allocate("c", 3)  # an hour back: would wait an hour, so samples now
    clock.advance(0.5)
    pool.allocate("d", 3)
    assert [s.ts_s for s in sink.samples()] == [T0, T0 + 0.5 - 3600.0]
    assert [s.kv_blocks_used for s in sink.samples()] == [1, 3]


def test_events_with_equal_data_share_one_bounded_dict(setup, monkeypatch):
    clock, sink, pool, _ = setup
    KVSource(sink, clock=clock, extend_events=True).attach(pool)
    for rid in ("a", "b"):
        pool.allocate(rid, 4)
        pool.extend(rid, 1)  # each takes a second block at 5 tokens
        pool.free(rid)
    ext = [e for e in sink.events() if e.data.get("extend")]
    free = [e for e in sink.events() if e.name == "kv_free"]
    assert [e.data for e in ext] == [{"blocks": 1, "tokens": 5, "extend": True}] * 2
    assert [e.data for e in free] == [{"blocks_released": 2, "blocks_cached": 0}] * 2
    assert ext[0].data is ext[1].data and free[0].data is free[1].data
    alloc = [e for e in sink.events() if e.name == "kv_alloc" and "extend" not in e.data]
    assert alloc[0].data is not alloc[1].data  # allocate data varies too much to share

    monkeypatch.setattr("vramscope.hooks.kv_source._SHARED_DATA_MAX", 2)
    source = KVSource(sink, clock=clock, extend_events=True).attach(pool)
    pool.allocate("c", 1)
    for _ in range(4):
        pool.extend("c", 4)  # 4 distinct token counts: the memo starts over at 2
    assert len(source._extend_data) == 2
    assert [e.data["tokens"] for e in sink.events()[-4:]] == [5, 9, 13, 17]
