"""The Overview of a fleet, and its device table, read in a fixed number of statements whatever
the fleet's size (issue 48: a 16-host x 8-GPU fleet's Overview was 1,700 statements), and say
what the per-device reads say.

Fleets of tests/support/fleet_store.py (4 hosts of 8 GPUs, and 8: twice the devices and the
hosts), with request starts scripted on two devices for the request rates.
"""

from __future__ import annotations

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.records import Event
from vramscope.agent.store import Store
from vramscope.dashboard.app import create_app

from tests.support import fleet_store as FS
from tests.support.sql_watch import statements_sent

SMALL_HOSTS = 4  # 32 devices; the scripted ones of node-00..03 (the ended process on node-02)
# (host, device) -> pid -> request starts in the last minute before NOW_S; pid 77 sends no
# samples (its starts count for the device, it has no process row of its own)
STARTS = {("node-01", 3): {FS.pid_of(3): 5, 77: 2}, ("node-02", 1): {FS.pid_of(1): 1}}


def _with_requests(built: FS.FleetStore) -> FS.FleetStore:
    """``STARTS`` within the last minute, and one start per device just before it (not
    counted)."""
    for (host, device), by_pid in STARTS.items():
        s = Store.open(built.url, host_name=host)
        try:
            s.write([], [Event(FS.NOW_S - 30.0 - k, "request_start", device, pid,
                               request_id=f"r-{pid}-{k}")
                         for pid, n in by_pid.items() for k in range(n)]
                    + [Event(FS.NOW_S - 61.0, "request_start", device, FS.pid_of(device),
                             request_id="old")])
        finally:
            s.close()
    return built


def _client(built):
    return create_app(None, built.store, clock=FakeClock(FS.NOW_S)).test_client()


def _count(built, route):
    client = _client(built)
    client.get(route)  # the store's caches (device ids) warm, as in a running dashboard
    with statements_sent(built.store.engine, lambda sql: True) as sent:
        assert client.get(route).status_code == 200
    return len(sent)


ROUTES = ("/api/v1/overview", "/api/v1/overview?figures=true", "/api/v1/devices",
          "/api/v1/hosts", "/api/v1/processes", "/api/v1/freshness")


def _counts_as_it_grows(url):
    """Each route's statements on ``SMALL_HOSTS`` hosts, then on twice as many (the same
    store, grown), as ``{route: (small, double)}``."""
    small = _with_requests(FS.build(url, SMALL_HOSTS))
    before = {route: _count(small, route) for route in ROUTES}
    small.store.close()
    double = FS.build(url, 2 * SMALL_HOSTS, first=SMALL_HOSTS)
    try:
        assert len(double.store.devices(host="*")) == 2 * SMALL_HOSTS * FS.DEVICES
        return {route: (before[route], _count(double, route)) for route in ROUTES}
    finally:
        double.store.close()


def test_the_statements_do_not_grow_with_the_fleet(tmp_path):
    counts = _counts_as_it_grows(f"sqlite:///{tmp_path / 'growing.db'}")
    assert {route: small for route, (small, _) in counts.items()} == {
        route: double for route, (_, double) in counts.items()}


@pytest.mark.postgres
def test_the_statements_do_not_grow_with_the_fleet_on_postgresql(postgres_url, fleet):
    """On PostgreSQL too; and its Overview is SQLite's, key by key."""
    counts = _counts_as_it_grows(postgres_url)
    assert {route: small for route, (small, _) in counts.items()} == {
        route: double for route, (_, double) in counts.items()}
    with Store.open(postgres_url, host_name=FS.host_name(0)) as store:
        on_postgres = create_app(None, store, clock=FakeClock(FS.NOW_S)).test_client()
        assert (_by_host(on_postgres.get("/api/v1/overview").get_json())
                == _by_host(_client(fleet).get("/api/v1/overview").get_json()))


def _by_host(doc):
    """The Overview with its processes by host, then pid (the processes table is read by pid:
    one pid on several hosts comes in the database's order)."""
    return {**doc, "processes": sorted(doc["processes"], key=lambda p: (p["host"], p["pid"]))}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    built = _with_requests(FS.build(
        f"sqlite:///{tmp_path_factory.mktemp('fleet') / 'fleet.db'}", 2 * SMALL_HOSTS))
    yield built
    built.store.close()


def test_each_device_row_is_what_its_own_read_says(fleet):
    """The fleet's rows (every device's reads at once) are the rows of each device read by
    its own statements (``/api/v1/devices?host=...&device=...``), key by key: latest values,
    stored verdicts, freshness, KV pools and request rates."""
    client = _client(fleet)
    doc = client.get("/api/v1/overview").get_json()
    assert len(doc["devices"]) == 2 * SMALL_HOSTS * FS.DEVICES
    for row in doc["devices"]:
        [own] = client.get("/api/v1/devices", query_string={
            "host": row["host"], "device": row["device"]}).get_json()["devices"]
        assert row == own, (row["host"], row["device"])
    assert client.get("/api/v1/devices").get_json()["devices"] == doc["devices"]
    rows = {(r["host"], r["device"]): r for r in doc["devices"]}
    assert {k: r["requests_per_min"] for k, r in rows.items() if r["requests_per_min"]} == {
        ("node-01", 3): 7.0, ("node-02", 1): 1.0}
    # the process that ended on node-02's device 1 is not among its running processes
    assert [(v["pid"], v["risk"]) for v in rows[FS.ENDED]["verdicts"]] == [
        (FS.pid_of(1), "ok")]
    assert [(v["pid"], v["risk"], v["cause"]) for v in rows[("node-07", 6)]["verdicts"]] == [
        (FS.pid_of(6), "critical", "kv_cache")]


def test_each_process_s_request_rate_and_each_host_s_span(fleet):
    doc = _client(fleet).get("/api/v1/overview").get_json()
    rates = {(p["host"], p["pid"]): p["requests_per_min"] for p in doc["processes"]}
    assert {k: v for k, v in rates.items() if v} == {("node-01", FS.pid_of(3)): 5.0,
                                                     ("node-02", FS.pid_of(1)): 1.0}
    assert rates[("node-01", FS.pid_of(2))] == 0.0
    client = _client(fleet)
    assert client.get("/api/v1/processes").get_json()["processes"] == doc["processes"]
    assert [{k: h[k] for k in ("name", "first_seen_s", "last_seen_s", "agent")}
            for h in client.get("/api/v1/hosts").get_json()["hosts"]] == doc["hosts"]
    assert client.get("/api/v1/freshness").get_json()["newest_ts_s"] == FS.T_END - 5.0
    store = fleet.store
    assert [h["name"] for h in doc["hosts"]] == [FS.host_name(i)
                                                 for i in range(2 * SMALL_HOSTS)]
    for h, stored in zip(doc["hosts"], store.hosts(), strict=True):
        # each device's span as the store gives it one device at a time
        spans = [store.time_range(d["device_index"], h["name"])
                 for d in store.devices(host=h["name"])]
        report = store.latest_agent_stats(h["name"])
        assert h["first_seen_s"] == min([lo for lo, _ in spans] + [stored["first_seen_s"]])
        assert h["last_seen_s"] == max([hi for _, hi in spans]
                                       + [report["ts_s"], stored["last_seen_s"]])
        assert h["agent"]["dropped_total"] == FS.report_of(h["name"])[0]
