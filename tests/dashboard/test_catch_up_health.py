"""The dashboard's sampling health shows retention catching up after downtime (issue 32, item
8), from the agent's stats rows (migration 0011), as ``vramscope status`` does."""

from __future__ import annotations

import pytest
from vramscope.agent.store import Store
from vramscope.dashboard.app import create_app


@pytest.mark.parametrize("behind", [(3600.0, 120.0), (None, None)])
def test_the_agent_s_catch_up_reaches_the_overview(any_url, behind):
    store = Store.open(any_url, host_name="h")
    try:
        store.write_agent_stats(1_800_000_000.0, clients=1, rows_per_s=10.0, queue_depth=0,
                                dropped_total=0, rejected_total=0, db_size_bytes=None,
                                retention_behind_s=behind[0], retention_eta_s=behind[1])
        doc = create_app(None, store).test_client().get("/api/v1/overview").get_json()
        [host] = doc["hosts"]
        assert (host["agent"]["retention_behind_s"], host["agent"]["retention_eta_s"]) == behind
    finally:
        store.close()


def test_the_agent_writes_its_catch_up_into_its_stats(tmp_path, monkeypatch):
    """The stats task writes what ``status`` says of retention (null when not behind)."""
    from vramscope.agent.config import parse_config
    from vramscope.agent.daemon import Agent

    store = Store.open(f"sqlite:///{tmp_path / 's.db'}", host_name="h")
    agent = Agent(parse_config({}, None, {}), store=store, source=None,
                  socket_path=str(tmp_path / "run" / "a.sock"), alerts=False)
    monkeypatch.setattr(agent.retention, "progress",
                        lambda: {"rolled_up_to_s": 1.0, "behind_s": 7200.0, "rate": 60.0,
                                 "eta_s": 120.0})
    agent._stats_task(1_800_000_000.0)(store)
    row = store.latest_agent_stats()
    assert row is not None
    assert (row["retention_behind_s"], row["retention_eta_s"]) == (7200.0, 120.0)
    store.close()
