"""The vLLM plugin's parts that need no vLLM: when it is on, how a step's tokens split, and that
it degrades to one log line per part where vLLM is absent or different. The plugin inside a real
engine is tested in tests/vllm (its own venv)."""

from __future__ import annotations

import importlib.util
import logging
import sys
from types import SimpleNamespace

import pytest
from vramscope.hooks import vllm_plugin
from vramscope.hooks.vllm_observer import VllmObserver
from vramscope.hooks.vllm_plugin import enabled
from vramscope.hooks.vllm_reads import split_tokens


@pytest.mark.parametrize(("env", "on"), [
    ({}, False),
    ({"VRAMSCOPE_VLLM": "1"}, True),
    ({"VRAMSCOPE_VLLM": "true"}, True),
    ({"VRAMSCOPE_VLLM": "0", "VLLM_PLUGINS": "vramscope"}, False),  # an explicit no wins
    ({"VLLM_PLUGINS": "lora_filesystem_resolver, vramscope"}, True),
    ({"VLLM_PLUGINS": "lora_filesystem_resolver"}, False),
    ({"VLLM_PLUGINS": ""}, False),
])
def test_off_unless_asked_for(env, on):
    assert enabled(env) is on


def _req(prompt: int, tokens: int, computed_after: int):
    return SimpleNamespace(num_prompt_tokens=prompt, num_tokens=tokens,
                           num_computed_tokens=computed_after)


def test_a_mixed_step_splits_prompt_chunks_recompute_and_decode():
    requests = {
        "new": _req(40, 40, 40),  # whole prompt in one step: 40 prefill
        "chunk": _req(100, 100, 64),  # second chunk 32..64 of a 100-token prompt: 32 prefill
        "dec": _req(10, 15, 15),  # decodes the token sampled last step: 1 decode
        "last": _req(10, 11, 11),  # first decode right after its prefill: 1 decode
        "resumed": _req(10, 14, 14),  # preempted, recomputes prompt + 3 outputs: 13 + 1
        "spec": _req(10, 20, 22),  # one sampled + two speculative tokens: 3 decode
    }
    scheduled = {"new": 40, "chunk": 32, "dec": 1, "last": 1, "resumed": 14, "spec": 3}
    assert split_tokens(requests, scheduled) == (40 + 32 + 13, 1 + 1 + 1 + 3)
    assert split_tokens(requests, {}) == (0, 0)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                    reason="vLLM is installed here: tests/vllm covers the real engine")
def test_without_vllm_each_part_says_once_why_it_is_off(caplog, monkeypatch):
    obs = VllmObserver()
    with caplog.at_level(logging.INFO, logger="vllm.plugins.vramscope"):
        obs.patch_all()
        obs.patch_all()
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(" not observed")[0] for line in lines] == [
        "vramscope: vLLM worker", "vramscope: vLLM scheduler", "vramscope: vLLM step_boundary",
        "vramscope: vLLM kv_cache_manager", "vramscope: vLLM block_pool"]
    assert "not importable" in lines[0] and "the rest still works" in lines[0]
    assert set(obs.parts) == {"worker", "scheduler", "step_boundary", "kv_cache_manager",
                              "block_pool"}
    monkeypatch.setenv("VRAMSCOPE_VLLM", "1")
    monkeypatch.setattr(vllm_plugin, "_OBSERVER", [obs])
    vllm_plugin.register()  # never raises into vLLM's plugin loader


def test_a_class_that_lacks_a_method_is_left_untouched(caplog):
    class Scheduler:
        def schedule(self):
            return "scheduled"

    module = SimpleNamespace(Scheduler=Scheduler)
    obs = VllmObserver()
    sys.modules["_vs_fake_sched"] = module  # type: ignore[assignment]
    try:
        with caplog.at_level(logging.INFO, logger="vllm.plugins.vramscope"):
            obs._patch_module("scheduler", "_vs_fake_sched", "Scheduler", {
                "schedule": obs._wrap_schedule, "add_request": obs._after_request(obs._started)})
    finally:
        del sys.modules["_vs_fake_sched"]
    assert Scheduler.schedule.__name__ == "schedule" and not hasattr(Scheduler.schedule,
                                                                     "__wrapped__")
    assert obs.parts == {"scheduler": "Scheduler has no add_request"}
    assert len(caplog.records) == 1
