"""Crash test: SIGKILL the agent at random points of a fast replay, again and again.

After every kill the SQLite database passes ``PRAGMA integrity_check``, still holds every row
that was committed before the kill, and a restarted agent resumes ingesting.
"""

from __future__ import annotations

import random
import shutil
import signal
import sqlite3
import tempfile
import threading
import time

import pytest
from vramscope.agent.ingest.connection import AgentConnection
from vramscope.agent.ingest.process import AgentProcess
from vramscope.agent.records import Phase, Sample

KILLS = 20


def _sender(path: str, start_ts: float, stop: threading.Event) -> None:
    """Replay samples as fast as the socket takes them until the agent dies."""
    try:
        with AgentConnection(path, timeout_s=5.0) as conn:
            conn.hello("crash-replay", [0])
            i = 0
            while not stop.is_set():
                conn.send_records([Sample(start_ts + (i + k) * 1e-3, 0, Phase.DECODE, "torch",
                                          allocated_bytes=i + k) for k in range(500)])
                i += 500
    except OSError:
        pass  # killed under us: expected


def _committed(db_path: str) -> int:
    with sqlite3.connect(db_path, timeout=10) as conn:
        return conn.execute("SELECT count(*) FROM samples WHERE source='torch'").fetchone()[0]


def _integrity(db_path: str) -> str:
    with sqlite3.connect(db_path, timeout=10) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


@pytest.fixture
def short_dir():
    root = tempfile.mkdtemp(prefix="vs-crash-", dir="/tmp")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_sigkill_during_replay_never_corrupts_or_loses_committed_rows(short_dir):
    rng = random.Random(1234)
    db_path = f"{short_dir}/vramscope.db"
    proc = AgentProcess(f"sqlite:///{db_path}", f"{short_dir}/run/agent.sock",
                        log_path=f"{short_dir}/agent.log")
    floor = 0
    for kill in range(KILLS):
        proc.start()
        stop = threading.Event()
        start_ts = time.time() + kill * 1e4  # recent: retention must not touch these rows
        sender = threading.Thread(target=_sender, args=(proc.socket_path, start_ts, stop))
        sender.start()
        time.sleep(rng.uniform(0.05, 0.4))
        before = _committed(db_path)
        proc.stop(signal.SIGKILL)
        stop.set()
        sender.join(10)
        assert _integrity(db_path) == "ok", f"kill {kill}"
        after = _committed(db_path)
        assert after >= before >= floor, f"kill {kill}: {before} committed, {after} after"
        floor = after
    assert floor > 0  # the kills landed while rows were being written
    with proc:  # restarts on the same database and socket, and resumes
        with AgentConnection(proc.socket_path) as conn:
            conn.hello("after-crashes", [0])
            conn.send_records([Sample(time.time(), 0, Phase.IDLE, "torch", allocated_bytes=1)])
            conn.status()  # a round trip: the agent has read the record
    assert _committed(db_path) == floor + 1  # the clean stop flushed the last record
