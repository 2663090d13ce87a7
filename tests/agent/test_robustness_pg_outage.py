"""PostgreSQL restarted, or stopped for a minute, in the middle of ingest (issue 32, "never
tested yet"): a real agent process on a PostgreSQL server of the test's own, a client sending
all the while. Every record the client sent is either stored or counted as dropped (the queue
drops its oldest while the database is away, docs/agent.md "The writer"), none twice; the agent
recovers by itself; `status` and the dashboard's /healthz say the store is failing meanwhile."""

from __future__ import annotations

import threading
import time

import pytest
from vramscope.agent.config import parse_config
from vramscope.agent.ingest.connection import AgentConnection
from vramscope.agent.records import Phase, Sample
from vramscope.agent.settings import SETTINGS
from vramscope.agent.store import Store

from tests.support.waiting import wait_for
from tools.agent_process import AgentProcess

QUEUE_MAX_RECORDS = next(s.default for s in SETTINGS if s.key == "agent.queue_max_records")


class _Sender(threading.Thread):
    """100 records every 20 ms (5,000 a second), numbered, until told to stop."""

    def __init__(self, path: str) -> None:
        super().__init__(daemon=True)
        self.path, self.sent, self.stop = path, 0, threading.Event()

    def run(self) -> None:
        with AgentConnection(self.path) as conn:
            conn.hello("pg-outage", devices=[0])
            while not self.stop.is_set():
                now = time.time()
                conn.send_records([Sample(now, 0, Phase.DECODE, "pg-outage", 4242,
                                          allocated_bytes=self.sent + i) for i in range(100)])
                self.sent += 100
                time.sleep(0.02)
            conn.status()  # a round trip: the agent has read all of it


def _stored(store: Store) -> tuple[int, int]:
    with store.engine.connect() as c:
        return c.exec_driver_sql("SELECT count(*), count(DISTINCT allocated_bytes) FROM samples "
                                 "WHERE source = 'pg-outage'").one()


@pytest.mark.postgres
@pytest.mark.parametrize("down_s", [0.0, pytest.param(60.0, marks=pytest.mark.slow)])
def test_postgres_going_away_mid_ingest_loses_only_counted_records(short_dir, down_s):
    from vramscope.dashboard.app import create_app

    from tests.support.pgserver import PostgresServer

    server = PostgresServer()
    server.start()
    agent = None
    try:
        url = server.create_database("outage")
        agent = AgentProcess(url, f"{short_dir}/run/a.sock",
                             log_path=f"{short_dir}/agent.log").start()
        dashboard = create_app(parse_config({"database": {"url": url}}, None, {})).test_client()
        assert dashboard.get("/healthz").status_code == 200
        sender = _Sender(agent.socket_path)
        sender.start()
        wait_for(lambda: agent.status()["written_total"] > 2000, 20)
        server.stop("fast")
        wait_for(lambda: agent.status()["db_failing"], 20)
        health = dashboard.get("/healthz")
        assert (health.status_code, health.get_json()["problem"]) == (
            503, "database does not answer")
        time.sleep(down_s)
        server.start()
        wait_for(lambda: not agent.status()["db_failing"], 60)  # by itself
        time.sleep(1.0)
        sender.stop.set()
        sender.join(30)
        status = wait_for(lambda: (s := agent.status())["queue_depth"] == 0 and s, 60)
        assert dashboard.get("/healthz").status_code == 200
        with Store.open(url) as store:
            rows, distinct = _stored(store)
        print(f"down {down_s:g} s: sent {sender.sent}, stored {rows}, dropped "
              f"{status['dropped_total']}")
        assert rows == distinct  # nothing written twice (a batch retried after the restart)
        assert rows + status["dropped_total"] == sender.sent
        if down_s == 0.0:
            assert status["dropped_total"] == 0
        else:  # 5,000 a second for a minute: the queue keeps its bound, the oldest go
            assert status["dropped_total"] >= sender.sent - rows > 0
            assert rows >= QUEUE_MAX_RECORDS
    finally:
        if agent is not None:
            agent.stop()
        server.destroy()
