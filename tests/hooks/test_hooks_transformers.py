"""attach_transformers on a tiny random-weight Llama on CPU: generate() and generate_batch()."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest
from vramscope.agent.records import Phase
from vramscope.hooks import phase as ph
from vramscope.hooks.sink import ListSink
from vramscope.hooks.transformers_integration import attach_transformers, classify_step

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model():
    from tests.support.tiny_models import tiny_llama

    return tiny_llama()


@pytest.fixture
def attached(model):
    sink = ListSink()
    handle = attach_transformers(model, sink=sink)
    yield handle, sink
    handle.detach()
    ph.reset()


def spans(sink):
    """(phase entered, data of the span that ended) per phase event."""
    return [(e.phase, e.data) for e in sink.events() if e.name == "phase"]


def test_generate_tags_first_forward_prefill_and_the_rest_decode(model, attached):
    handle, sink = attached
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    out = model.generate(ids, max_new_tokens=5, min_new_tokens=5, do_sample=False,
                         pad_token_id=0)
    assert out.shape == (2, 12)
    events = [(e.name, e.phase) for e in sink.events()]
    assert events == [("request_start", Phase.UNKNOWN), ("phase", Phase.PREFILL),
                      ("phase", Phase.DECODE), ("request_end", Phase.DECODE),
                      ("phase", Phase.IDLE)]
    (_, _), (_, prefill), (_, decode) = spans(sink)
    assert (prefill["ended_steps"], prefill["ended_prefill_tokens"]) == (1, 14)
    assert (decode["ended_steps"], decode["ended_decode_tokens"]) == (4, 8)  # 4 steps x 2 rows
    rid = sink.events()[0].request_id
    assert rid.startswith("generate-") and ph.requests_in_flight() == ()


def test_detach_restores_the_model(model):
    handle = attach_transformers(model, sink=ListSink())
    assert "generate" in vars(model)
    handle.detach()
    assert "generate" not in vars(model) and "init_continuous_batching" not in vars(model)
    assert not model._forward_pre_hooks


def _future(rid, query_length):
    return SimpleNamespace(state=SimpleNamespace(request_id=rid), query_length=query_length)


def test_mixed_step_is_prefill_by_scheduler_state_not_length():
    before = {"a": "DECODING", "b": "DECODING", "c": "PREFILLING"}
    step = [_future("a", 1), _future("b", 1), _future("c", 30), _future("new", 64)]
    assert classify_step(step, before) == (Phase.PREFILL, 94, 2, ["c", "new"])
    assert classify_step([_future("a", 1)], before) == (Phase.DECODE, 0, 1, [])
    assert classify_step(None, before) == (Phase.IDLE, 0, 0, [])


def test_older_request_states_without_query_length():
    state = SimpleNamespace(request_id="x", tokens_to_process=[1, 2, 3])
    assert classify_step([state], {}) == (Phase.PREFILL, 3, 0, ["x"])


def test_generate_batch_records_mixed_steps_from_request_states(model, attached):
    handle, sink = attached
    try:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
    except ImportError:
        pytest.skip("this transformers has no ContinuousBatchingConfig")
    from transformers import GenerationConfig

    gen = GenerationConfig(max_new_tokens=4, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb = ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=8)
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8], list(range(20, 40))]
    out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cb,
                               progress_bar=False)
    assert sorted(len(r.generated_tokens) for r in out.values()) == [4, 4, 4]
    assert "continuous_batching" in handle.hooks
    ended = [d for _, d in spans(sink)]
    prefill_total = sum(d["ended_prefill_tokens"] for d in ended)
    decode_total = sum(d["ended_decode_tokens"] for d in ended)
    assert prefill_total == 5 + 3 + 20  # every prompt token prefilled exactly once
    assert decode_total == 3 * 3  # 4 new tokens: the first comes from prefill
    assert sum(d["ended_mixed_steps"] for d in ended) >= 1  # budget 8 forces chunked prefill
    assert [p for p, _ in spans(sink)][-1] is Phase.IDLE
    starts = {e.request_id for e in sink.events() if e.name == "request_start"}
    ends = {e.request_id for e in sink.events() if e.name == "request_end"}
    assert starts == ends == set(out)


def _alive(*classes):
    gc.collect()
    return sum(1 for o in gc.get_objects() if issubclass(type(o), classes))


def test_repeated_generate_batch_keeps_nothing_a_call_created(model):
    """Issue 13: each call's manager, scheduler and KV cache died with the call, 20 in a row.

    On the landed code 2, 4, 6 ... managers and caches stayed alive after the 1st, 2nd, 3rd
    call (held by the handle's undo list until detach) and the handle grew by 5 entries a call.
    """
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching.cache import PagedAttentionCache
    from transformers.generation.continuous_batching.continuous_api import (
        ContinuousBatchingManager,
    )
    from transformers.generation.continuous_batching.scheduler import Scheduler

    sink = ListSink()
    handle = attach_transformers(model, sink=sink)
    gen = GenerationConfig(max_new_tokens=3, do_sample=False, eos_token_id=-1, pad_token_id=0)
    per_call = []
    try:
        for i in range(20):
            cb = ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=16)
            out = model.generate_batch([[1, 2, 3], [4, 5, 6, 7 + i]], generation_config=gen,
                                       continuous_batching_config=cb, progress_bar=False)
            assert len(out) == 2
            del out
            per_call.append((_alive(PagedAttentionCache, ContinuousBatchingManager, Scheduler),
                             len(handle.hooks), len(handle._undo),
                             len(getattr(handle, "_per_call", ()))))
    finally:
        handle.detach()
        ph.reset()
    assert per_call == [(0, 4, 3, 0)] * 20
    assert handle.hooks == [] and handle.missing == []
    kv_samples = [s for s in sink.samples() if s.source == "kv"]
    assert len(kv_samples) >= 20  # the KV view stayed on for every call's new cache


def test_repeated_generate_keeps_no_cache_alive(model):
    from transformers import DynamicCache

    handle = attach_transformers(model, sink=ListSink())
    try:
        for _ in range(20):
            ids = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(2))
            model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
            assert _alive(DynamicCache) == 0
            assert (len(handle.hooks), len(handle._undo), handle._seen_requests) == (2, 3, {})
    finally:
        handle.detach()
        ph.reset()


def test_kv_view_uses_the_installed_sink_when_attach_gets_none(model):
    """docs/hooks.md's call, ``attach_transformers(model)`` after ``install()``: full view."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    sink = ListSink()
    ph.configure(sink=sink)
    handle = attach_transformers(model)
    try:
        gen = GenerationConfig(max_new_tokens=2, do_sample=False, eos_token_id=-1, pad_token_id=0)
        model.generate_batch([[1, 2, 3]], generation_config=gen, progress_bar=False,
                             continuous_batching_config=ContinuousBatchingConfig(num_blocks=8))
    finally:
        handle.detach()
        ph.reset()
    assert {e.name for e in sink.events()} >= {"kv_alloc", "kv_free", "request_start"}
    assert any(s.source == "kv" for s in sink.samples())


def test_the_handle_never_says_hooked_when_the_kv_view_is_off(model):
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    ph.reset()  # no install(): no sink anywhere, so the KV view cannot be on
    handle = attach_transformers(model)
    try:
        gen = GenerationConfig(max_new_tokens=2, do_sample=False, eos_token_id=-1, pad_token_id=0)
        model.generate_batch([[1, 2, 3]], generation_config=gen, progress_bar=False,
                             continuous_batching_config=ContinuousBatchingConfig(num_blocks=8))
        assert "paged_attention_cache" not in handle.hooks
        assert any(m.startswith("paged_attention_cache") for m in handle.missing)
    finally:
        handle.detach()


def test_the_generate_wrapper_and_step_hook_hold_nothing_over_1000_requests(model):
    """vramscope's own per-request state stays bounded: 1,000 requests through the wrapper and
    the forward pre-hook (the model's forward itself is not what is measured, so it is skipped:
    the real generate() path is covered 20 calls deep above)."""
    import tracemalloc
    from pathlib import Path

    import vramscope.hooks

    ours = tracemalloc.Filter(True, str(Path(vramscope.hooks.__file__).parent / "*"))
    handle = attach_transformers(model, sink=ListSink(max_records=0))
    calls = []

    def fake_generate(ids):
        handle._forward_pre_hook(model, (ids,), {})  # prefill
        handle._forward_pre_hook(model, (ids[:, :1],), {})  # one decode step
        calls.append(1)
        return ids

    wrapped = handle._generate_wrapper(fake_generate)
    ids = torch.zeros((2, 3), dtype=torch.long)
    try:
        tracemalloc.start()
        for _ in range(1000):  # warm-up: counters, caches and interned ids settle
            wrapped(ids)
        gc.collect()
        before = tracemalloc.take_snapshot().filter_traces([ours])
        for _ in range(1000):
            wrapped(ids)
        gc.collect()
        after = tracemalloc.take_snapshot().filter_traces([ours])
        tracemalloc.stop()
    finally:
        handle.detach()
        ph.reset()
    growth = sum(s.size_diff for s in after.compare_to(before, "lineno"))
    assert len(calls) == 2000 and handle.steps == 4000
    assert ph.requests_in_flight() == () and handle._seen_requests == {}
    assert growth < 1024, f"hooks' memory grew {growth} bytes over 1,000 requests"


def test_generate_reports_the_tokens_its_cache_holds(model):
    """kv_tokens_used on every forward pass (interval 0): rows x (cached + new); 0 at the end."""
    sink = ListSink()
    handle = attach_transformers(model, sink=sink, kv_sample_interval_s=0.0)
    try:
        ids = torch.randint(0, 128, (3, 5), generator=torch.Generator().manual_seed(2))
        model.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False,
                       pad_token_id=0)
    finally:
        handle.detach()
        ph.reset()
    tokens = [s.kv_tokens_used for s in sink.samples() if s.source == "kv"]
    # 24 passes (a prefill of 5 tokens, then one per row each), and the sample as it ended
    assert len(tokens) == 25
    assert tokens[0] == 3 * 5  # the prefill: 3 rows of 5
    assert tokens[19] == 3 * (5 + 19)  # the 20th pass: 19 cached + 1 new per row, 3 rows
    assert tokens[23] == 3 * (5 + 23)
    assert tokens[-1] == 0  # the call ended: its cache is gone
    assert all(s.kv_blocks_used is None and s.pid is not None for s in sink.samples()
               if s.source == "kv")


def test_generate_tokens_rate_limited_and_never_raise(model):
    """The default interval: one sample at the first pass and one at the end; a sink that
    raises never reaches generate()."""

    class Broken(ListSink):
        def put(self, record):
            raise RuntimeError("sink down")

    sink = ListSink()
    handle = attach_transformers(model, sink=sink, kv_sample_interval_s=3600.0)
    try:
        ids = torch.randint(0, 128, (2, 4), generator=torch.Generator().manual_seed(3))
        model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                       pad_token_id=0)
        assert [s.kv_tokens_used for s in sink.samples() if s.source == "kv"] == [8, 0]
        handle.sink = Broken()
        out = model.generate(ids, max_new_tokens=3, min_new_tokens=3, do_sample=False,
                             pad_token_id=0)
        assert out.shape == (2, 7) and handle.kv_tokens.held() == 0
    finally:
        handle.detach()
        ph.reset()
