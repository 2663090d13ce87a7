"""What the dashboard shows of a real vLLM server (issue 33), on the database a real engine and a
real agent fill: the plugin's records (device 0) and the Prometheus source's scrapes of the same
server (device 1, ``sources.prometheus.device``). Two bursts of requests with 30 s of silence
between them and after them, then the dashboard's own API, as the pages read it: the idle
server is idle (not stale) while the agent and the client are connected; the server process is
named with its port and model, and so is the process the Prometheus source scrapes (its pid
found by the port); the timeline draws KV as steps with a gap where the plugin sent
nothing, and running / waiting requests for both sources. The browser side of the same
documents is tests/dashboard/browser/test_vllm_pages.py (scripted database)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from vramscope.agent.store import Store

from tests.support.waiting import wait_for
from tests.vllm.conftest import Child, scraping_agent, vllm_env
from tests.vllm.test_kv_agreement import _load, server_args
from tests.vllm.test_serve_prometheus import _healthy

pytestmark = pytest.mark.vllm

QUIET_S = 32.0  # longer than the dashboard's stale_after_s (25 s with the defaults)


@pytest.fixture
def agent_with_scrapes():
    with scraping_agent("vs-dash-", 0.5, device=1) as agent_and_port:
        yield agent_and_port


def _burst(base: str, seconds: float) -> int:
    stop, done = threading.Event(), []
    threads = [threading.Thread(target=_load, args=(base, stop, done)) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(300)
    return len(done)


def _trace(fig, name):
    (t,) = [t for t in fig["data"] if t["name"] == name]
    return t


def test_the_dashboard_of_a_real_vllm_server(model_dir, agent_with_scrapes, tmp_path):
    from vramscope.dashboard import timeline as tl
    from vramscope.dashboard.app import create_app

    agent, port = agent_with_scrapes
    base = f"http://127.0.0.1:{port}"
    env = vllm_env(VRAMSCOPE_VLLM="1", VRAMSCOPE_AGENT_SOCKET_PATH=agent.socket_path)
    server = Child([sys.executable, *server_args(model_dir, port)], env,
                   str(tmp_path / "server.log"))
    try:
        wait_for(lambda: _healthy(base, server), timeout_s=420, poll_s=1.0)
        t0 = time.time()
        first = _burst(base, 6.0)
        time.sleep(QUIET_S)
        second = _burst(base, 3.0)
        time.sleep(QUIET_S)
        end = time.time()
        with Store.open(agent.db_url) as st:
            c = create_app(None, st).test_client()
            overview = c.get("/api/v1/overview").get_json()
            figs = {d: c.get(f"/api/v1/figures/timeline?device={d}&start={t0 - 5}"
                             f"&end={end}&max_points=400").get_json() for d in (0, 1)}
    finally:
        server.terminate()
    assert first and second
    rows = {r["device"]: r for r in overview["devices"]}
    # the plugin sent nothing for 32 s: idle, not stale (the agent and the server connected);
    # the scrapes of device 1 never stop
    assert (rows[0]["freshness"], rows[0]["stale"]) == ("idle", False)
    assert rows[1]["freshness"] == "live" and overview["freshness"]["state"] == "live"
    assert rows[0]["kv_usage_ratio"] == 0.0 and rows[1]["kv_usage_ratio"] == 0.0
    names = {p["name"]: p for p in overview["processes"]}
    core = names[f"vllm engine core (port {port})"]
    assert (core["model"], core["state"]) == (model_dir, "connected")
    assert names[f"vllm worker rank 0 (port {port})"]["state"] == "connected"
    # the Prometheus source's view of the same server: the process listening on the port (the
    # API server, which the plugin does not enter), found in /proc, with the model its metrics
    # name (vLLM labels them with --served-model-name), connected while the scrapes answer,
    # its KV usage now and its requests per minute
    scraped = names[f"vllm server (port {port})"]
    assert (scraped["pid"], scraped["model"], scraped["state"]) == (
        server.proc.pid, "tiny", "connected")
    assert scraped["kv_usage_ratio"] == 0.0 and scraped["requests_per_min"] >= 1  # 2nd burst

    plugin = figs[0]
    used = _trace(plugin, "KV blocks used")
    assert used["line"]["shape"] == "hv"
    bucket_s = plugin["layout"]["meta"]["bucket_s"]
    points = [(x / 1000, y) for x, y in zip(used["x"], used["y"])]
    gap_s = tl.GAP_FACTOR * bucket_s * 4  # generous: the series' usual spacing is a bucket
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if y0 is not None and y1 is not None:
            assert x1 - x0 <= gap_s, (x0, x1, bucket_s)
    assert sum(1 for _, y in points if y is None) >= 1  # the 32 s between the bursts
    assert max(y for _, y in points if y is not None) >= 32  # 8 x 220 tokens: the pool fills
    for fig in figs.values():
        running = _trace(fig, "running requests")
        assert running["line"]["shape"] == "hv" and max(running["y"]) >= 4
        assert running["y"][-1] == 0
        _trace(fig, "waiting requests")
    scraped = _trace(figs[1], "KV blocks used")
    assert scraped["line"]["shape"] == "hv"
    out = os.environ.get("VRAMSCOPE_VLLM_RECORDING_OUT")
    if out:  # refresh tests/data/vllm_idle_server.jsonl.gz (the browser test's recording)
        subprocess.run([sys.executable, "-m", "vramscope", "export", "--db", agent.db_url,
                        "-o", out], check=True)
