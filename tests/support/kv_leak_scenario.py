"""Issue 44's KV-pool leak as a new user meets it: a real ``vramscope agent --no-nvml`` (its
socket, SQLite in a temporary folder) beside two real CPU servers (``tests.support.kv_server``),
one of which never frees every other request.

Everything a test asserts follows from the constants: the leaky server leaks
``BLOCKS_PER_REQUEST`` blocks every ``LEAK_EVERY`` requests of one per ``PERIOD_S``, so its pool
check's latest count is ``ORPHANED`` and the blocks pile up at ``BLOCKS_PER_S``; the pool then
has ``FREE_BLOCKS`` blocks not in use. The healthy server goes on after the leaky one is done,
so the agent sees records of the device after the leaky one went quiet.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from vramscope.agent.store import Store
from vramscope.agent.store import verdicts as stored
from vramscope.hooks.kvpool_types import kv_cache_bytes

from tests.support import kv_server as server
from tests.support.waiting import wait_for
from tools.agent_process import REPO_ROOT, AgentProcess

PERIOD_S = 0.25
LEAK_EVERY = 2
LEAKY_REQUESTS = 80  # 20 s
HEALTHY_REQUESTS = 140  # 35 s: past the leaky one's last check by more than ORPHAN_ROW_S
ORPHANED = LEAKY_REQUESTS // LEAK_EVERY * server.BLOCKS_PER_REQUEST  # 160
BLOCKS_PER_S = server.BLOCKS_PER_REQUEST / (LEAK_EVERY * PERIOD_S)  # 8
BYTES_PER_BLOCK = kv_cache_bytes(server.POOL_SHAPE["num_layers"],
                                 server.POOL_SHAPE["num_kv_heads"],
                                 server.POOL_SHAPE["head_dim"], server.BLOCK_SIZE, 4)  # float32
FREE_BLOCKS = server.NUM_BLOCKS - ORPHANED  # 864
# the pool's check after every leaky request from the first leaked one, then the last one
REPORTS = LEAKY_REQUESTS - (LEAK_EVERY - 1) + 1


@dataclass
class Recorded:
    agent: AgentProcess
    db_url: str
    socket_path: str
    healthy_pid: int
    leaky_pid: int
    started_s: float  # wall clock, before either server started
    leaky_done_s: float  # wall clock, once the leaky server printed its last count


def _start(name: str, requests: int, leak_every: int, socket_path: str) -> subprocess.Popen[str]:
    env = {**os.environ, "VRAMSCOPE_AGENT_SOCKET_PATH": socket_path}
    return subprocess.Popen([sys.executable, "-m", "tests.support.kv_server", name,
                             str(requests), str(leak_every), str(PERIOD_S)],
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=str(REPO_ROOT))


def stored_leak(db_url: str, pid: int) -> dict | None:
    """The leak answer of ``pid``'s newest stored verdict on device 0 (None: none yet)."""
    with Store.open(db_url) as st:
        rows = stored.latest(st, 0, None, time.time() + 3600)
    return next((v.to_json()["leak"] for v in rows if v.pid == pid), None)


@contextmanager
def recorded(folder: str) -> Iterator[Recorded]:
    """The agent and both servers running (the servers idle once done) until the block ends;
    yields once the leaky server's latest count is stored."""
    socket_path, db_url = f"{folder}/run/agent.sock", f"sqlite:///{folder}/vs.db"
    agent = AgentProcess(db_url, socket_path, log_path=f"{folder}/agent.log").start()
    started = time.time()
    servers = [_start("healthy", HEALTHY_REQUESTS, 0, socket_path),
               _start("leaky", LEAKY_REQUESTS, LEAK_EVERY, socket_path)]
    try:
        healthy, leaky = (int(p.stdout.readline()) for p in servers)  # type: ignore[union-attr]
        said = servers[1].stdout.readline().split()  # type: ignore[union-attr]
        assert said == ["done", str(ORPHANED), str(ORPHANED)], said
        done = time.time()
        wait_for(lambda: (stored_leak(db_url, leaky) or {}).get("orphaned_blocks") == ORPHANED,
                 timeout_s=60.0, poll_s=0.5)
        yield Recorded(agent, db_url, socket_path, healthy, leaky, started, done)
    finally:
        for p in servers:
            p.stdin.close()  # type: ignore[union-attr]
            p.wait(timeout=30)
        agent.stop()
