"""attach_transformers on a tiny random-weight Llama on CPU: generate() and generate_batch()."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agent.records import Phase
from hooks import phase as ph
from hooks.sink import ListSink
from hooks.transformers_integration import attach_transformers, classify_step

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model():
    from tests.tiny_models import tiny_llama

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
