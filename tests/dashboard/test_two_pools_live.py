"""Issue 47 item 6 tried as a new user would: two CPU servers, each with ``vramscope.install()``
and its own ``KVBlockPool`` (63 and 16,384 blocks) observed by a ``KVSource``, beside a real
``vramscope agent --no-nvml``; each server keeps ``REQUESTS`` requests of
``BLOCKS_PER_REQUEST`` blocks (never freed), so each pool ends holding ``HELD`` blocks: 95.2 %
of the small pool, 0.37 % of the big one (their sum, 0.73 % of 16,447, would hide the small
pool nearly full). The dashboard reads the agent's database as it stored them: each pool
apart by pid in the timeline document and the Overview's device row, and ``/metrics`` with a
series per server that ``promtool`` passes, no label set twice.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families
from vramscope.agent.config import parse_config
from vramscope.agent.store import Store
from vramscope.dashboard.app import create_app

from tests.support import kv_server as server
from tests.support.tools import require_tool
from tests.support.waiting import wait_for
from tools.agent_process import REPO_ROOT, AgentProcess

SIZES = (63, 16_384)  # blocks: the small pool's server starts first
REQUESTS = 15
PERIOD_S = 0.1
HELD = REQUESTS * server.BLOCKS_PER_REQUEST  # 60 blocks each, every request kept


def _start(size: int, socket_path: str) -> subprocess.Popen[str]:
    env = {**os.environ, "VRAMSCOPE_AGENT_SOCKET_PATH": socket_path}
    return subprocess.Popen([sys.executable, "-m", "tests.support.kv_server", f"pool{size}",
                             str(REQUESTS), "1", str(PERIOD_S), str(size)],
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=str(REPO_ROOT))


@pytest.fixture(scope="module")
def run():
    """Both servers done and idle (still connected), the agent's database holding both pools'
    last readings; yields ``(db_url, {pid: size}, started_s)``."""
    folder = tempfile.mkdtemp(prefix="vs-pools-", dir="/tmp")  # a short socket path
    socket_path, db_url = f"{folder}/run/agent.sock", f"sqlite:///{folder}/vs.db"
    agent = AgentProcess(db_url, socket_path, log_path=f"{folder}/agent.log").start()
    started = time.time()
    servers = [_start(size, socket_path) for size in SIZES]
    try:
        pids = {int(p.stdout.readline()): size  # type: ignore[union-attr]
                for p, size in zip(servers, SIZES)}
        for p in servers:
            said = p.stdout.readline().split()  # type: ignore[union-attr]
            assert said[0] == "done" and said[2] == str(HELD), said
        wait_for(lambda: _newest_used(db_url) == {pid: HELD for pid in pids}, timeout_s=30.0,
                 poll_s=0.2)
        yield db_url, pids, started
    finally:
        for p in servers:
            p.stdin.close()  # type: ignore[union-attr]
            p.wait(timeout=30)
        agent.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _newest_used(db_url: str) -> dict[int, int]:
    with Store.open(db_url) as st:
        samples = st.samples(device=0, source="kv")
    return {s.pid: s.kv_blocks_used for s in sorted(samples, key=lambda s: s.ts_s)}


def _client(db_url: str):
    return create_app(parse_config({}, None, {}), Store.open(db_url)).test_client()


def test_each_pool_is_read_apart_by_pid(run):
    db_url, pids, started = run
    small, big = sorted(pids, key=pids.get)
    client = _client(db_url)
    (row,) = client.get("/api/v1/devices").get_json()["devices"]
    assert row["kv_usage_ratio"] == HELD / 63  # the fullest pool's: not 120 / 16,447
    assert sorted((p["pid"], p["kv_blocks_used"], p["kv_blocks_total"])
                  for p in row["kv_pools"]) == sorted([(small, HELD, 63), (big, HELD, 16_384)])
    end = time.time() + 1
    doc = client.get(f"/api/v1/timeline?device=0&start={started - 1}&end={end}"
                     "&max_points=200").get_json()
    assert doc["several_kv_pools"] is True and doc["kv_pool_pids"] == sorted(pids)
    pools = {p["pid"]: p for p in doc["kv_pools"]}
    assert {pid: p["blocks_total"] for pid, p in pools.items()} == pids
    for pid, size in pids.items():
        ratio = pools[pid]["series"]["kv_used_ratio"]
        assert ratio["max"][-1] == HELD / size  # each pool's last share, of its own size
        assert ratio["used"][-1] == HELD and set(ratio["total"]) == {size}
        assert max(ratio["max"]) == HELD / size  # it only grew
    fig = client.get(f"/api/v1/figures/timeline?device=0&start={started - 1}&end={end}"
                     "&max_points=200").get_json()
    kv = sorted(t["name"] for t in fig["data"] if t.get("yaxis") == "y3")
    assert len(kv) == 2 and f"(pid {small}) · KV used of its 63 blocks" in kv[0] + kv[1]
    assert f"(pid {big}) · KV used of its 16,384 blocks" in kv[0] + kv[1]


def test_metrics_give_each_server_its_pool_and_promtool_passes(run):
    db_url, pids, _ = run
    text = _client(db_url).get("/metrics").get_data(as_text=True)
    families = {f.name: f.samples for f in text_string_to_metric_families(text)}
    capacity = {int(s.labels["pid"]): s.value
                for s in families["vramscope_process_kv_blocks_capacity"]}
    used = {int(s.labels["pid"]): s.value for s in families["vramscope_process_kv_blocks_used"]}
    assert capacity == pids and used == {pid: HELD for pid in pids}
    seen = Counter((s.name, tuple(sorted(s.labels.items())))
                   for samples in families.values() for s in samples)
    assert [k for k, n in seen.items() if n > 1] == []
    promtool = require_tool("promtool")
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and (out.stdout + out.stderr).strip() == "", out.stdout + out.stderr
