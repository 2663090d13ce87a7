"""Issue 44, item 4, as a user meets it: a CPU server with ``vramscope.install()`` (a KV pool's
samples on device 0) exits beside a real ``vramscope agent --no-nvml``, without calling
``uninstall()``: the interpreter's exit says so, and the stored verdict row that ends it is at
the exit, not a minute of silence later."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

from vramscope.agent.store import Store
from vramscope.agent.store import verdicts as stored

from tests.support.waiting import wait_for
from tools.agent_process import REPO_ROOT, AgentProcess

SERVER = textwrap.dedent("""
    import os, time
    from vramscope.agent.records import Phase, Sample
    from vramscope.hooks.phase import active_sink
    import vramscope
    report = vramscope.install()
    assert report.active("sink"), str(report)
    for i in range(20):  # a KV pool's samples, as a KVSource puts them
        active_sink().put(Sample(time.time(), 0, Phase.IDLE, "kv", kv_blocks_used=10 + i,
                                 kv_blocks_total=100))
        time.sleep(0.05)
    print(os.getpid(), time.time(), flush=True)
""")


def _rows(db_url: str, pid: int) -> list:
    with Store.open(db_url) as st:
        return [v for v in stored.latest(st, 0, None, time.time() + 3600) if v.pid == pid]


def test_the_stored_row_ends_the_server_at_its_exit():
    folder = tempfile.mkdtemp(prefix="vs-exit-", dir="/tmp")  # a short socket path
    socket_path, db_url = f"{folder}/run/agent.sock", f"sqlite:///{folder}/vs.db"
    agent = AgentProcess(db_url, socket_path, log_path=f"{folder}/agent.log").start()
    try:
        env = {**os.environ, "VRAMSCOPE_AGENT_SOCKET_PATH": socket_path,
               "PYTHONPATH": str(REPO_ROOT)}
        proc = subprocess.run([sys.executable, "-c", SERVER], env=env, cwd=str(REPO_ROOT),
                              capture_output=True, text=True, timeout=120)
        exited_s = time.time()
        assert proc.returncode == 0, proc.stderr
        pid, last_put_s = int(proc.stdout.split()[0]), float(proc.stdout.split()[1])
        rows = wait_for(lambda: [v for v in _rows(db_url, pid) if v.ended] or None,
                        timeout_s=30.0, poll_s=0.25)
    finally:
        agent.stop()
        shutil.rmtree(folder, ignore_errors=True)
    (row,) = rows
    # between the server's last sample and its exit: seconds, not PROCESS_GONE_S later
    assert last_put_s <= row.ts_s <= exited_s
    assert row.risk_level == "ok" and row.ended
