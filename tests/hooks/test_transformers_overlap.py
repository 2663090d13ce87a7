"""generate() from several threads: the server is idle only when no request is in flight."""

from __future__ import annotations

import pytest
from vramscope.agent.records import Phase
from vramscope.hooks import phase as ph
from vramscope.hooks.sink import ListSink
from vramscope.hooks.transformers_integration import attach_transformers

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_a_request_ending_while_another_is_in_flight_does_not_enter_idle():
    from tests.support.tiny_models import tiny_llama

    model = tiny_llama()
    sink = ListSink()
    ph.configure(sink=sink)
    handle = attach_transformers(model, sink=sink)
    try:
        ph.request_started("other-thread")  # another client's request, still running
        ids = torch.tensor([[1, 2, 3, 4]])
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2,
                       do_sample=False, pad_token_id=0)
        phases = [e.phase for e in sink.events() if e.name == "phase"]
        assert phases[0] is Phase.PREFILL and Phase.IDLE not in phases  # no idle after it
        assert ph.current_phase() is not Phase.IDLE
        ph.request_finished("other-thread")
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2,
                       do_sample=False, pad_token_id=0)
        assert ph.current_phase() is Phase.IDLE  # the last request out: idle
    finally:
        handle.detach()
        ph.reset()
