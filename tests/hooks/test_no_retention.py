"""Nothing a server call creates outlives the call because of vramscope
(docs/architecture.md rule 7).

For every integration point but the transformers integration's own (tests/hooks/
test_hooks_transformers.py runs generate and generate_batch 20 times each): the KV pool adapter
(``KVSource``), transformers' ``PagedAttentionCache`` observer, the OOM observer, snapshots, the
idle layouts, the sampler and phase tracking. Two checks each:

- **dead after the call**: what the call created is referenced weakly; once the caller drops
  it, it is gone. Where a cycle through vramscope would keep it for the cyclic GC (a KV pool
  and its observer holding each other, a cache and its watch), the check runs with the GC
  disabled: dead by reference counting alone, the moment the server lets go;
- **bounded over 1,000 calls**: vramscope's own Python memory (tracemalloc, counting only
  allocations made in vramscope's files) and the lengths of its internal structures.
"""

from __future__ import annotations

import contextlib
import gc
import os
import tracemalloc
import weakref

import pytest
import vramscope.agent
import vramscope.hooks
from vramscope.agent.clock import FakeClock
from vramscope.agent.records import Phase
from vramscope.hooks import phase as ph
from vramscope.hooks.idle_layout import IdleLayoutSource
from vramscope.hooks.kv_source import KVSource
from vramscope.hooks.kvpool import KVBlockPool
from vramscope.hooks.oom import OomObserver
from vramscope.hooks.sampler import Every, Sampler
from vramscope.hooks.snapshot import SnapshotSource

MIB = 2**20
OURS = [os.path.join(os.path.dirname(p.__file__), "*") for p in (vramscope.hooks,
                                                                   vramscope.agent)]
GROWTH_LIMIT = 16 * 1024  # bytes of vramscope's memory 900 more calls may leave behind


class DropSink:
    """Counts records and keeps none: a sink that retained records would hide our own leaks."""

    def __init__(self) -> None:
        self.put_count = 0

    def put(self, record) -> None:
        self.put_count += 1

    def close(self) -> None:
        pass


class Segments(list):
    """A snapshot's segment list that can be referenced weakly."""


@contextlib.contextmanager
def refcount_only():
    """The GC off: what dies inside died by reference counting, with no cycle left behind."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def our_growth(call, n=1000, warm=100) -> int:
    """Net bytes that calls ``warm`` .. ``n`` added to what vramscope's files allocated.

    Traced from the first call, so an entry a bounded structure replaces counts as freed."""
    tracemalloc.start()
    try:
        for i in range(warm):
            call(i)
        gc.collect()
        before = tracemalloc.take_snapshot()
        for i in range(warm, n):
            call(i)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    mine = [tracemalloc.Filter(True, pattern) for pattern in OURS]
    diff = after.filter_traces(mine).compare_to(before.filter_traces(mine), "filename")
    return sum(d.size_diff for d in diff)


def segments(size=20 * MIB):
    return Segments([{"device": 0, "address": 0, "total_size": size, "stream": 0,
                      "blocks": [{"size": MIB, "requested_size": MIB,
                                  "state": "active_allocated"},
                                 {"size": size - MIB, "state": "inactive"}]}])


@pytest.fixture(autouse=True)
def fresh_phase():
    ph.reset()
    yield
    ph.reset()


# --- the KV pool adapter ---------------------------------------------------------------------
def small_pool():
    return KVBlockPool(num_layers=1, num_kv_heads=1, head_dim=8, dtype="float32", block_size=4,
                       num_blocks=64)


def test_a_dropped_pool_dies_at_once_while_its_kv_source_lives_on():
    """On the landed code the source held its pool (and the pool its source): a cycle that kept
    the pool's buffer until the cyclic GC ran, or for as long as the server kept the source."""
    small_pool()  # torch's first import (lazy, in the pool) leaves cycles of its own
    source = KVSource(DropSink(), clock=FakeClock(), sample_interval_s=0.0)
    with refcount_only():
        pool = small_pool()
        source.attach(pool)
        pool.allocate("r1", 10)
        pool.free("r1")
        buffer_ref, pool_ref = weakref.ref(pool.buffer), weakref.ref(pool)
        del pool
        assert pool_ref() is None and buffer_ref() is None
    assert source.pool is None and source.read() is None and source.check() is None


def test_a_pool_and_source_per_call_die_with_the_call():
    with refcount_only():
        refs = []
        for i in range(20):
            pool = small_pool()
            source = KVSource(DropSink(), clock=FakeClock()).attach(pool)
            pool.allocate(f"r{i}", 9)
            pool.free(f"r{i}")
            refs += [weakref.ref(pool), weakref.ref(source)]
            del pool, source
        assert [r() for r in refs] == [None] * 40


def test_a_failing_observer_keeps_no_pool_through_the_log(caplog):
    """Logged once, with its traceback as text: a record holding exc_info held the pool."""
    import logging

    class Broken(KVSource):
        def on_allocate(self, pool, allocation):
            raise RuntimeError("observer bug")

    small_pool()
    with refcount_only(), caplog.at_level(logging.WARNING, logger="vramscope.kvpool"):
        pool = small_pool()
        Broken(DropSink()).attach(pool)
        pool.allocate("r1", 4)
        assert pool.stats().observer_errors == 1
        ref = weakref.ref(pool)
        del pool
        assert ref() is None
    assert "RuntimeError: observer bug" in caplog.text  # the traceback is still there


def test_the_kv_source_stays_bounded_over_1000_requests():
    """After the pool's own memory of finished ids (bounded, 4,096) is full."""
    from vramscope.hooks.kvpool import _FINISHED_MEMORY

    sink = DropSink()
    pool = small_pool()
    source = KVSource(sink, clock=FakeClock(), sample_interval_s=0.0,
                      extend_events=True).attach(pool)

    def call(i):
        pool.allocate(f"req-{i}", 5)
        pool.extend(f"req-{i}", 4)
        pool.free(f"req-{i}")

    warm = _FINISHED_MEMORY + 100
    assert our_growth(call, n=warm + 1000, warm=warm) < GROWTH_LIMIT
    assert len(source._extend_data) + len(source._free_data) <= 4
    assert sink.put_count >= 3 * (warm + 1000)


# --- transformers' PagedAttentionCache observer ------------------------------------------------
@pytest.fixture(scope="module")
def model():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.support.tiny_models import tiny_llama

    return tiny_llama()


def cb_configs():
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    gen = GenerationConfig(max_new_tokens=3, do_sample=False, eos_token_id=-1, pad_token_id=0)
    return gen, ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=32)


def run_requests(model, prompts):
    """Requests through one manager; returns its cache (the only reference left, once the
    manager and its threads are collected)."""
    gen, cb = cb_configs()
    with model.continuous_batching_context_manager(generation_config=gen,
                                                   continuous_batching_config=cb,
                                                   block=True, timeout=10) as manager:
        for i, prompt in enumerate(prompts):
            rid = manager.add_request(prompt, request_id=f"p{i}", max_new_tokens=3)
            assert manager.get_result(request_id=rid, timeout=60) is not None
        cache = manager.batch_processor.cache
    del manager
    gc.collect()
    return cache


def test_an_observed_paged_cache_dies_by_refcount_when_dropped(model):
    """A real cache from the tiny Llama, observed directly, exercised, dropped: dead with the GC
    off. On the landed code the watch held the cache strongly (cache -> wrappers -> watch ->
    cache), so it lived until the cyclic GC ran."""
    from vramscope.hooks.transformers_kv import _WATCH_ATTR, observe_paged_attention_cache

    cache = run_requests(model, [[1, 2, 3, 4, 5]])
    with refcount_only():
        assert observe_paged_attention_cache(cache, DropSink(), clock=FakeClock(),
                                             sample_interval_s=0.0)
        watch = getattr(cache, _WATCH_ATTR)
        for i in range(5):
            cache.search_prefix_match(f"q{i}", [1, 2, 3, 4, 5])
            cache.free_blocks(f"q{i}")
        assert watch.read().kv_blocks_total == cache.num_blocks
        ref = weakref.ref(cache)
        del cache
        assert ref() is None
        assert watch.cache is None  # the watch, still referenced here, did not keep it


def test_a_fault_in_the_kv_view_keeps_no_cache_through_the_log(model, caplog):
    """The view turns off with one log line. A record holding the exception (as pytest's
    handler keeps every record) held its traceback, whose frame held the cache: logged as text,
    nothing of the call is kept."""
    import logging

    from vramscope.hooks.transformers_kv import BlockManagerLayout, PagedCacheWatch

    class Renamed(BlockManagerLayout):
        def used_cached(self, cache):
            raise AttributeError(f"{type(cache).__name__} has no _block_manager any more")

    cache = run_requests(model, [[1, 2, 3]])
    with refcount_only(), caplog.at_level(logging.WARNING, logger="vramscope.hooks"):
        watch = PagedCacheWatch(cache, Renamed(), DropSink(), 0, FakeClock(), 0.0, False, None)
        watch.install()
        cache.free_blocks("gone")
        assert watch.enabled is False
        ref = weakref.ref(cache)
        del cache
        assert ref() is None
    assert "turned off" in caplog.text and "no _block_manager any more" in caplog.text


def test_caches_observed_through_the_class_hook_die_with_their_calls(model):
    from vramscope.hooks.transformers_kv import install_paged_cache_hook

    sink = DropSink()
    undo = install_paged_cache_hook(sink, clock=FakeClock(), sample_interval_s=0.0)
    try:
        refs = [weakref.ref(run_requests(model, [[1, 2, 3], [4, 5, 6, 7]])) for _ in range(3)]
    finally:
        undo()
    gc.collect()
    assert [r() for r in refs] == [None] * 3
    assert sink.put_count > 0  # they were observed


def test_the_paged_cache_watch_stays_bounded_over_1000_requests(model):
    from vramscope.hooks.transformers_kv import _WATCH_ATTR, observe_paged_attention_cache

    cache = run_requests(model, [[1, 2, 3]])
    observe_paged_attention_cache(cache, DropSink(), clock=FakeClock(), sample_interval_s=0.0)
    watch = getattr(cache, _WATCH_ATTR)

    def call(i):
        cache.search_prefix_match(f"x{i}", [1, 2, 3])
        cache.free_blocks(f"x{i}")

    assert our_growth(call) < GROWTH_LIMIT
    assert (watch.live, watch.tokens, watch.hits, watch.waiting) == (set(), {}, {}, set())


# --- the OOM observer --------------------------------------------------------------------------
def test_the_oom_observer_keeps_no_snapshot_and_stays_bounded(tmp_path):
    made = []

    def take():
        made.append(weakref.ref(segs := segments()))
        return segs

    sink = DropSink()
    observer = OomObserver(sink, take_segments=take, min_interval_s=0.0, clock=FakeClock())
    with refcount_only():
        observer(0, 2 * MIB, 80 * 2**30, MIB)
        assert made[0]() is None
    assert our_growth(lambda i: observer(0, 2 * MIB, 80 * 2**30, MIB)) < GROWTH_LIMIT
    assert (observer.seen, observer.failures, sink.put_count) == (1001, 0, 2002)


class Full(dict):
    """A full snapshot (``_snapshot()``) that can be referenced weakly."""


class Unpicklable(dict):
    def __reduce__(self):
        raise TypeError("cannot pickle this snapshot")


@pytest.mark.parametrize("kind", [Full, Unpicklable])
def test_the_oom_observer_dump_keeps_no_full_snapshot(tmp_path, kind):
    """Written or failing to be written (the failure is logged: a log record holding the
    exception would hold its traceback, its frames and the snapshot in them)."""
    made = []

    def full():
        made.append(weakref.ref(snap := kind(segments=segments(), device_traces=[[]])))
        return snap

    observer = OomObserver(DropSink(), take_segments=segments, full_snapshot=full,
                           snapshot_dir=str(tmp_path), min_interval_s=0.0, clock=FakeClock())
    with refcount_only():
        observer(0, MIB, 2**30, 0)
        assert made[0]() is None
    assert observer.failures == 0
    assert len(list(tmp_path.iterdir())) == (kind is Full)


# --- snapshots and idle layouts ----------------------------------------------------------------
def test_snapshots_keep_no_snapshot_and_stay_bounded():
    made = []

    def take():
        made.append(weakref.ref(segs := segments()))
        return segs

    source = SnapshotSource(0, take, interval_s=1.0, max_cost_s=0.0, clock=FakeClock())
    with refcount_only():
        assert len(source.read()) == 2
        assert made[0]() is None
    assert our_growth(lambda i: source.read()) < GROWTH_LIMIT
    assert len(made) == 1001


def test_idle_layouts_keep_no_snapshot_and_stay_bounded():
    made, entries = [], [0]

    def take():
        made.append(weakref.ref(segs := segments()))
        return segs

    def call(_i):
        entries[0] += 1  # a new idle point every call
        clock.advance(1.0)
        return source.read()

    clock = FakeClock()
    source = IdleLayoutSource(0, take, min_interval_s=1.0, clock=clock,
                              idle_entries=lambda: entries[0], phase_fn=lambda: Phase.IDLE)
    with refcount_only():
        assert call(0).data["segments"] == 1
        assert made[0]() is None
    assert our_growth(call) < GROWTH_LIMIT
    assert len(made) == 1001


# --- the sampler -------------------------------------------------------------------------------
class Record:
    """A record that can be referenced weakly (Sample and Event are tuples: they cannot)."""


def test_the_sampler_keeps_no_record_and_stays_bounded():
    made, held, clock = [], [], FakeClock()

    class Source:
        def read(self):
            made.append(weakref.ref(rec := Record()))
            return [rec, Record()]

    class Broken:
        interval_s = 0.1

        def read(self):
            big = segments()  # a local of the frame the exception's traceback holds
            held.append(weakref.ref(big))
            raise RuntimeError("a source failing every time")

    sampler = Sampler(DropSink(), [Every(Source(), 0.1), Broken()], clock=clock)

    def call(_i):
        clock.advance(0.1)
        return sampler.run_once()

    with refcount_only():
        assert call(0) == 2
        # on the landed code the logged exception (kept by any handler that keeps records,
        # as pytest's does) held the failing frame and its snapshot
        assert made[0]() is None and held[0]() is None
    assert our_growth(call) < GROWTH_LIMIT
    assert (len(sampler.tasks), len(sampler._schedules), sampler.failures) == (2, 2, 1001)
    assert sampler.records_put == 2002


# --- phase tracking ----------------------------------------------------------------------------
def test_requests_do_not_accumulate_in_phase_tracking():
    ph.configure(sink=DropSink(), clock=FakeClock())

    def call(i):
        with ph.phase("prefill", request_id=f"r{i}"):
            ph.set_phase("decode", decode_tokens=1)
        ph.set_phase("idle")

    assert our_growth(call) < GROWTH_LIMIT
    assert ph.requests_in_flight() == () and ph.idle_entries() == 1000


def test_requests_never_finished_are_bounded():
    ph.configure(sink=DropSink(), clock=FakeClock())
    for i in range(ph.MAX_REQUESTS_IN_FLIGHT + 5):
        ph.request_started(f"lost-{i}")
    in_flight = ph.requests_in_flight()
    assert len(in_flight) == ph.MAX_REQUESTS_IN_FLIGHT and ph.requests_forgotten() == 5
    assert in_flight[0] == "lost-5"  # the oldest were forgotten
