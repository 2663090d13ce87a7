"""The transformers adapter on a real tiny random-weight Llama running continuous batching on CPU.

Continuous batching runs on CPU in transformers 5.24 (installed here); 5.17 (the GPU machine)
also runs it on CPU when psutil is installed, and the adapter was checked against both layouts.
Page size 16, 32 blocks, greedy decoding of exactly 8 new tokens per request (no EOS), so the
block counts below follow from the prompt lengths: 42 prompt tokens + 8 = 50 tokens = 4 blocks.
"""

from __future__ import annotations

import inspect
import logging
import types

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vramscope.agent.clock import FakeClock  # noqa: E402
from vramscope.hooks.sink import ListSink  # noqa: E402
from vramscope.hooks.transformers_kv import (  # noqa: E402
    install_paged_cache_hook,
    observe_paged_attention_cache,
    unobserve_paged_attention_cache,
)

from tests.support.tiny_models import tiny_llama  # noqa: E402

SYSTEM_PROMPT = list(range(1, 41))  # 40 tokens: two full 16-token blocks are shareable


def configs():
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    params = inspect.signature(ContinuousBatchingConfig).parameters
    page = "page_size" if "page_size" in params else "block_size"  # 5.24 renamed it
    cb = ContinuousBatchingConfig(num_blocks=32, max_batch_tokens=64, **{page: 16})
    gen = GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=-1, pad_token_id=0)
    return gen, cb


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture
def sink():
    s = ListSink()
    undo = install_paged_cache_hook(s, clock=FakeClock(), sample_interval_s=0.0)
    yield s
    undo()


def run_sequentially(model, prompts):
    """Requests one after another through one manager: the later ones can hit the cache."""
    gen, cb = configs()
    with model.continuous_batching_context_manager(generation_config=gen,
                                                   continuous_batching_config=cb,
                                                   block=True, timeout=10) as manager:
        for i, prompt in enumerate(prompts):
            rid = manager.add_request(prompt, request_id=f"r{i}", max_new_tokens=8)
            result = manager.get_result(request_id=rid, timeout=60)
            assert result is not None and len(result.generated_tokens) == 8
        return manager.batch_processor.cache


def kv_events(sink, name=None):
    return [(e.name, e.request_id, e.data) for e in sink.events()
            if e.name.startswith("kv_") and (name is None or e.name == name)]


def test_requests_allocate_free_and_hit_the_prefix_cache(model, sink):
    cache = run_sequentially(model, [SYSTEM_PROMPT + [100, 101], SYSTEM_PROMPT + [102, 103]])
    allocs = kv_events(sink, "kv_alloc")
    assert [(rid, d["blocks"], d["hit_tokens"]) for _, rid, d in allocs] == [
        ("r0", 3, 0), ("r1", 3, 32)]
    frees = kv_events(sink, "kv_free")
    assert [(rid, d["blocks_released"], d["blocks_cached"]) for _, rid, d in frees] == [
        ("r0", 1, 3), ("r1", 1, 3)]  # 50 tokens: 3 full blocks stay cached, 1 partial freed
    assert kv_events(sink, "kv_orphaned_blocks") == []
    samples = sink.samples()
    assert {s.kv_blocks_total for s in samples} == {cache.num_blocks} == {32}
    assert max(s.kv_blocks_used for s in samples) == 4
    assert (samples[-1].kv_blocks_used, samples[-1].kv_blocks_cached) == (0, 4)
    watch = cache._vramscope_kv_watch
    # 42 prompt tokens + 7 fed back (the 8th is sampled, never written): 49 in KV. 5.24 says so
    # at allocation; 5.17 only when a step is prepared, and the last sample before a free sees
    # the step before that one.
    expected_tokens = 49 if watch.layout.name == "cache_allocators" else 48
    assert max(s.kv_tokens_used for s in samples if s.kv_tokens_used) == expected_tokens
    assert (watch.prefix_query_tokens, watch.prefix_hit_tokens) == (84, 32)


def test_generate_batch_is_observed_per_request(model, sink):
    gen, cb = configs()
    prompts = [SYSTEM_PROMPT[:20], SYSTEM_PROMPT[20:] + [7] * 13]  # 20 and 33 tokens
    out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cb)
    assert sorted(len(o.generated_tokens) for o in out.values()) == [8, 8]
    allocs = sorted((rid, d["blocks"]) for _, rid, d in kv_events(sink, "kv_alloc"))
    assert [blocks for _, blocks in allocs] == [2, 3]  # ceil(20/16), ceil(33/16)
    assert sorted(rid for _, rid, _ in kv_events(sink, "kv_free")) == sorted(out)
    assert sink.samples()[-1].kv_blocks_used == 0


def _hold_two_blocks(cache, rid: str) -> None:
    """A request that holds two blocks in its block table (still running)."""
    if hasattr(cache, "can_store_request_tokens"):  # 5.24 layout
        from transformers.generation.continuous_batching.requests import RequestState

        assert cache.can_store_request_tokens(RequestState(rid, [5] * 20), 20)
    else:  # 5.17 layout
        assert cache.allocate_blocks(2, rid, 0) == 2


def _leak_two_blocks(cache) -> None:
    """What a lost request leaves: blocks taken, then the block table dropped unfreed."""
    _hold_two_blocks(cache, "leak")
    owners = (cache.cache_allocators.values() if hasattr(cache, "cache_allocators")
              else cache.group_cache_managers)
    for owner in owners:
        owner.block_table.pop("leak")


def test_blocks_used_with_no_request_left_are_reported_as_orphaned(model, sink):
    cache = run_sequentially(model, [SYSTEM_PROMPT[:10]])
    _leak_two_blocks(cache)
    cache.free_blocks("r-unknown")  # any free with no request left runs the idle check
    orphaned = kv_events(sink, "kv_orphaned_blocks")
    assert len(orphaned) == 1 and orphaned[0][2]["blocks"] == 2
    assert sink.samples()[-1].kv_blocks_used == 2


def test_blocks_lost_while_requests_run_are_reported_where_the_layout_tells(model, sink):
    """On 5.17 a GPU frees a finished request's blocks steps later, so the pool is never empty
    under traffic (the H200 run of docs/gpu-verification.md section 16): there the blocks no
    table holds are counted at a free while others run. The 5.24 layout's tables count each
    allocator's own blocks, so only the idle check speaks there."""
    cache = run_sequentially(model, [SYSTEM_PROMPT[:10]])
    _hold_two_blocks(cache, "live")
    _leak_two_blocks(cache)
    cache.free_blocks("r-unknown")  # a free while "live" still holds its table
    running = kv_events(sink, "kv_orphaned_blocks")
    block_manager = hasattr(cache, "group_cache_managers")
    if block_manager:
        assert [d["blocks"] for _, _, d in running] == [2]
        assert running[0][2]["problems"] == ["2 blocks used that no request's block table holds"]
    else:
        assert running == []
    cache.free_blocks("live")  # the last one: the idle check
    orphaned = kv_events(sink, "kv_orphaned_blocks")
    assert [d["blocks"] for _, _, d in orphaned] == ([2, 2] if block_manager else [2])


def test_an_unknown_cache_is_not_observed_with_one_log_line(caplog):
    odd = types.SimpleNamespace(num_blocks=8, free_blocks=lambda rid: None)
    with caplog.at_level(logging.INFO, logger="vramscope.hooks"):
        assert observe_paged_attention_cache(odd, ListSink()) is False
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "not observed: no " in lines[0]
    assert "internals differ from 5.17 and 5.24" in lines[0]


def test_no_sink_means_not_observed(caplog):
    with caplog.at_level(logging.INFO, logger="vramscope.hooks"):
        assert observe_paged_attention_cache(types.SimpleNamespace(), None) is False
    assert "no sink to put records to" in caplog.records[0].getMessage()


def test_a_fault_later_turns_the_view_off_and_the_cache_keeps_working(model, sink, caplog):
    cache = run_sequentially(model, [SYSTEM_PROMPT[:10]])
    before = len(sink.records)

    def broken(*args, **kwargs):
        raise AttributeError("renamed in a later release")

    layout = cache._vramscope_kv_watch.layout
    layout_used_cached = layout.used_cached
    layout.used_cached = broken  # the layout object is ours: break our reading of the cache
    try:
        with caplog.at_level(logging.WARNING, logger="vramscope.hooks"):
            cache.free_blocks("r0")
            cache.free_blocks("r0")
    finally:
        layout.used_cached = layout_used_cached
    assert cache._vramscope_kv_watch.enabled is False
    assert len(sink.records) == before
    assert sum("turned off" in r.getMessage() for r in caplog.records) == 1


def test_unobserve_restores_the_cache_methods(model, sink):
    cache = run_sequentially(model, [SYSTEM_PROMPT[:10]])
    assert "free_blocks" in vars(cache)
    unobserve_paged_attention_cache(cache)
    assert "free_blocks" not in vars(cache) and not hasattr(cache, "_vramscope_kv_watch")
