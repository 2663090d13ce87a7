"""A connected client is alive even when it sends nothing (issue 33): an idle vLLM server sends
no record for minutes, so the agent moves a connected client's process row (``last_seen_s``)
with each of its reports; the dashboard tells an idle server (connected) from one that ended (a
row no report moves any more)."""

from __future__ import annotations

import os
import time

from vramscope.agent.config import parse_config
from vramscope.agent.daemon import Agent
from vramscope.agent.ingest.connection import AgentConnection
from vramscope.agent.store import Store

from tests.support.waiting import wait_for


def test_each_agent_report_moves_a_connected_clients_row_and_no_other(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 'a.db'}", host_name="h")
    agent = Agent(parse_config({}, None, {}), store=store, source=None,
                  socket_path=str(tmp_path / "run" / "a.sock"), alerts=False)
    agent.start()

    def report(ts_s: float) -> None:  # what the agent does every 5 s
        agent.writer.submit(agent._stats_task(ts_s))
        agent.writer.flush()

    def seen() -> float:
        (row,) = [p for p in store.processes() if p["pid"] == os.getpid()]
        return float(row["last_seen_s"])

    try:
        with AgentConnection(agent.socket_path) as conn:
            conn.hello("vllm engine core (port 8000)", devices=[0])
            wait_for(lambda: len(agent.status()["clients"]) == 1, 10)
            wait_for(lambda: store.processes(), 10)  # the hello's own row written first
            later = time.time() + 60
            report(later)  # silent, connected: seen at this report
            assert seen() == later
        wait_for(lambda: not agent.status()["clients"], 10)
        report(later + 60)  # disconnected: no longer moved
        assert seen() == later
    finally:
        agent.stop()
        store.close()
