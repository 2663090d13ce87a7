"""The KV pool's allocation and warm-up before the first scheduled step is ``setup``, never idle.

On the landed code the first generate_batch call's set-up was tagged ``unknown`` and every later
one ``idle``, so the idle phase showed the pool's 120 GB as its peak (issue 13).
"""

from __future__ import annotations

import pytest
from vramscope.agent.records import Phase
from vramscope.hooks import phase as ph
from vramscope.hooks.sink import ListSink
from vramscope.hooks.transformers_integration import attach_transformers

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model():
    from tests.support.tiny_models import tiny_llama

    return tiny_llama()


def test_each_generate_batch_call_starts_in_setup(model):
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    ph.reset()
    sink = ListSink()
    handle = attach_transformers(model, sink=sink)
    gen = GenerationConfig(max_new_tokens=2, do_sample=False, eos_token_id=-1, pad_token_id=0)
    try:
        for _ in range(2):
            model.generate_batch([[1, 2, 3]], generation_config=gen, progress_bar=False,
                                 continuous_batching_config=ContinuousBatchingConfig(num_blocks=8))
    finally:
        handle.detach()
        ph.reset()
    entered = [e.phase for e in sink.events() if e.name == "phase"]
    first_prefill = entered.index(Phase.PREFILL)
    assert entered[:first_prefill + 1] == [Phase.SETUP, Phase.PREFILL]
    second = entered[first_prefill:]
    # the second call: idle after the first, then setup again before its own first step
    i = second.index(Phase.IDLE)
    assert second[i:i + 3] == [Phase.IDLE, Phase.SETUP, Phase.PREFILL]
    assert entered[-1] is Phase.IDLE
    setup_spans = [e.data for e in sink.events()
                   if e.name == "phase" and e.data["ended_phase"] == "setup"]
    # no token is processed in setup: the first scheduled step ends it
    assert [(d["ended_prefill_tokens"], d["ended_decode_tokens"]) for d in setup_spans] == [
        (0, 0), (0, 0)]


def test_setup_does_not_override_a_running_step(model):
    """A second manager created while another one decodes leaves the phase alone."""
    ph.reset()
    handle = attach_transformers(model, sink=ListSink())
    try:
        ph.set_phase(Phase.DECODE)
        model.init_continuous_batching()
        assert ph.current_phase() is Phase.DECODE
    finally:
        handle.detach()
        ph.reset()
