"""What an on-call engineer must be able to trust: one verdict (the alert engine's), stale data
that never looks live, hosts and processes with real first/last seen, phases at every span.

Flask test client on the seeded database (tests/support/dashboard_fixtures.py) or on small
stores written here; expected values come from the generators, never re-measured.
"""

from __future__ import annotations

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.records import Phase, Sample
from vramscope.agent.store import Store
from vramscope.dashboard.app import create_app
from vramscope.dashboard.verdict import device_verdict, freshness, stale_after_s

from tests.support import dashboard_fixtures as F

seeded, dash_app, client = F.seeded, F.dash_app, F.client  # shared fixtures

LAST_T = F.T0 + (F.STEPS - 1) * F.STEP_S


def test_stale_after_is_five_of_the_slowest_step_to_the_page(seeded):
    assert stale_after_s(seeded.config()) == 25.0  # dashboard.refresh_s 5 s
    assert stale_after_s(seeded.config(dashboard={"refresh_s": 1.0})) == 15.0  # the floor
    assert freshness(None, 100.0, seeded.config())["stale"] is False  # no data: nothing stale


def test_fresh_data_is_live(client):
    doc = client.get("/api/v1/freshness").get_json()
    assert doc == {"now_s": F.NOW_S, "newest_ts_s": LAST_T, "age_s": F.NOW_S - LAST_T,
                   "stale_after_s": 25.0, "state": "live", "stale": False, "why": None,
                   "agent_age_s": 1.0, "clients": 2}
    assert client.get("/api/v1/overview").get_json()["freshness"]["stale"] is False


def test_hours_old_data_is_stale_everywhere(seeded):
    later = F.NOW_S + 8.4 * 3600
    c = create_app(seeded.config(), seeded.store, clock=FakeClock(later)).test_client()
    fresh = c.get("/api/v1/freshness").get_json()
    assert (fresh["stale"], fresh["age_s"]) == (True, later - LAST_T)
    overview = c.get("/api/v1/overview").get_json()
    assert overview["freshness"] == fresh
    assert [d["stale"] for d in overview["devices"]] == [True, True]
    # the timeline of the newest hour says how old its window is
    doc = c.get("/api/v1/timeline?device=0&columns=allocated_bytes").get_json()
    assert doc["window_age_s"] == later - LAST_T and doc["stale_after_s"] == 25.0
    meta = c.get("/api/v1/figures/timeline?device=0").get_json()["layout"]["meta"]
    assert (meta["window_age_s"], meta["window_end"]) == (later - LAST_T, LAST_T)


def test_the_verdict_is_the_worst_active_alert_with_its_reasons(client):
    devices = client.get("/api/v1/devices").get_json()["devices"]
    active = client.get("/api/v1/alerts?active=true").get_json()["alerts"]
    for d in devices:
        mine = [a for a in active if (a["host"], a["device"]) == (d["host"], d["device"])]
        assert d["verdict"] == device_verdict(mine)
        assert d["risk"] == d["verdict"]["level"]
    assert devices[0]["verdict"] == {"level": "warning", "reasons": [
        {"rule": "idle_floor_leak", "severity": "warning", "fired_ts_s": F.T0 + 5400,
         "message": "idle floor rising <b>2 GiB/h</b>"}]}
    assert devices[1]["verdict"] == {"level": "ok", "reasons": []}


def test_verdict_orders_reasons_by_severity_then_time():
    alerts = [{"rule": "memory_leak", "severity": "warning", "fired_ts_s": 5.0, "message": "a"},
              {"rule": "oom", "severity": "critical", "fired_ts_s": 9.0, "message": "b"},
              {"rule": "kv", "severity": "info", "fired_ts_s": 1.0, "message": None}]
    v = device_verdict(alerts)
    assert v["level"] == "critical"
    assert [r["rule"] for r in v["reasons"]] == ["oom", "memory_leak", "kv"]
    assert device_verdict([{"rule": "x", "severity": "info", "fired_ts_s": 1.0}])["level"] == "ok"


def test_hosts_first_and_last_seen_come_from_their_data(client):
    (host,) = client.get("/api/v1/hosts").get_json()["hosts"]
    # first sample; the agent's last report (NOW_S - 1) is newer than the last sample
    assert (host["name"], host["first_seen_s"], host["last_seen_s"]) == (
        F.HOST, F.T0, F.NOW_S - 1)
    (overview_host,) = client.get("/api/v1/overview").get_json()["hosts"]
    assert (overview_host["first_seen_s"], overview_host["last_seen_s"]) == (F.T0, F.NOW_S - 1)


def test_a_process_last_seen_moves_with_its_samples(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 'p.db'}", host_name="h")
    store.upsert_process(77, 1000.0, name="server", device_indexes=[0])
    store.write([Sample(1000.0 + i, 0, Phase.DECODE, "torch", 77, allocated_bytes=1)
                 for i in range(50)])
    c = create_app(None, store, clock=FakeClock(1050.0)).test_client()
    (p,) = c.get("/api/v1/processes").get_json()["processes"]
    assert (p["first_seen_s"], p["last_seen_s"]) == (1000.0, 1049.0)
    (p,) = c.get("/api/v1/overview").get_json()["processes"]
    assert p["last_seen_s"] == 1049.0


def test_openapi_at_the_root_redirects_to_the_document(client):
    r = client.get("/openapi.json")
    assert (r.status_code, r.headers["Location"]) == (308, "/api/v1/openapi.json")
    assert "/freshness" in client.get(r.headers["Location"]).get_json()["paths"]


def test_phase_shares_per_bucket_without_phase_events_at_an_hour(any_url):
    """The demo's case: phases only on samples, 10 Hz, an hour: no bands, but shares (counted
    in SQL: SQLite and PostgreSQL bucket differently)."""
    store = Store.open(any_url, host_name="h")
    store.write([F.torch_sample(F.T0 + i, 1) for i in range(3600)])
    c = create_app(None, store).test_client()
    doc = c.get(f"/api/v1/timeline?device=1&start={F.T0}&end={F.T0 + 3600}").get_json()
    assert (doc["phase_source"], doc["phases"]) == ("samples", [])
    shares = doc["phase_shares"]
    assert len(shares["ts"]) == 240 and shares["ts"][:2] == [F.T0, F.T0 + 15]
    # 15 s buckets of one sample a second: 2 prefill + 13 decode, then 7 decode + 8 idle
    assert [shares[p][0] for p in ("prefill", "decode", "idle")] == [2 / 15, 13 / 15, 0.0]
    assert [shares[p][1] for p in ("prefill", "decode", "idle")] == [0.0, 7 / 15, 8 / 15]
    fig = c.get(f"/api/v1/figures/timeline?device=1&start={F.T0}&end={F.T0 + 3600}").get_json()
    assert [t["name"] for t in fig["data"] if t["yaxis"] == "y6"] == [
        "prefill share", "decode share", "idle share"]


def test_phases_at_six_hours_from_events_are_shares(seeded):
    """720 requests x 3 bands do not fit 100 buckets: shares instead of nothing."""
    c = create_app(seeded.config(), seeded.store, clock=seeded.clock).test_client()
    doc = c.get("/api/v1/timeline?device=0&span=21600&max_points=100"
                "&columns=allocated_bytes").get_json()
    assert doc["phases"] == [] and doc["phase_source"] == "events"
    shares = doc["phase_shares"]
    inside = [i for i, t in enumerate(shares["ts"]) if F.T0 + 60 <= t < F.T0 + 7000]
    assert inside and all(shares["prefill"][i] == pytest.approx(2 / 30, abs=0.02)
                          for i in inside)


def test_alert_values_carry_their_unit(seeded):
    from vramscope.dashboard.alert_text import metrics_by_rule, value_text

    config = seeded.config(alerts={"rules": [{"name": "reserved_high",
                                              "metric": "reserved_bytes",
                                              "threshold": 1e9}]})
    metrics = metrics_by_rule(config)
    assert value_text("oom_risk", 1.0, metrics) == "warning (risk level 1)"
    assert value_text("oom_risk_critical", 2.0, metrics) == "critical (risk level 2)"
    assert value_text("kv_exhaustion", 14.0532, metrics) == "14.1 s"
    assert value_text("memory_leak", 1.0, metrics) == "leak"
    assert value_text("reserved_high", 3 * 2**30, metrics) == "3.00 GiB"
    assert value_text("unknown_rule", 2.5, metrics) == "2.5"
    assert value_text("oom", None, metrics) is None


def test_the_alerts_api_gives_the_value_text(client):
    alerts = client.get("/api/v1/alerts").get_json()["alerts"]
    assert {a["rule"]: a["value_text"] for a in alerts} == {"idle_floor_leak": "2.5",
                                                            "headroom": "0.02"}


def test_the_risk_page_reports_the_stored_verdict_of_the_riskiest_process(client):
    """The seeded device 0 ends after an OOM at T0 + 7,100 (the episode restarts): the stored
    verdict of pid 4141, the only process, says ok; the page says so with its time and pid."""
    doc = client.get(f"/api/v1/figures/risk?device=0&start={F.T0}&end={F.T0 + F.DURATION_S}"
                     ).get_json()
    now = doc["now"]
    assert (now["level"], now["pid"], now["cause"]) == ("ok", 4141, None)
    assert set(now) == {"ts_s", "level", "reasons", "cause", "at_risk_from_pid", "cause_text",
                        "headroom_bytes", "time_to_oom_s", "time_to_oom_low_s",
                        "time_to_oom_high_s", "pid", "process"}
    assert [p["risk"]["level"] for p in doc["processes"]] == ["ok"]
    # the agent's stored alerts are the warnings (the verdicts' rises only without them)
    assert [(w["ts"], w["rule"]) for w in doc["warnings"]] == [
        (F.T0 + 5400, "idle_floor_leak"), (F.T0 + 7000, "headroom")]
    notes = [a["text"] for a in doc["figure"]["layout"]["annotations"]]
    assert notes == ["warning: headroom under 5% of the limit",
                     "critical: headroom under 2% of the limit"]


def test_time_to_oom_axis_is_not_flattened_by_one_early_spike():
    from vramscope.dashboard import figures

    forecast = {"ts": [float(i) for i in range(20)],
                "time_to_oom_s": [140 * 3600.0] + [1200.0] * 19,
                "low_s": [None] * 20, "high_s": [None] * 20}
    fig = figures.risk_figure({"ts": [], "bytes": []}, forecast, [], None, {}, 1800.0)
    assert fig["layout"]["yaxis2"]["range"] == [0, pytest.approx(1.1)]  # 2 x 30 min, in hours


def test_capacity_counts_parameters_from_the_shape_by_default(client):
    """Defaults: the demo's Llama-3-8B shape, 8.03 B parameters counted with a gated MLP (the
    page once kept "6.74" whatever the shape); a smaller shape gives fewer weights."""
    doc = client.get("/api/v1/capacity").get_json()
    assert doc["shape"]["name"] == "Llama-3-8B shape"
    assert (doc["shape"]["params_b"], doc["shape"]["params_source"]) == (
        8.03, "counted from the shape, gated MLP")
    assert doc["estimate"]["weights_bytes"] == 8_030_261_248 * 2  # bf16
    half = client.get("/api/v1/capacity?layers=16").get_json()
    assert half["shape"]["params_b"] == 4.54
    plain = client.get("/api/v1/capacity?gated=false").get_json()["shape"]
    assert (plain["params_b"], plain["params_source"]) == (6.151, "counted from the shape, "
                                                                   "plain MLP")
    given = client.get("/api/v1/capacity?params_b=7").get_json()["shape"]
    assert (given["params_b"], given["params_source"]) == (7.0, "given")


def test_capacity_figure_puts_the_estimate_beside_the_memory_it_was_sized_for(client):
    both = client.get("/api/v1/figures/capacity").get_json()
    est = both["capacity"]["estimate"]
    traces = {t["name"]: t for t in both["figure"]["data"]}
    column = "estimate: Llama-3-8B shape"
    assert traces["estimate"]["x"][-1] == column
    assert traces["estimate"]["y"] == [None, None, est["total_bytes"] / 2**30]
    assert traces["limit"]["y"][-1] == est["gpu_memory_bytes"] / 2**30
    assert traces["usable after margin"]["y"][-1] == est["usable_bytes"] / 2**30


def test_phase_shares_from_samples_stop_at_six_hours(tmp_path):
    """Counting phases scans raw samples (rollups carry none): bounded to 6 h windows."""
    store = Store.open(f"sqlite:///{tmp_path / 'p.db'}", host_name="h")
    store.write([F.torch_sample(F.T0 + i, 1) for i in range(60)])
    c = create_app(None, store).test_client()
    doc = c.get(f"/api/v1/timeline?device=1&end={F.T0 + 60}&span=86400"
                "&columns=allocated_bytes").get_json()
    assert (doc["phases"], doc["phase_shares"], doc["phase_source"]) == (
        [], None, "zoom to 6 h or less")
    doc = c.get(f"/api/v1/timeline?device=1&end={F.T0 + 60}&span=21600"
                "&columns=allocated_bytes").get_json()
    assert doc["phase_source"] == "samples" and doc["phase_shares"]["ts"]
