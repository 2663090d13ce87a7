"""Crash test: SIGKILL the agent at random points of a fast replay, again and again.

After every kill the SQLite database passes ``PRAGMA integrity_check``, still holds every row
that was committed before the kill, and a restarted agent resumes ingesting. Each kill loses at
most the documented bound (docs/agent.md, "SIGKILL"): ``agent.queue_max_records`` +
``agent.batch_rows`` records the agent had read, plus what still sat unread in the socket's
kernel buffers.
"""

from __future__ import annotations

import random
import signal
import socket
import sqlite3
import threading
import time

from vramscope.agent.ingest.connection import AgentConnection
from vramscope.agent.ingest.protocol import records_message
from vramscope.agent.records import Phase, Sample
from vramscope.agent.settings import SETTINGS

from tools.agent_process import AgentProcess

KILLS = 20
_DEFAULTS = {s.key: s.default for s in SETTINGS}
QUEUE_MAX_RECORDS = _DEFAULTS["agent.queue_max_records"]
BATCH_ROWS = _DEFAULTS["agent.batch_rows"]


BATCH = 500


class _Sender(threading.Thread):
    """Replay samples as fast as the socket takes them until the agent dies; ``sent`` counts
    the records whose send completed, ``buffer_bytes`` what the kernel may hold unread."""

    def __init__(self, path: str, start_ts: float) -> None:
        super().__init__(daemon=True)
        self.path, self.start_ts, self.sent, self.stop = path, start_ts, 0, threading.Event()
        self.buffer_bytes = 0

    def run(self) -> None:
        try:
            with AgentConnection(self.path, timeout_s=5.0) as conn:
                conn.hello("crash-replay", [0])
                self.buffer_bytes = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
                while not self.stop.is_set():
                    conn.send_records(_batch(self.start_ts, self.sent))
                    self.sent += BATCH
        except OSError:
            pass  # killed under us: expected


def _batch(start_ts: float, first: int) -> list[Sample]:
    return [Sample(start_ts + (first + k) * 1e-3, 0, Phase.DECODE, "torch",
                   allocated_bytes=first + k) for k in range(BATCH)]


def _committed(db_path: str, since_ts: float = 0.0) -> int:
    with sqlite3.connect(db_path, timeout=10) as conn:
        return conn.execute("SELECT count(*) FROM samples WHERE source='torch' AND ts_s >= ?",
                            (since_ts,)).fetchone()[0]


def _loss_bound(buffer_bytes: int) -> int:
    """The documented bound: the queue, the batch in flight, and the records that fit in the
    socket's kernel buffers (the client's send buffer plus the agent's receive buffer, which
    Linux sizes alike for a Unix socket pair)."""
    record_bytes = len(records_message(_batch(0.0, 0))) / BATCH
    unread = int(2 * buffer_bytes / record_bytes) + BATCH
    return QUEUE_MAX_RECORDS + BATCH_ROWS + unread


def _integrity(db_path: str) -> str:
    with sqlite3.connect(db_path, timeout=10) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


def test_sigkill_during_replay_never_corrupts_or_loses_committed_rows(short_dir):
    rng = random.Random(1234)
    db_path = f"{short_dir}/vramscope.db"
    proc = AgentProcess(f"sqlite:///{db_path}", f"{short_dir}/run/agent.sock",
                        log_path=f"{short_dir}/agent.log")
    floor, losses = 0, []
    for kill in range(KILLS):
        proc.start()
        # each kill's rows after the last's (3,000 s: 3 million rows 1 ms apart), all of them
        # inside the agent's window (a day back) and younger than retention's raw_s
        start_ts = time.time() - (KILLS - kill) * 3000
        sender = _Sender(proc.socket_path, start_ts)
        sender.start()
        time.sleep(rng.uniform(0.05, 0.4))
        before = _committed(db_path)
        proc.stop(signal.SIGKILL)
        sender.stop.set()
        sender.join(10)
        assert _integrity(db_path) == "ok", f"kill {kill}"
        after = _committed(db_path)
        assert after >= before >= floor, f"kill {kill}: {before} committed, {after} after"
        floor = after
        lost = sender.sent - _committed(db_path, start_ts)
        losses.append(lost)
        assert 0 <= lost <= _loss_bound(sender.buffer_bytes), f"kill {kill}: lost {lost}"
    print(f"records lost per SIGKILL: max {max(losses)}, median {sorted(losses)[KILLS // 2]}, "
          f"bound {_loss_bound(sender.buffer_bytes)}")
    assert floor > 0  # the kills landed while rows were being written
    with proc:  # restarts on the same database and socket, and resumes
        with AgentConnection(proc.socket_path) as conn:
            conn.hello("after-crashes", [0])
            conn.send_records([Sample(time.time(), 0, Phase.IDLE, "torch", allocated_bytes=1)])
            conn.status()  # a round trip: the agent has read the record
    assert _committed(db_path) == floor + 1  # the clean stop flushed the last record
