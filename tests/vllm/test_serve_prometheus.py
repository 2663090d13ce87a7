"""Beside an unmodified ``vllm serve`` (the OpenAI-compatible server, no plugin): the agent's
Prometheus source scrapes its /metrics while requests are served, and the KV usage and running
requests reach the database and the dashboard's timeline (the KV panel's data)."""

from __future__ import annotations

import json
import socket
import sys
import threading
import urllib.request

import pytest
from vramscope.agent.store import Store

from tests.support.waiting import wait_for
from tests.vllm.conftest import Child, scraping_agent, vllm_env

pytestmark = pytest.mark.vllm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def _complete(base: str, model: str, n: int) -> int:
    """One completion of exactly ``n`` tokens (ignore_eos): long enough to be scraped running."""
    body = json.dumps({"model": model, "prompt": list(range(3, 23)), "max_tokens": n,
                       "ignore_eos": True, "temperature": 0}).encode()
    req = urllib.request.Request(f"{base}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return int(json.load(r)["usage"]["completion_tokens"])


@pytest.fixture
def prometheus_agent(tmp_path):
    with scraping_agent("vs-prom-", 0.2) as agent_and_port:
        yield agent_and_port


def test_vllm_serve_metrics_reach_the_database_and_the_dashboard(model_dir, prometheus_agent,
                                                                 tmp_path):
    agent, port = prometheus_agent
    base = f"http://127.0.0.1:{port}"
    args = ["serve", model_dir, "--port", str(port), "--host", "127.0.0.1",
            "--max-model-len", "256", "--enforce-eager", "--dtype", "bfloat16",
            "--served-model-name", "tiny"]
    server = Child([sys.executable, "tests/vllm/serve.py", *args], vllm_env(),
                   str(tmp_path / "serve.log"))
    try:
        wait_for(lambda: _healthy(base, server), timeout_s=420, poll_s=1.0)
        served: list[int] = []
        clients = [threading.Thread(target=lambda: served.append(_complete(base, "tiny", 200)))
                   for _ in range(6)]
        for c in clients:
            c.start()
        with Store.open(agent.db_url) as st:
            # while the six requests run, a scrape sees them and their KV blocks
            busy = wait_for(lambda: [s for s in st.samples(source="prometheus")
                                     if s.kv_blocks_used], timeout_s=240, poll_s=0.2)
            for c in clients:
                c.join(300)
            metrics = _get(f"{base}/metrics")
            # every slot a scrape opened was closed by a later one: nothing left in flight
            wait_for(lambda: _slots(st)[0] >= 1 and _slots(st)[0] == _slots(st)[1],
                     timeout_s=30)
            loads = [e.data for e in st.events(names=("server_load",))]
            samples = st.samples(source="prometheus")
    finally:
        server.terminate()
    assert served == [200] * 6
    blocks = int(_label(metrics, "vllm:cache_config_info", "num_gpu_blocks"))
    assert {s.kv_blocks_total for s in samples} == {blocks - 1}
    # 20 + 200 tokens in 128-token blocks: 1 block a request in its first 108 tokens, then 2
    # (the first busy scrape may see only the first: every scrape of the run is counted)
    assert busy and 2 <= max(s.kv_blocks_used or 0 for s in samples) <= 12
    assert max(d["running"] for d in loads) >= 1 and loads[-1]["running"] == 0
    assert samples[-1].kv_blocks_used == 0

    from vramscope.dashboard.app import create_app

    with Store.open(agent.db_url) as st:
        doc = create_app(None, st).test_client().get(
            "/api/v1/timeline?device=0&span=600").get_json()
    kv = doc["series"]["kv_blocks_used"]
    assert max(kv["max"]) >= 2 and doc["series"]["kv_blocks_total"]["max"][-1] == blocks - 1


def _healthy(base: str, server: Child) -> bool:
    if server.proc.poll() is not None:
        raise AssertionError("vllm serve exited:\n" + "".join(server.lines[-40:]))
    try:
        _get(f"{base}/health")
        return True
    except OSError:
        return False


def _slots(st: Store) -> tuple[int, int]:
    return (len(st.events(names=("request_start",))), len(st.events(names=("request_end",))))


def _label(text: str, metric: str, label: str) -> str:
    line = next(x for x in text.splitlines() if x.startswith(metric + "{"))
    return line.split(f'{label}="', 1)[1].split('"', 1)[0]
