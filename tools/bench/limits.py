"""``vramscope bench limits``: the per-client and per-name limits of a real agent (issue 45).

Against a real ``vramscope agent`` process (``--no-nvml``, SQLite), at the default settings:

1. Churn: ``N`` short-lived processes (1,000; ``--quick`` 300) each connect, send one record
   under their own pid and go, as server restarts and replays do; then a new server sends 100
   records. Figure: the share of them stored (target 100 %; with limits counted over the
   agent's life it was 0 % after 256).
   ``--quick`` runs 2 and 3 with a 1 s handshake timeout, 2 s of chatter and a 2 s flood.
2. Fairness: a quiet client (a record every 8 s) and 255 clients of the same uid each sending
   a small message with no records every 3 s hold every slot; after they held them for 10 s,
   a good client tries every 2 s. Figures: seconds until it is in (target <= 5; the chatterers
   kept it out for the whole 80 s before) and whether the quiet client kept its slot.
3. Write budget: one client sends 60 kB custom events as fast as the socket takes them for
   20 s while a neighbour sends 1,000 samples a second. Figures: the flooder's accepted bytes a
   second (target: its budget, 2 MiB/s, plus its burst spread over the run), the share of
   the neighbour's samples stored (target 100 %), and the database's growth over the flood
   (its file and WAL; target: ``WriteBudget.growth_bound_bytes``, the documented bound of one
   client's growth, plus the neighbour's samples at the same per-row cost).
4. A hostile scrape page and a hung webhook receiver (:mod:`tools.bench.hostile`):
   the agent's RSS under ``vllm:num_requests_running 1e9`` (target within 10 % of idle) and a
   good client's samples written (target 100 %); an OOM alert, and every alert's newest state,
   delivered after 5 minutes of flapping against a receiver that hung and recovered (target
   <= 10 s).
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from vramscope.agent.ingest import protocol as proto
from vramscope.agent.ingest.budget import (
    DEFAULT_BURST_S,
    DEFAULT_BYTES_PER_S,
    STORED_ROW_BYTES,
    WriteBudget,
)
from vramscope.agent.ingest.connection import AgentConnection
from vramscope.agent.records import Event, Phase, Sample

from tools.agent_process import AgentProcess
from tools.bench import BenchOptions, Figure, hostile

BLOB = "x" * 60_000
FLOOD_S = 20.0  # long enough that the 10 s burst is not most of what is kept


def run(options: BenchOptions) -> list[Figure]:
    workdir = tempfile.mkdtemp(prefix="vs-bench-", dir="/tmp")  # short: AF_UNIX path limit
    try:
        return [*_churn(options, workdir), *_fairness(options, workdir),
                *_budget(options, workdir), *hostile.figures(options)]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _agent(workdir: str, name: str, quick: bool = False) -> AgentProcess:
    env = {"VRAMSCOPE_AGENT_HANDSHAKE_TIMEOUT_S": "1.0"} if quick else {}
    return AgentProcess(f"sqlite:///{workdir}/{name}.db", f"{workdir}/{name}/agent.sock",
                        log_path=f"{workdir}/{name}.log", env=env).start()


def _rows(db: str, sql: str) -> int:
    with sqlite3.connect(db, timeout=30) as c:
        return int(c.execute(sql).fetchone()[0])


def _wait_rows(db: str, sql: str, want: int, timeout_s: float = 30.0) -> int:
    deadline = time.monotonic() + timeout_s
    while (got := _rows(db, sql)) < want and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def _sample(pid: int, source: str = "bench", k: int = 0) -> Sample:
    return Sample(time.time() + k * 1e-3, 0, Phase.DECODE, source, pid, allocated_bytes=k)


# --- 1. churn ---------------------------------------------------------------------------------
def _churn(options: BenchOptions, workdir: str) -> list[Figure]:
    n = 300 if options.quick else 1000
    agent = _agent(workdir, "churn")
    try:
        for i in range(n):  # the records name their pid, as a replay's do
            with AgentConnection(agent.socket_path) as conn:
                conn.hello("short-lived")
                conn.send_records([_sample(100_000 + i)])
                conn.status()
        with AgentConnection(agent.socket_path) as conn:
            conn.hello("new server")
            conn.send_records([_sample(999_999, "new", k) for k in range(100)])
            conn.status()
        stored = _wait_rows(f"{workdir}/churn.db",
                            "SELECT count(*) FROM samples WHERE source='new'", 100)
    finally:
        agent.stop()
    return [Figure("limits", f"new server's records stored after {n} short-lived processes",
                   float(stored), "%", target="100", met=stored == 100)]


# --- 2. fairness ------------------------------------------------------------------------------
def _fairness(options: BenchOptions, workdir: str) -> list[Figure]:
    agent = _agent(workdir, "fair", options.quick)
    hold_s, timeout_s = (2.0, 1.0) if options.quick else (10.0, 5.0)
    socks: list[socket.socket] = []
    try:
        quiet = _hello(agent.socket_path, "quiet")
        quiet.sendall(proto.records_message([_sample(os.getpid(), "quiet")]))
        socks = [quiet] + [_hello(agent.socket_path, f"chatter-{i}") for i in range(255)]
        waited, tries = _try_while_chattering(agent.socket_path, socks, hold_s)
        quiet_kept = _still_open(quiet)
    finally:
        for sock in socks:
            sock.close()
        agent.stop()
    return [Figure("limits", "good client in after (255 chatterers + a quiet client)",
                   waited if waited is not None else float("inf"), "s",
                   spread=f"{tries} tries, one every 2 s after {hold_s:g} s of chatter",
                   target=f"<= {timeout_s:g}", met=waited is not None and waited <= timeout_s),
            Figure("limits", "quiet client kept its slot", float(quiet_kept), "bool",
                   target="1", met=quiet_kept)]


def _hello(path: str, process: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    sock.sendall(proto.hello(os.getpid(), process))
    reply = _read(sock)
    if reply.get("type") != "welcome":
        raise RuntimeError(f"{process} refused: {reply}")
    return sock


def _read(sock: socket.socket) -> dict[str, Any]:
    head = b""
    while len(head) < proto.HEADER_BYTES:
        head += sock.recv(proto.HEADER_BYTES - len(head))
    (n,) = proto.HEADER.unpack(head)
    body = b""
    while len(body) < n:
        body += sock.recv(n - len(body))
    reply: dict[str, Any] = json.loads(body)
    return reply


def _try_while_chattering(path: str, socks: list[socket.socket],
                          hold_s: float) -> tuple[float | None, int]:
    """Seconds from the good client's first try until it is in (None: not in 80 s)."""
    quiet, chatterers = socks[0], socks[1:]
    start = time.monotonic()
    next_chatter = next_quiet = start
    next_try = first_try = start + hold_s
    tries = 0
    while (now := time.monotonic()) - first_try < 80.0:
        if now >= next_chatter:
            for sock in chatterers:
                sock.sendall(proto.dropped_message(0))
            next_chatter += 3.0
        if now >= next_quiet:
            quiet.sendall(proto.records_message([_sample(os.getpid(), "quiet")]))
            next_quiet += 8.0
        if now >= next_try:
            tries += 1
            if _good_client_in(path):
                return time.monotonic() - first_try, tries
            next_try += 2.0
        time.sleep(0.02)
    return None, tries


def _good_client_in(path: str) -> bool:
    try:
        with AgentConnection(path) as good:
            good.hello("good")
            good.send_records([_sample(os.getpid(), "good", k) for k in range(100)])
            good.status()
        return True
    except Exception:  # noqa: BLE001 - refused: try again, as a hook does
        return False


def _still_open(sock: socket.socket) -> bool:
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    closed = bool(sel.select(0.2))  # the agent's error message, or EOF
    sel.close()
    return not closed


# --- 3. write budget --------------------------------------------------------------------------
def _budget(options: BenchOptions, workdir: str) -> list[Figure]:
    flood_s = 2.0 if options.quick else FLOOD_S
    agent = _agent(workdir, "budget")
    db = f"{workdir}/budget.db"
    try:
        size_before = _db_bytes(db)
        # the neighbour is a process of its own: a write budget is per client process
        neighbour = subprocess.Popen([sys.executable, "-c", _NEIGHBOUR, agent.socket_path,
                                      str(flood_s)], stdout=subprocess.PIPE, text=True)
        with AgentConnection(agent.socket_path) as flood:
            flood.hello("flood")
            sent_fat = _flood(flood.send, flood_s)
            flood.status()
        out, _ = neighbour.communicate(timeout=60)
        if neighbour.returncode != 0:
            raise RuntimeError(f"the neighbour exited {neighbour.returncode}")
        sent_good = int(out.split()[-1])
        events = _wait_rows(db, "SELECT count(*) FROM events WHERE name='custom'", 1, 5.0)
        good_rows = _wait_rows(db, "SELECT count(*) FROM samples WHERE source='neighbour'",
                               sent_good)
        grown = _db_bytes(db) - size_before
    finally:
        agent.stop()
    per_s = events * len(BLOB) / flood_s
    allowed = DEFAULT_BYTES_PER_S * (1 + DEFAULT_BURST_S / flood_s)
    return [Figure("limits", "flooding client's accepted bytes/s", per_s, "B/s",
                   spread=f"{events} of {sent_fat} events of {len(BLOB)} B kept in "
                          f"{flood_s:g} s ({sent_fat * len(BLOB) / flood_s / 1e6:.1f} MB/s sent)",
                   target=f"<= {allowed:.0f}", met=per_s <= allowed),
            Figure("limits", "neighbour's samples stored during the flood",
                   100.0 * good_rows / max(1, sent_good), "%", target="100",
                   met=good_rows == sent_good),
            _growth_figure(grown, flood_s, good_rows, events)]


def _flood(send: Callable[[bytes], None], flood_s: float) -> int:
    """Fat events as fast as they go for ``flood_s``; the events sent."""
    fat = proto.records_message([Event(time.time(), "custom", 0, os.getpid(),
                                       data={"blob": BLOB}) for _ in range(16)])
    start, sent = time.monotonic(), 0
    while time.monotonic() - start < flood_s:
        send(fat)
        sent += 16
    return sent


# 100 samples every 0.1 s for the flood's time, from a process of its own; prints the count
_NEIGHBOUR = """
import os, sys, time
from vramscope.agent.ingest.connection import AgentConnection
from vramscope.agent.records import Phase, Sample
seconds, sent = float(sys.argv[2]), 0
with AgentConnection(sys.argv[1]) as conn:
    conn.hello("neighbour")
    start = next_at = time.monotonic()
    while time.monotonic() - start < seconds:
        conn.send_records([Sample(time.time() + k * 1e-3, 0, Phase.DECODE, "neighbour",
                                  os.getpid(), allocated_bytes=sent + k) for k in range(100)])
        sent += 100
        next_at += 0.1
        time.sleep(max(0.0, next_at - time.monotonic()))
    conn.status()
print(sent)
"""


def _growth_figure(grown: int, flood_s: float, good_rows: int, events: int) -> Figure:
    """The database's growth over the flood against the documented bound (docs/agent.md,
    "A write budget per client"): the flooder's, plus the neighbour's samples."""
    bound = WriteBudget().growth_bound_bytes(flood_s) + good_rows * STORED_ROW_BYTES
    return Figure("limits", "database growth during a one-client flood", grown / flood_s,
                  "B/s", spread=(f"{grown / 1e6:.1f} MB in {flood_s:g} s ({events} events "
                                 f"of {len(BLOB)} B, {good_rows} neighbour samples); bound "
                                 f"{bound / 1e6:.1f} MB"),
                  target=f"<= {bound / flood_s:.0f}", met=grown <= bound)


def _db_bytes(db: str) -> int:
    """The SQLite file and its WAL, as ``vramscope status`` counts them."""
    return sum(os.path.getsize(p) for p in (db, f"{db}-wal") if os.path.exists(p))
