"""The fleet page on a fleet's store: 64 hosts x 8 GPUs of generated history with scripted
verdicts (tests/support/fleet_store.py), on SQLite and a real PostgreSQL.

The order is the stored verdicts' (critical by time to OOM, warning by time to OOM, the leak,
the host whose agent went away, then everything else by host and index); the filters keep
that order; every row links to its device's page; a fleet's Overview groups the devices by
host, at-risk hosts first; the read is four statements whatever the fleet's size, and
``/metrics`` of the fleet is eight, says what the store holds of the scripted devices and
passes ``promtool check metrics``.
"""

from __future__ import annotations

import subprocess

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.dashboard.app import create_app

from tests.support import fleet_store as FS
from tests.support.sql_watch import statements_sent
from tests.support.tools import require_tool
from tools.history_generator import MIB

# (host, device, level, time to OOM, leak, stale): the scripted devices, in the page's order
ATTENTION = [("node-07", 6, "critical", 240.0, "no_leak", False),
             ("node-41", 5, "critical", 600.0, "no_leak", False),
             ("node-07", 2, "critical", 1800.0, "no_leak", False),
             ("node-12", 0, "warning", 5400.0, "no_leak", False),
             ("node-20", 3, "warning", None, "no_leak", False),
             ("node-33", 4, "ok", None, "leak", False),
             *[("node-50", d, "ok", None, "no_leak", True) for d in range(FS.DEVICES)]]


def _order(devices):
    return [(r["host"], r["device"], r["level"], r["time_to_oom_s"], r["leak"], r["stale"])
            for r in devices]


def _rest(keep=lambda host: True):
    """Every device that needs no attention, by host and index."""
    flagged = {(h, d) for h, d, *_ in ATTENTION}
    return [(FS.host_name(i), d, "ok", None, "no_leak", False)
            for i in range(FS.HOSTS) for d in range(FS.DEVICES)
            if (FS.host_name(i), d) not in flagged and keep(FS.host_name(i))]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    built = FS.build(f"sqlite:///{tmp_path_factory.mktemp('fleet') / 'fleet.db'}")
    yield built
    built.store.close()


@pytest.fixture(scope="module")
def client(fleet):
    return create_app(None, fleet.store, clock=FakeClock(FS.NOW_S)).test_client()


def test_every_device_in_the_order_that_needs_attention(client):
    doc = client.get("/api/v1/fleet").get_json()
    assert _order(doc["devices"]) == ATTENTION + _rest()
    assert doc["counts"] == doc["fleet"] == {"devices": 512, "critical": 3, "warning": 2,
                                             "leaking": 1, "stale": 8}
    assert doc["choices"] == {"hosts": [FS.host_name(i) for i in range(FS.HOSTS)],
                              "models": [FS.H100, FS.H200]}
    assert doc["verdicts_from"] == "store"


def test_a_row_says_what_the_engine_stored_and_how_fresh_the_data_is(client):
    rows = {(r["host"], r["device"]): r for r in client.get("/api/v1/fleet").get_json()["devices"]}
    newest = FS.T_END - 5.0  # the generator's last tick at one sample per 5 s
    assert rows[("node-07", 6)] == {
        "host": "node-07", "device": 6, "model": FS.H200, "uuid": "GPU-0706",
        "total_bytes": 141 * 2**30, "level": "critical", "time_to_oom_s": 240.0,
        "cause": "kv_cache", "cause_text": "kv_cache", "risk_process": "vllm (pid 1006)",
        "leak": "no_leak",
        "leak_slope_bytes_per_h": 0.0, "leak_process": None, "verdict_ts_s": FS.T_END,
        "newest_ts_s": newest, "last_sample_age_s": FS.NOW_S - newest, "freshness": "live",
        "stale": False}
    leak = rows[("node-33", 4)]
    assert (leak["leak"], leak["leak_slope_bytes_per_h"], leak["leak_process"],
            leak["level"], leak["risk_process"]) == ("leak", 8 * MIB, "vllm (pid 1004)", "ok",
                                                     "vllm (pid 1004)")
    gone = rows[(FS.GONE, 3)]
    assert (gone["newest_ts_s"], gone["last_sample_age_s"], gone["freshness"],
            gone["verdict_ts_s"]) == (FS.GONE_END_S - 5.0, FS.NOW_S - FS.GONE_END_S + 5.0,
                                      "stale", FS.GONE_END_S)
    # the process that ended critical is not a risk any more: its device is the ok one's
    ended = rows[FS.ENDED]
    assert (ended["level"], ended["risk_process"]) == ("ok", "vllm (pid 1001)")


def test_the_filters_keep_the_order(client):
    one = client.get("/api/v1/fleet?host=node-07").get_json()
    assert _order(one["devices"]) == [
        ("node-07", 6, "critical", 240.0, "no_leak", False),
        ("node-07", 2, "critical", 1800.0, "no_leak", False),
        *[("node-07", d, "ok", None, "no_leak", False) for d in (0, 1, 3, 4, 5, 7)]]
    assert one["counts"] == {"devices": 8, "critical": 2, "warning": 0, "leaking": 0,
                             "stale": 0}
    assert one["fleet"]["devices"] == 512
    h100 = client.get("/api/v1/fleet", query_string={"model": FS.H100}).get_json()
    even = [a for a in ATTENTION if FS.model_of(a[0]) == FS.H100]
    assert _order(h100["devices"]) == even + _rest(lambda h: FS.model_of(h) == FS.H100)
    assert len(h100["devices"]) == 256
    both = client.get("/api/v1/fleet", query_string={"host": "node-07", "model": FS.H100})
    assert both.get_json()["devices"] == []
    assert client.get("/api/v1/fleet?host=" + "x" * 256).status_code == 400


def test_the_page_links_each_device_to_its_own_page(client):
    page = client.get("/fleet?host=node-07").get_data(as_text=True)
    assert 'data-value="node-07"' in page and 'data-page="fleet"' in page
    device = client.get("/timeline?device=6&host=node-07")
    assert device.status_code == 200
    html = device.get_data(as_text=True)
    assert 'data-device="6"' in html and 'data-host="node-07"' in html


def test_a_device_page_picks_among_its_hosts_devices(client):
    """In a fleet the device picker lists the shown device's host's GPUs (512 options were
    most of a device page's HTML time) and links to the fleet page for the other hosts."""
    import re

    for page in ("timeline", "leaks", "risk"):
        html = client.get(f"/{page}?device=6&host=node-07").get_data(as_text=True)
        options = re.findall(r'<option value="(\d+)" data-host="([^"]+)"\s*(selected)?', html)
        assert options == [(str(d), "node-07", "selected" if d == 6 else "")
                           for d in range(FS.DEVICES)]
        assert '<a href="/fleet" id="picker-fleet">other hosts →</a>' in html
    assert "picker-fleet" not in client.get("/fleet").get_data(as_text=True)


def test_a_device_page_reads_its_own_row_only(fleet, client):
    """The device pages' verdict line asks for its device's row: in a fleet, the whole table
    is a read per device (latest values, KV, verdicts) for every page refresh."""
    with statements_sent(fleet.store.engine, lambda sql: True) as sent:
        doc = client.get("/api/v1/devices?host=node-07&device=6").get_json()
    [row] = doc["devices"]
    assert (row["host"], row["device"], row["name"]) == ("node-07", 6, FS.H200)
    assert [(v["pid"], v["risk"], v["cause"], v["leak"]) for v in row["verdicts"]] == [
        (1006, "critical", "kv_cache", "no_leak")]
    assert len(sent) < 40  # one device's reads, not 512 devices'
    assert client.get("/api/v1/devices?host=node-07&device=9").get_json() == {"devices": []}


def test_a_fleet_overview_is_its_hosts_at_risk_first(client):
    html = client.get("/").get_data(as_text=True)
    assert 'id="fleet-hosts"' in html and 'data-fleet="1"' in html
    assert 'id="overview-plot"' not in html and 'id="devices-table"' not in html
    hosts = client.get("/api/v1/fleet").get_json()["hosts"]
    assert [(h["host"], h["worst"], [r["device"] for r in h["attention"]]) for h in hosts[:7]] == [
        ("node-07", "critical", [6, 2]), ("node-41", "critical", [5]),
        ("node-12", "warning", [0]), ("node-20", "warning", [3]), ("node-33", "ok", [4]),
        (FS.GONE, "ok", list(range(8))), ("node-00", "ok", [])]
    assert [h["host"] for h in hosts[6:]] == [
        FS.host_name(i) for i in range(FS.HOSTS)
        if FS.host_name(i) not in {"node-07", "node-41", "node-12", "node-20", "node-33", FS.GONE}]
    assert (hosts[5]["stale"], hosts[5]["devices"], hosts[5]["attention_more"]) == (8, 8, 0)
    assert hosts[0]["soonest_time_to_oom_s"] == 240.0


def test_the_fleet_is_read_in_four_statements(fleet, client):
    with statements_sent(fleet.store.engine, lambda sql: sql.lstrip().upper()
                         .startswith("SELECT")) as sent:
        assert client.get("/api/v1/fleet").status_code == 200
    assert len(sent) == 4, [s for s, _ in sent]


def test_metrics_of_the_fleet_pass_promtool(client):
    promtool = require_tool("promtool")
    text = client.get("/metrics").get_data(as_text=True)
    lines = text.splitlines()
    assert sum(line.startswith("vramscope_device_info{") for line in lines) == 512
    # the same stored answers as the page: every running process, the ended one left out
    risky = sorted(line for line in lines if line.startswith("vramscope_process_risk_level{")
                   and not line.endswith(" 0.0"))
    assert risky == sorted([
        'vramscope_process_risk_level{device="2",host="node-07",pid="1002",process="vllm"} 2.0',
        'vramscope_process_risk_level{device="6",host="node-07",pid="1006",process="vllm"} 2.0',
        'vramscope_process_risk_level{device="0",host="node-12",pid="1000",process="vllm"} 1.0',
        'vramscope_process_risk_level{device="3",host="node-20",pid="1003",process="vllm"} 1.0',
        'vramscope_process_risk_level{device="5",host="node-41",pid="1005",process="vllm"} 2.0'])
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (out.stdout + out.stderr).strip() == ""


# /metrics' reads whatever the fleet's size: the alerts firing, the processes table (once, for
# the newest values' names, the last-seen series and the stored verdicts), every device's
# span and its newest samples (two), the stored verdicts, the saturation events, the agent
# reports
METRICS_STATEMENTS = 7


def _selects(sql):
    return sql.lstrip().upper().startswith("SELECT")


def _scrape(client):
    """/metrics' text without its one timing line (the rest is the same each scrape)."""
    text = client.get("/metrics").get_data(as_text=True)
    return "\n".join(line for line in text.splitlines()
                     if not line.startswith("vramscope_scrape_duration_seconds "))


def test_metrics_of_the_fleet_are_a_fixed_number_of_statements(fleet, client):
    with statements_sent(fleet.store.engine, _selects) as sent:
        assert client.get("/metrics").status_code == 200
    assert len(sent) == METRICS_STATEMENTS, [s for s, _ in sent]


# the tables that grow with the history: a read that walks one reads a day, or 90 days
HISTORY_TABLES = ("samples", "events", "verdicts", "rollups", "agent_stats")


def _walked(store, sent):
    """The history tables any of the ``sent`` statements reads whole, from the database's own
    plan (SQLite: ``SCAN t``; PostgreSQL: ``Seq Scan on t`` or on one of its partitions), each
    as (table, plan line)."""
    out = []
    with store.engine.connect() as c:
        for statement, params in sent:
            if store.dialect == "sqlite":
                lines = [r[3] for r in c.exec_driver_sql("EXPLAIN QUERY PLAN " + statement,
                                                         params)]
                whole = [(t, line) for line in lines for t in HISTORY_TABLES
                         if line.startswith(f"SCAN {t} ") or line == f"SCAN {t}"]
            else:
                cur = c.connection.dbapi_connection.cursor()
                # the test fleet's tables are small: once autovacuum has analyzed one, its
                # cheapest plan may be a scan of a few pages, whenever that happens to run.
                # What is checked is that a seek exists: a statement with none still scans
                cur.execute("SET enable_seqscan = off")
                cur.execute("EXPLAIN " + statement, params)
                lines = [r[0] for r in cur.fetchall()]
                cur.execute("RESET enable_seqscan")
                whole = [(t, line) for line in lines for t in HISTORY_TABLES
                         if f"Seq Scan on {t} " in line or f"Seq Scan on {t}_" in line]
            out += whole
    return out


@pytest.mark.parametrize("route", ["/metrics", "/api/v1/fleet", "/api/v1/overview"])
def test_a_fleet_read_seeks_each_device_s_newest_rows_not_the_history(fleet, client, route):
    """Each statement seeks its rows per device (per host) on the history tables' indexes:
    none of them walks a table that grows with the history (a join the planner turns around
    does)."""
    with statements_sent(fleet.store.engine, _selects) as sent:
        client.get(route)
    assert _walked(fleet.store, sent) == []


def _series(text, name):
    """``{labels: value}`` of one family of the scrape, labels as a sorted tuple."""
    from prometheus_client.parser import text_string_to_metric_families

    return {tuple(sorted(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples if s.name == name}


def _at(host, device, pid=None):
    labels = {"host": host, "device": str(device)}
    if pid is not None:
        labels.update(pid=str(pid), process="vllm")
    return tuple(sorted(labels.items()))


def test_metrics_of_the_scripted_devices(fleet, client):
    text = _scrape(client)
    leak = _series(text, "vramscope_process_leak_state")
    assert len(leak) == FS.HOSTS * FS.DEVICES  # every running process, the ended one not
    assert {k: v for k, v in leak.items() if v} == {_at(*FS.LEAK, FS.pid_of(4)): 1.0}
    assert _series(text, "vramscope_process_leak_slope_bytes_per_second") == {
        _at(*FS.LEAK, FS.pid_of(4)): FS.LEAK_SLOPE_BYTES_PER_S}
    assert not any(dict(k).get("pid") == "9001" for k in _series(
        text, "vramscope_process_risk_level"))
    # the newest sample's values, as the store gives that device's samples one by one
    newest = fleet.store.samples(6, FS.T_END - 60.0, FS.T_END, host="node-07")[-1]
    assert newest.ts_s == FS.T_END - 5.0
    for name, field in (("vramscope_allocated_bytes", "allocated_bytes"),
                        ("vramscope_reserved_bytes", "reserved_bytes"),
                        ("vramscope_kv_blocks_used", "kv_blocks_used")):
        assert _series(text, name)[_at("node-07", 6)] == getattr(newest, field), name
    assert _series(text, "vramscope_process_allocated_bytes")[
        _at("node-07", 6, FS.pid_of(6))] == newest.allocated_bytes
    assert _series(text, "vramscope_device_info")[tuple(sorted({
        "host": "node-07", "device": "6", "uuid": "GPU-0706", "name": FS.H200, "index": "6",
        "parent_uuid": ""}.items()))] == 1.0
    age = _series(text, "vramscope_last_sample_age_seconds")
    assert age[(*_at("node-07", 6), ("source", "torch"))] == 6.0
    assert age[(*_at(FS.GONE, 3), ("source", "torch"))] == FS.NOW_S - FS.GONE_END_S + 5.0
    # KV saturation from the saturated device's events: its preemption 20 s ago
    waiting, running = FS.SATURATED_LOAD
    for name, value in (("vramscope_kv_saturated", 1.0), ("vramscope_requests_waiting", waiting),
                        ("vramscope_requests_running", running),
                        ("vramscope_kv_preemptions_recent", FS.SATURATED_PREEMPTED)):
        assert _series(text, name) == {_at(*FS.SATURATED): value}, name
    # every host's agent report
    hosts = [FS.host_name(i) for i in range(FS.HOSTS)]
    assert _series(text, "vramscope_agent_dropped_records_total") == {
        (("host", h),): float(FS.report_of(h)[0]) for h in hosts}
    assert _series(text, "vramscope_agent_queue_depth") == {
        (("host", h),): float(FS.report_of(h)[1]) for h in hosts}


@pytest.mark.postgres
def test_the_same_order_and_metrics_on_postgresql(postgres_url, client):
    built = FS.build(postgres_url)
    try:
        c = create_app(None, built.store, clock=FakeClock(FS.NOW_S)).test_client()
        doc = c.get("/api/v1/fleet").get_json()
        assert _order(doc["devices"]) == ATTENTION + _rest()
        assert [h["host"] for h in doc["hosts"][:6]] == ["node-07", "node-41", "node-12",
                                                         "node-20", "node-33", FS.GONE]
        with statements_sent(built.store.engine, _selects) as sent:
            c.get("/api/v1/fleet")
        assert len(sent) == 4
        with statements_sent(built.store.engine, _selects) as sent:
            text = _scrape(c)
        assert len(sent) == METRICS_STATEMENTS
        assert _walked(built.store, sent) == []
        assert text == _scrape(client)  # SQLite's scrape of the same fleet, series by series
        with statements_sent(built.store.engine, _selects) as sent:
            assert c.get("/api/v1/overview").status_code == 200
        assert _walked(built.store, sent) == []
    finally:
        built.store.close()


def test_a_device_without_a_stored_verdict_comes_after_the_ok_ones(tmp_path):
    """No verdict yet (an agent whose engine has not answered): no level and no leak, shown
    last, not taken for ok; an empty store has no device and no host."""
    from vramscope.agent.records import Phase, Sample
    from vramscope.agent.store import Store
    from vramscope.agent.store import verdicts as stored

    store = Store.open(f"sqlite:///{tmp_path / 'two.db'}", host_name="solo")
    empty = create_app(None, store, clock=FakeClock(FS.NOW_S)).test_client()
    assert empty.get("/api/v1/fleet").get_json()["devices"] == []
    store.write([Sample(FS.NOW_S - 2, d, Phase.IDLE, "torch", 7, allocated_bytes=1)
                 for d in (0, 1)], [])
    stored.write(store, [FS.scripted_verdict(FS.NOW_S - 3, 1, "solo", 7, "ok", None, False)])
    doc = create_app(None, store, clock=FakeClock(FS.NOW_S)).test_client().get(
        "/api/v1/fleet").get_json()
    assert _order(doc["devices"]) == [("solo", 1, "ok", None, "no_leak", False),
                                      ("solo", 0, None, None, None, False)]
    assert [(h["host"], h["worst"], h["attention"]) for h in doc["hosts"]] == [
        ("solo", "ok", [])]
    store.close()
