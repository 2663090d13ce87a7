"""Catching up after downtime (issue 32, item 8): a store whose raw samples were never rolled up
(an agent down for a day, an older store) was rolled up at one two-minute step a second, 12+
minutes for a day of 8 devices at 10 Hz. Now the steps follow each other while ingest keeps
up, `status` says how far behind the rollups are and how long is left, and ingest goes on."""

from __future__ import annotations

import time

from vramscope.agent.cli.cmd_status import render
from vramscope.agent.config import parse_config
from vramscope.agent.daemon import Agent
from vramscope.agent.ingest.connection import AgentConnection
from vramscope.agent.records import Phase, Sample
from vramscope.agent.store import Store

from tests.support.rollup_rows import read_rollups
from tests.support.waiting import wait_for
from tools.history_generator import History, generate


def test_a_backlog_is_caught_up_in_steps_back_to_back_while_ingest_goes_on(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 'old.db'}", host_name="h")
    end = time.time()
    history = generate(store, History(devices=8, hz=1, days=2 / 24, end_s=end, rollups=False,
                                      raw_days=None, events=False))
    steps = int((end - 120 - history.start_s) // 120)  # two minutes a step: 59
    agent = Agent(parse_config({}, None, {}), store=store, source=None,
                  socket_path=str(tmp_path / "run" / "a.sock"), alerts=False)
    agent.start()
    try:
        started = time.monotonic()
        seen = []
        with AgentConnection(agent.socket_path) as conn:
            conn.hello("live", devices=[0])
            for k in range(40):
                conn.send_records([Sample(time.time(), 0, Phase.DECODE, "live", 7,
                                          allocated_bytes=k * 100 + i) for i in range(100)])
                status = conn.status()
                if status["retention_catch_up"]:
                    seen.append(status)
                time.sleep(0.05)
            wait_for(lambda: conn.status()["retention_backlog"] is False, 60)
            took = time.monotonic() - started
        wait_for(lambda: len(store.samples(0, source="live")) == 4000, 10)
    finally:
        agent.stop()
    print(f"caught up {steps} steps in {took:.1f} s; {len(seen)} status replies while behind")
    assert took < steps / 2  # one step a second took `steps` seconds
    minutes = {r["bucket_s"] for r in read_rollups(store)}
    assert len(minutes) >= 118  # two hours, but the last two minutes (the grace)
    progress = seen[0]["retention_catch_up"]
    assert 0 < progress["behind_s"] <= end - history.start_s
    assert progress["rolled_up_to_s"] >= history.start_s
    assert " — retention catching up: " in render({**seen[-1], "running": True,
                                                  "socket": "s"})
    store.close()
