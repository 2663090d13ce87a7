"""Freshness reads the newest sample not ahead of the clock (issue 45, item 9): one record a
little under the agent's window (299 s) ahead, from a wrong clock, turned the stale banner on
for every page and every user, and hid the real samples' age."""

from __future__ import annotations

from vramscope.agent.clock import FakeClock
from vramscope.agent.config import parse_config
from vramscope.agent.records import Phase, Sample
from vramscope.agent.store import Store

NOW = 1_700_003_640.0
HOST = "node-a"


def _live(n: int = 60, device: int = 0) -> list[Sample]:
    """``n`` samples a second apart, the newest a second ago."""
    return [Sample(NOW - n + i, device, Phase.DECODE, "torch", 11, allocated_bytes=1000 + i)
            for i in range(n)]


def _client(store: Store):
    from vramscope.dashboard.app import create_app

    app = create_app(parse_config({}, None, {}), store, clock=FakeClock(NOW))
    return app.test_client()


def test_one_sample_ahead_of_the_clock_neither_turns_stale_nor_hides_the_real_ones(any_url):
    store = Store.open(any_url, host_name=HOST)
    try:
        store.write(_live(device=0) + _live(device=1))
        store.write([Sample(NOW + 299.0, 1, Phase.DECODE, "torch", 12, allocated_bytes=7)])
        store.write_agent_stats(NOW - 1, clients=1, rows_per_s=2.0, queue_depth=0,
                                dropped_total=0, rejected_total=0, db_size_bytes=None)
        client = _client(store)
        fresh = client.get("/api/v1/freshness").get_json()
        assert (fresh["stale"], fresh["state"], fresh["newest_ts_s"]) == (False, "live", NOW - 1)
        overview = client.get("/api/v1/overview").get_json()
        assert overview["freshness"]["stale"] is False
        assert overview["freshness"]["newest_ts_s"] == NOW - 1
        rows = {r["device"]: r for r in overview["devices"]}
        # the device with the wrong clock's row reads its real newest sample, and its value
        assert (rows[1]["stale"], rows[1]["latest"]["last_ts_s"]) == (False, NOW - 1)
        assert rows[1]["latest"]["allocated_bytes"] == 1059
    finally:
        store.close()


def test_time_range_not_after_the_clock(any_url):
    store = Store.open(any_url, host_name=HOST)
    try:
        store.write(_live() + [Sample(NOW + 299.0, 0, Phase.DECODE, "torch", 12)])
        assert store.time_range(0) == (NOW - 60, NOW + 299.0)  # the stored span, as before
        assert store.time_range(0, not_after_s=NOW) == (NOW - 60, NOW - 1)
        # a device whose every sample lies ahead has none not after the clock
        store.write([Sample(NOW + 10.0, 3, Phase.DECODE, "torch", 12)])
        assert store.time_range(3, not_after_s=NOW) is None
    finally:
        store.close()
