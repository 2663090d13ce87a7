"""What the agent refuses is counted per reason in ``vramscope status`` and on the Overview's
health table (issue 45, item 1): the agent's stats rows keep the counts by reason (migration
0013), the overview API carries them and the page shows them under the total. Before, the
table said "Rejected 3" with no word of why (a name bound, a write budget, bad messages)."""

from __future__ import annotations

import sqlite3
import time

from vramscope.agent.records import Phase, Sample
from vramscope.agent.store import Store
from vramscope.dashboard.app import create_app

from tests.support.waiting import wait_for

NOW_S = 1_800_000_000.0
REASONS = {"names": 40, "budget_rows": 7, "chatter": 1}


def test_the_reasons_reach_the_overview_api(any_url):
    store = Store.open(any_url, host_name="h")
    try:
        store.write_agent_stats(NOW_S - 10, clients=1, rows_per_s=1.0, queue_depth=0,
                                dropped_total=0, rejected_total=0, db_size_bytes=None)
        store.write_agent_stats(NOW_S, clients=1, rows_per_s=1.0, queue_depth=0,
                                dropped_total=0, rejected_total=48, db_size_bytes=None,
                                rejected_by_reason={**REASONS, "schema": 0})
        doc = create_app(None, store).test_client().get("/api/v1/overview").get_json()
        [host] = doc["hosts"]
        assert host["agent"]["rejected_total"] == 48
        assert host["agent"]["rejected_by_reason"] == REASONS  # a reason at 0 is left out
    finally:
        store.close()


def test_rows_without_reasons_and_unreadable_ones_read_as_none(tmp_path):
    """Rows written before migration 0013 have none; a hand-edited row does not break the
    page, and only counts are read."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    with Store.open(url, host_name="h") as store:
        store.write_agent_stats(NOW_S, clients=0, rows_per_s=0.0, queue_depth=0,
                                dropped_total=0, rejected_total=0, db_size_bytes=None)
        assert store.latest_agent_stats()["rejected_by_reason"] is None
        for text, read in (('{"names": 2, "x": "y", "neg": -1}', {"names": 2}),
                           ("not json", None), ('[1, 2]', None)):
            with store.engine.begin() as c:
                c.exec_driver_sql("UPDATE agent_stats SET rejected_by_reason = ?", (text,))
            assert store.latest_agent_stats()["rejected_by_reason"] == read, text


def test_a_real_agent_stores_its_refusals_by_reason(short_dir):
    """A real agent allowed 2 live processes: a client's records of 5 pids, 3 of them
    refused by the name bound, reach its stats row as ``names: 3`` within a stats interval."""
    from vramscope.agent.ingest.connection import AgentConnection

    from tools.agent_process import AgentProcess

    db = f"{short_dir}/vs.db"
    agent = AgentProcess(f"sqlite:///{db}", f"{short_dir}/run/agent.sock",
                         log_path=f"{short_dir}/agent.log",
                         env={"VRAMSCOPE_AGENT_MAX_PROCESSES": "2"}).start()
    try:
        with AgentConnection(agent.socket_path) as conn:
            conn.hello("many", pid=5000)
            conn.send_records([Sample(time.time(), 0, Phase.DECODE, "x", 5000 + i,
                                      allocated_bytes=i) for i in range(5)])
            assert conn.status()["rejected"] == {"names": 3}

        def stored() -> str | None:
            with sqlite3.connect(db, timeout=10) as c:
                row = c.execute("SELECT rejected_by_reason FROM agent_stats "
                                "ORDER BY ts_s DESC LIMIT 1").fetchone()
            return row[0] if row else None
        wait_for(lambda: stored() == '{"names": 3}', timeout_s=15)
    finally:
        agent.stop()


def test_status_without_an_agent_prints_the_stored_reasons(tmp_path, capsys):
    """`vramscope status` with no agent running reads the last stored row: the refusals by
    reason follow the total, the largest first, as the running agent's answer does."""
    from vramscope.agent.cli import main

    url = f"sqlite:///{tmp_path / 's.db'}"
    with Store.open(url) as store:  # this host's name, as status reads it
        store.write_agent_stats(time.time(), clients=0, rows_per_s=0.0, queue_depth=0,
                                dropped_total=0, rejected_total=48, db_size_bytes=None,
                                rejected_by_reason=REASONS)
    assert main(["status", "--socket", f"{tmp_path}/none.sock", "--db", url]) == 1
    out = capsys.readouterr().out
    assert "rejected 48 (names 40, budget_rows 7, chatter 1)\n" in out
