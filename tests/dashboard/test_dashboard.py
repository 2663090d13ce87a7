"""The dashboard through Flask's test client: every route, error paths, security headers, auth.

Expected values come from the seeded database's generator (tests/support/dashboard_fixtures.py).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import threading
import urllib.request

import pytest
from vramscope.agent.config import parse_config
from vramscope.agent.errors import ConfigError, UsageError
from vramscope.agent.store import Store
from vramscope.dashboard.app import create_app
from vramscope.dashboard.security import check_bind, is_loopback

from tests.support import dashboard_fixtures as F

seeded, dash_app, client = F.seeded, F.dash_app, F.client  # shared fixtures

PAGES = ["/", "/timeline", "/leaks", "/risk", "/alerts", "/postmortems", "/capacity"]
WINDOW = f"start={F.T0}&end={F.T0 + F.DURATION_S}"


@pytest.mark.parametrize("path", PAGES)
def test_every_page_renders_with_its_script_and_no_inline_script(client, path):
    r = client.get(path)
    assert r.status_code == 200
    html = r.get_data(as_text=True)
    assert '<script src="/static/app.js" defer></script>' in html
    assert "<script>" not in html  # CSP script-src 'self': no inline script at all
    assert f'data-page="{path.strip("/") or "overview"}"' in html


def test_postmortem_page_and_missing_one(client, seeded):
    assert client.get(f"/postmortems/{seeded.postmortem_id}").status_code == 200
    r = client.get("/postmortems/999")
    assert r.status_code == 404
    assert r.mimetype == "text/html"
    assert "no post-mortem with id 999" in r.get_data(as_text=True)


def test_plotly_is_served_from_the_installed_package(client):
    import plotly

    r = client.get("/vendor/plotly.min.js")
    assert r.status_code == 200
    assert r.mimetype == "text/javascript"
    with open(plotly.__file__.replace("__init__.py", "package_data/plotly.min.js"), "rb") as f:
        assert r.data == f.read()
    assert b"cdn" not in client.get("/timeline").data.lower()


def test_healthz(client):
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.get_json() == {"status": "ok", "now_s": F.NOW_S}


def test_healthz_is_503_when_the_database_is_gone(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 'x.db'}", host_name="h")
    app = create_app(None, store)
    with store.engine.begin() as c:
        c.exec_driver_sql("DROP TABLE samples")
    r = app.test_client().get("/healthz")
    assert r.status_code == 503
    assert r.get_json()["status"] == "error"


# --- API ---------------------------------------------------------------------------------------
def test_hosts_devices_processes(client):
    assert [h["name"] for h in client.get("/api/v1/hosts").get_json()["hosts"]] == [F.HOST]
    devices = client.get("/api/v1/devices").get_json()["devices"]
    assert [(d["host"], d["device"], d["name"]) for d in devices] == [
        (F.HOST, 0, "NVIDIA H100 80GB HBM3"), (F.HOST, 1, "NVIDIA H100 80GB HBM3")]
    last_t = F.T0 + (F.STEPS - 1) * F.STEP_S
    d0 = devices[0]
    assert d0["latest"]["allocated_bytes"] == F.torch_sample(last_t, 0).allocated_bytes
    assert d0["latest"]["device_total_bytes"] == F.LIMIT_BYTES
    assert d0["latest"]["kv_blocks_total"] == F.KV_BLOCKS_TOTAL
    assert d0["latest"]["phase"] == F.phase_at(last_t).value == "idle"
    assert d0["last_sample_age_s"] == pytest.approx(F.NOW_S - last_t)
    assert (d0["risk"], d0["active_alerts"]) == ("warning", 1)  # the open leak alert
    assert (devices[1]["risk"], devices[1]["active_alerts"]) == ("ok", 0)
    procs = client.get("/api/v1/processes").get_json()["processes"]
    assert [(p["pid"], p["name"]) for p in procs] == [(4141, F.XSS_NAME), (4242, "vllm-serve")]


def test_overview_document(client):
    doc = client.get("/api/v1/overview").get_json()
    assert doc["now_s"] == F.NOW_S
    # the worst device verdict: device 0's warning (device 1 is ok)
    assert (doc["level"], [d["risk"] for d in doc["devices"]]) == ("warning", ["warning", "ok"])
    agent = doc["hosts"][0]["agent"]
    assert (agent["clients"], agent["dropped_total"], agent["queue_depth"]) == (2, 7, 3)
    assert [a["rule"] for a in doc["alerts"]] == ["idle_floor_leak"]
    assert doc["alerts"][0]["labels"] == {"server": "<i>api</i>"}


def test_the_overview_brings_its_figures_from_one_computation(client, monkeypatch):
    """The overview page refreshes with one request: the figures of /figures/overview and
    /figures/processes come in the document, built from its own device rows (computed once)."""
    from vramscope.dashboard import queries

    separate = (client.get("/api/v1/figures/overview").get_json(),
                client.get("/api/v1/figures/processes").get_json())
    calls = []
    device_rows = queries.device_rows
    monkeypatch.setattr(queries, "device_rows",
                        lambda *a, **k: calls.append(1) or device_rows(*a, **k))
    doc = client.get("/api/v1/overview?figures=true").get_json()
    assert calls == [1]
    assert (doc["figures"]["overview"], doc["figures"]["processes"]) == separate
    assert "figures" not in client.get("/api/v1/overview").get_json()
    bad = client.get("/api/v1/overview?figures=maybe")
    assert bad.status_code == 400
    assert bad.get_json()["error"]["message"] == ("parameter 'figures': expected true or false, "
                                                  "got 'maybe'")


def test_timeline_keeps_bucket_peaks(client):
    doc = client.get(f"/api/v1/timeline?device=0&{WINDOW}&max_points=100").get_json()
    assert doc["bucket_s"] == F.DURATION_S / 100
    alloc = doc["series"]["allocated_bytes"]
    assert len(alloc["ts"]) == 100
    first = [F.torch_sample(F.T0 + i * F.STEP_S, 0).allocated_bytes for i in range(36)]
    assert (alloc["min"][0], alloc["max"][0]) == (min(first), max(first))  # 72 s = 36 samples
    assert doc["series"]["device_total_bytes"]["max"] == [F.LIMIT_BYTES] * 100
    assert [r["ts"] for r in doc["retries"]] == [F.T0 + 5976, F.T0 + 6552]  # buckets of 6000, 6600
    assert [r["count"] for r in doc["retries"]] == [1, 1]
    assert [(a["ts"], a["rule"]) for a in doc["alerts"]] == [(F.T0 + 5400, "idle_floor_leak"),
                                                            (F.T0 + 7000, "headroom")]


def test_timeline_phase_bands_and_markers(client):
    doc = client.get(f"/api/v1/timeline?device=0&{WINDOW}").get_json()
    assert doc["phase_source"] == "events"
    requests = F.DURATION_S // F.REQUEST_EVERY_S
    assert len(doc["phases"]) == 3 * requests
    assert doc["phases"][:2] == [{"phase": "prefill", "start": F.T0, "end": F.T0 + 2},
                                 {"phase": "decode", "start": F.T0 + 2, "end": F.T0 + 22}]
    names = [e["name"] for e in doc["events"]]
    assert names.count("request_start") == names.count("request_end") == requests
    assert names.count("oom") == names.count("kv_orphaned_blocks") == 1
    assert doc["events_truncated"] is False
    # 2,000 buckets asked of 2 h: 1,800 of 4 s on whole seconds (downsample.second_grid)
    assert len(doc["series"]["allocated_bytes"]["ts"]) == 1800
    assert set(doc["series"]["kv_tokens_per_block"]["max"]) == {14.0}  # 14 tokens a block


def test_too_many_request_markers_are_left_out_but_ooms_stay(client):
    doc = client.get(f"/api/v1/timeline?device=0&{WINDOW}&max_points=100").get_json()
    assert doc["events_truncated"] is True  # 480 request events > 100
    assert [e["name"] for e in doc["events"]] == ["kv_orphaned_blocks", "oom"]


def test_timeline_bands_from_sample_phases_when_zoomed_without_events(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 'p.db'}", host_name="h")
    store.write([F.torch_sample(F.T0 + i, 1) for i in range(60)])
    doc = create_app(None, store).test_client().get(
        f"/api/v1/timeline?device=1&start={F.T0}&end={F.T0 + 60}").get_json()
    assert doc["phase_source"] == "samples"
    assert doc["phases"][:3] == [{"phase": "prefill", "start": F.T0, "end": F.T0 + 2},
                                 {"phase": "decode", "start": F.T0 + 2, "end": F.T0 + 22},
                                 {"phase": "idle", "start": F.T0 + 22, "end": F.T0 + 30}]


def test_timeline_defaults_to_the_last_hour_of_data(client):
    doc = client.get("/api/v1/timeline?device=1&columns=allocated_bytes").get_json()
    last_t = F.T0 + (F.STEPS - 1) * F.STEP_S
    assert (doc["start"], doc["end"]) == (last_t - 3600, last_t)
    assert list(doc["series"]) == ["allocated_bytes"]


def test_span_sets_the_window_length(client):
    doc = client.get("/api/v1/timeline?device=1&span=900&columns=allocated_bytes").get_json()
    last_t = F.T0 + (F.STEPS - 1) * F.STEP_S
    assert (doc["start"], doc["end"]) == (last_t - 900, last_t)
    assert len(doc["series"]["allocated_bytes"]["ts"]) == 451  # one 2 s sample per 0.45 s bucket
    html = client.get("/timeline?device=0&span=21600").get_data(as_text=True)
    assert '<a href="/timeline?device=0&amp;span=21600" class="active">6 h</a>' in html
    assert 'data-span="21600.0"' in html


@pytest.mark.parametrize("route", ["timeline", "figures/timeline", "analysis", "figures/leaks",
                                   "figures/risk"])
def test_an_unknown_device_is_a_404_naming_it(client, route):
    """Empty series would read as "no data in this window" for a device that never existed."""
    r = client.get(f"/api/v1/{route}?device=7&{WINDOW}")
    assert r.status_code == 404
    assert r.get_json()["error"]["message"] == f"no device 7 on host {F.HOST}"


@pytest.mark.parametrize(("query", "parameter"), [
    ("start=abc", "start"), ("start=nan", "start"), ("end=inf", "end"),
    (f"start={F.T0 + 10}&end={F.T0}", "end"), ("max_points=0", "max_points"),
    ("max_points=10001", "max_points"), ("max_points=2.5", "max_points"),
    ("device=-1", "device"), ("device=x", "device"), ("columns=bogus", "columns"),
    ("host=" + "h" * 300, "host"), ("span=0", "span"), ("span=1e12", "span"),
])
def test_bad_timeline_parameters_are_400_naming_the_parameter(client, query, parameter):
    r = client.get(f"/api/v1/timeline?{query}")
    assert r.status_code == 400
    assert r.mimetype == "application/json"
    body = r.get_json()["error"]
    assert body["parameter"] == parameter
    assert body["message"].startswith(f"parameter '{parameter}': ")


@pytest.mark.parametrize("url", ["/api/v1/alerts?active=maybe", "/api/v1/alerts?limit=0",
                                 "/api/v1/postmortems?device=abc", "/api/v1/capacity?dtype=fp7",
                                 "/api/v1/capacity?layers=0", "/api/v1/figures/risk?start=x",
                                 "/api/v1/figures/leaks?device=5000",
                                 "/api/v1/analysis?end=-1"])
def test_other_bad_parameters_are_400(client, url):
    r = client.get(url)
    assert r.status_code == 400
    assert "parameter" in r.get_json()["error"]


def test_unknown_api_route_and_method_are_json(client):
    r = client.get("/api/v1/nope")
    assert (r.status_code, r.mimetype) == (404, "application/json")
    r = client.post("/api/v1/timeline")
    assert (r.status_code, r.mimetype) == (405, "application/json")
    assert "GET" in r.headers["Allow"]


def test_an_unexpected_error_is_a_500_that_leaks_nothing(dash_app, monkeypatch):
    from vramscope.dashboard import queries

    def boom(*a, **k):
        raise RuntimeError("secret path /var/lib/x")

    monkeypatch.setattr(queries, "overview", boom)
    r = dash_app.test_client().get("/api/v1/overview")
    assert r.status_code == 500
    assert "secret" not in r.get_data(as_text=True)
    assert r.get_json()["error"]["status"] == 500


def test_alerts(client, seeded):
    alerts = client.get("/api/v1/alerts").get_json()["alerts"]
    assert [(a["rule"], a["severity"], a["resolved_ts_s"]) for a in alerts] == [
        ("headroom", "critical", F.T0 + 7150), ("idle_floor_leak", "warning", None)]
    active = client.get("/api/v1/alerts?active=true").get_json()["alerts"]
    assert [a["id"] for a in active] == [seeded.active_alert_id]
    assert active[0]["message"] == "idle floor rising <b>2 GiB/h</b>"


def test_postmortems_and_snapshot_download(client, seeded):
    pms = client.get("/api/v1/postmortems").get_json()["postmortems"]
    assert len(pms) == 1
    pm = pms[0]
    assert (pm["id"], pm["cause"], pm["failed_alloc_bytes"]) == (
        seeded.postmortem_id, "fragmentation", 2 * F.GIB)
    assert pm["snapshot_available"] is True and "snapshot_path" not in pm
    assert pm["top_holders"][0] == {"size_bytes": 6 * F.GIB, "phase": "prefill",
                                    "frames": ["model.py:88:forward", "engine.py:310:step"]}
    one = client.get(f"/api/v1/postmortems/{seeded.postmortem_id}").get_json()
    assert one == pm
    snap = client.get(f"/api/v1/postmortems/{seeded.postmortem_id}/snapshot")
    assert snap.status_code == 200
    assert snap.data == seeded.snapshot_path.read_bytes()
    assert "attachment" in snap.headers["Content-Disposition"]
    assert client.get("/api/v1/postmortems/999").status_code == 404


def test_snapshot_not_kept_is_404(tmp_path):
    s = F.seed(tmp_path / "nosnap.db", with_snapshot=False)
    c = create_app(s.config(), s.store, clock=s.clock).test_client()
    assert c.get(f"/api/v1/postmortems/{s.postmortem_id}").get_json()["snapshot_available"] is False
    r = c.get(f"/api/v1/postmortems/{s.postmortem_id}/snapshot")
    assert r.status_code == 404
    assert "kept no snapshot" in r.get_json()["error"]["message"]


def test_snapshots_are_served_only_from_the_snapshot_dir(tmp_path, seeded):
    pm = F.postmortem("/etc/hostname")._replace(ts_s=F.T0 + 1)
    store = Store.open(f"sqlite:///{tmp_path / 'evil.db'}", host_name=F.HOST)
    pm_id = store.write_postmortem(pm)
    c = create_app(seeded.config(), store).test_client()  # snapshot_dir: the seeded one
    assert c.get(f"/api/v1/postmortems/{pm_id}").get_json()["snapshot_available"] is False
    assert c.get(f"/api/v1/postmortems/{pm_id}/snapshot").status_code == 404
    unset = create_app(None, seeded.store).test_client()  # hooks.snapshot_dir empty: none
    assert unset.get(f"/api/v1/postmortems/{seeded.postmortem_id}/snapshot").status_code == 404


def test_a_postmortem_without_diagnosis_gets_one(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 'd.db'}", host_name=F.HOST)
    pm_id = store.write_postmortem(F.postmortem(None)._replace(cause=None, remedies=()))
    doc = create_app(None, store).test_client().get(f"/api/v1/postmortems/{pm_id}").get_json()
    # 6 GiB cached free, but the largest block (512 MiB) cannot hold the 2 GiB request
    assert doc["cause"] == "fragmentation"
    assert doc["remedies"][0] == "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"


def test_postmortem_figures(client, seeded):
    figs = client.get(f"/api/v1/figures/postmortems/{seeded.postmortem_id}").get_json()
    seg = figs["segments"]["data"]
    assert [t["name"] for t in seg] == ["allocated", "largest hole", "other free"]
    assert seg[0]["x"][:5] == [20.0, 18.0, 16.0, 14.0, 12.0]  # MiB allocated per segment
    assert seg[1]["x"][:5] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert seg[2]["x"][:5] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert figs["holders"]["data"][0]["x"] == [6144.0, 2048.0, 1024.0]


def test_leaks_view_shows_the_stored_verdict_of_the_leaking_process(client):
    """The page reads the alert engine's stored verdict (the fixture stores them as the agent
    does): the seeded 2 GiB/h leak of pid 4141, first detected 3,000 s in, and pid 4242 none."""
    doc = client.get(f"/api/v1/figures/leaks?device=0&{WINDOW}").get_json()
    assert (doc["method"], doc["verdicts_from"]) == ("the alert engine's stored verdicts", "store")
    r = doc["result"]
    assert (r["detected"], r["state"], r["pid"]) == (True, "leak", 4141)
    assert r["slope_bytes_per_h"] == pytest.approx(2 * F.GIB, rel=1e-6)
    # leaking from the first sample: a steady rise in a process's first minutes is growth, not
    # a warm-up: the growth model names it 5.5 min in (it was 26 min)
    assert r["first_detected_ts_s"] == F.T0 + 330
    assert [(p["pid"], p["leak"]["state"], p["ended"]) for p in doc["processes"]] == [
        (4141, "leak", False)]
    assert doc["orphaned"] == [{"ts": F.T0 + 3000, "pid": 4141, "request_id": "req-100",
                                "blocks": 12, "message": None}]
    assert [t["name"] for t in doc["figure"]["data"]] == ["idle floor", "trend (Theil–Sen)"]
    healthy = client.get(f"/api/v1/figures/leaks?device=1&{WINDOW}").get_json()
    assert (healthy["result"]["state"], healthy["result"]["pid"]) == ("no_leak", 4242)


def test_risk_view(client):
    doc = client.get(f"/api/v1/figures/risk?device=0&{WINDOW}").get_json()
    assert doc["limit_bytes"] == F.LIMIT_BYTES
    last_t = F.T0 + (F.STEPS - 1) * F.STEP_S
    used = F.nvml_sample(last_t, 0).device_used_bytes
    assert doc["latest_headroom_bytes"] == F.LIMIT_BYTES - used
    stored = [(w["ts"], w["severity"]) for w in doc["warnings"] if w["rule"] != "risk model"]
    assert stored == [(F.T0 + 5400, "warning"), (F.T0 + 7000, "critical")]
    assert doc["figure"]["data"][0]["name"] == "headroom"


def test_every_window_gives_the_stored_answer(client):
    """The seeded window holds 36,000 samples: whatever its length, the Leaks, OOM risk and
    analysis answers are the stored verdicts (equal, not approximately), and the Leaks chart
    draws the floor the detector judged on, as its rows carry it."""
    leaks = client.get(f"/api/v1/figures/leaks?device=0&{WINDOW}").get_json()
    # one point per 30 s floor window (the windows its rows keep: the data's 30 s cycle),
    # from the first window's low at 22 s to the last before the newest row (6,962 s)
    assert leaks["processes"][0]["leak"]["windows"]["floor_s"] == 30.0
    assert leaks["figure"]["data"][0]["x"] == [(F.T0 + 22 + 30 * k) * 1000 for k in range(232)]
    assert leaks["floor_points"] == 232
    assert leaks["orphaned"][0]["blocks"] == 12  # rare events survive the tier
    risk = client.get(f"/api/v1/figures/risk?device=0&{WINDOW}").get_json()
    assert risk["forecast_method"] == "the alert engine's stored verdicts"
    doc = client.get(f"/api/v1/analysis?device=0&{WINDOW}").get_json()
    assert (doc["tier"], doc["bucket_s"]) == ("raw samples grouped in SQL, 120 s buckets", 120.0)
    assert doc["verdicts_from"] == "store"
    leak = doc["devices"]["0"]["leak"]
    assert (leak["state"], leak["pid"], leak["first_detected_ts"]) == (
        "leak", 4141, leaks["result"]["first_detected_ts_s"])
    assert leak["slope_bytes_per_s"] == leaks["result"]["slope_bytes_per_s"]
    assert doc["devices"]["0"]["processes"] == leaks["processes"]


def test_analysis_document(client):
    doc = client.get(f"/api/v1/analysis?device=0&{WINDOW}").get_json()
    assert doc["format"] == "vramscope.analysis/1"
    assert doc["devices"]["0"]["leak"]["detected"] is True


def test_capacity_estimate_beside_peaks(client):
    doc = client.get("/api/v1/capacity?layers=32&kv_heads=32&head_dim=128&hidden=4096"
                     "&params_b=7&context=4096&concurrency=1").get_json()
    assert doc["estimate"]["kv_bytes_per_token"] == 512 * 1024  # 2*32*32*128*2 bytes
    assert doc["estimate"]["gpu_memory_bytes"] == F.LIMIT_BYTES  # the largest measured limit
    peaks = {d["device"]: d["peaks"] for d in doc["devices"]}
    assert peaks[1]["allocated_bytes"] == 20 * F.GIB
    both = client.get("/api/v1/figures/capacity").get_json()
    assert [t["name"] for t in both["figure"]["data"]][-1] == "estimate"
    assert both["capacity"]["devices"] == doc["devices"]


def test_openapi_document_lists_every_api_route(dash_app, client):
    doc = client.get("/api/v1/openapi.json").get_json()
    assert doc["openapi"] == "3.0.3"
    routes = {r.rule.removeprefix("/api/v1").replace("<int:pm_id>", "{pm_id}")
              for r in dash_app.url_map.iter_rules() if r.rule.startswith("/api/v1/")}
    assert set(doc["paths"]) == routes - {"/openapi.json"}


# --- security ---------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/", "/api/v1/hosts", "/metrics", "/api/v1/nope", "/nope"])
def test_security_headers_everywhere(client, path):
    h = client.get(path).headers
    csp = h["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "script-src 'self';" in csp and "unsafe-eval" not in csp
    assert h["X-Content-Type-Options"] == "nosniff"
    assert h["X-Frame-Options"] == "DENY"


def test_known_plotly_gets_hash_pinned_styles_not_unsafe_inline(client):
    from vramscope.dashboard.app import plotly_js_path
    from vramscope.dashboard.security import PLOTLY_STYLE_HASHES, plotly_bundle_version

    csp = client.get("/").headers["Content-Security-Policy"]
    if plotly_bundle_version(plotly_js_path()) in PLOTLY_STYLE_HASHES:
        assert "unsafe-inline" not in csp and "'sha256-" in csp
    else:
        assert "style-src 'self' 'unsafe-inline'" in csp


def test_server_strings_are_escaped_in_html(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 'x.db'}", host_name="<b>host</b>")
    store.describe_device(0, name="<script>alert(1)</script>")
    c = create_app(None, store).test_client()
    html = c.get("/timeline").get_data(as_text=True)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script>alert(1)" not in html and "<b>host</b>" not in html
    err = c.get("/timeline?device=<img src=x>").get_data(as_text=True)
    assert "&lt;img src=x&gt;" in err and "<img src=x>" not in err


@pytest.fixture
def token_client(seeded):
    config = parse_config({"dashboard": {"token": "s3cret"}}, None, {})
    return create_app(config, seeded.store, clock=seeded.clock).test_client()


def test_token_is_required_on_every_route(token_client):
    for path in ("/", "/api/v1/hosts", "/metrics", "/healthz", "/vendor/plotly.min.js"):
        r = token_client.get(path)
        assert r.status_code == 401, path
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert token_client.get("/api/v1/hosts").get_json()["error"]["status"] == 401
    bad = token_client.get("/api/v1/hosts", headers={"Authorization": "Bearer s3cre"})
    assert bad.status_code == 401
    good = token_client.get("/api/v1/hosts", headers={"Authorization": "Bearer s3cret"})
    assert good.status_code == 200


def test_token_in_the_address_becomes_a_cookie(token_client):
    r = token_client.get("/timeline?device=1&token=s3cret")
    assert r.status_code == 303
    assert r.headers["Location"] == "/timeline?device=1"
    cookie = r.headers["Set-Cookie"]
    assert "vramscope_token=s3cret" in cookie and "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert token_client.get("/api/v1/hosts").status_code == 200  # the cookie now works
    assert token_client.get("/?token=wrong").status_code == 200  # cookie still valid


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("127.0.0.2", True),
                                                ("::1", True), ("[::1]", True),
                                                ("localhost", True), ("0.0.0.0", False),
                                                ("10.0.0.5", False), ("::", False),
                                                ("example.com", False)])
def test_loopback_detection(host, loopback):
    assert is_loopback(host) is loopback


def test_non_loopback_bind_needs_a_token():
    with pytest.raises(ConfigError, match="dashboard.token"):
        check_bind("0.0.0.0", "")
    check_bind("0.0.0.0", "tok")
    check_bind("127.0.0.1", "")


# --- the command ------------------------------------------------------------------------------
def test_cli_refuses_a_public_address_without_token(tmp_path, capsys):
    from vramscope.agent.cli import main

    rc = main(["dashboard", "--db", f"sqlite:///{tmp_path / 'c.db'}", "--host", "0.0.0.0"])
    assert rc == 1
    assert "refusing to listen on '0.0.0.0' without a token" in capsys.readouterr().err
    assert not (tmp_path / "c.db").exists()  # refused before opening anything


def test_cli_names_the_port_flag_when_the_address_is_in_use(tmp_path):
    from vramscope.dashboard.server import make_server

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    config = parse_config({"database": {"url": f"sqlite:///{tmp_path / 'c.db'}"}}, None, {})
    try:
        with pytest.raises(UsageError, match=f"127.0.0.1:{port} is in use.*--port"):
            make_server(config, "127.0.0.1", port)
    finally:
        taken.close()


def test_cli_serves_the_app_with_waitress(tmp_path):
    from vramscope.dashboard.server import make_server

    config = parse_config({"database": {"url": f"sqlite:///{tmp_path / 'c.db'}"}}, None, {})
    server, app = make_server(config, "127.0.0.1", 0)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.effective_port}/healthz"
        with urllib.request.urlopen(url, timeout=10) as r:
            assert json.load(r)["status"] == "ok"
        assert app.extensions["vramscope"].owns_store is True
    finally:
        server.close()
        app.extensions["vramscope"].store.close()


def test_dashboard_never_imports_hooks_torch_or_pynvml(seeded):
    code = textwrap.dedent(f"""
        import json, sys
        from vramscope.agent.store import Store
        from vramscope.dashboard.app import create_app
        store = Store.open({seeded.url!r}, host_name={F.HOST!r})
        c = create_app(None, store).test_client()
        for path in {json.dumps(PAGES + ["/api/v1/overview", "/api/v1/figures/timeline",
                                         "/api/v1/figures/leaks", "/api/v1/figures/risk",
                                         "/api/v1/analysis", "/api/v1/capacity", "/metrics"])}:
            assert c.get(path).status_code == 200, path
        bad = sorted(m for m in sys.modules
                     if m.split(".")[0] in ("hooks", "torch", "pynvml"))
        print(json.dumps(bad))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=str(F.Path(__file__).resolve().parents[2]))
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


@pytest.mark.postgres
def test_the_api_on_postgresql(postgres_url, tmp_path):
    s = F.seed(tmp_path / "pg.db", url=postgres_url)
    c = create_app(None, s.store, clock=s.clock).test_client()
    doc = c.get(f"/api/v1/timeline?device=0&{WINDOW}&max_points=100").get_json()
    first = [F.torch_sample(F.T0 + i * F.STEP_S, 0).allocated_bytes for i in range(36)]
    assert len(doc["series"]["allocated_bytes"]["ts"]) == 100
    assert doc["series"]["allocated_bytes"]["max"][0] == max(first)
    assert [d["risk"] for d in c.get("/api/v1/devices").get_json()["devices"]] == ["warning",
                                                                                   "ok"]
    assert c.get("/metrics").status_code == 200
    leaks = c.get(f"/api/v1/figures/leaks?device=0&{WINDOW}").get_json()
    assert leaks["floor_points"] == 232  # as on SQLite (test_every_window_gives_...)
    # the stored verdict, as on SQLite: the same rows, the same answer
    assert (leaks["result"]["state"], leaks["result"]["pid"],
            leaks["result"]["first_detected_ts_s"]) == ("leak", 4141, F.T0 + 330)
    # phase changes by lag() over: PostgreSQL finds what SQLite finds in the same records
    from vramscope.agent.store.phase_shares import phase_changes

    lite = F.seed(tmp_path / "lite.db")
    window = (F.T0, F.T0 + 900)
    on_pg = phase_changes(s.store, 0, *window, 10_000)
    assert on_pg and on_pg == phase_changes(lite.store, 0, *window, 10_000)
    lite.store.close()
    s.store.close()


@pytest.mark.parametrize("path", [*PAGES, "/api/v1/overview", "/api/v1/devices",
                                  "/api/v1/capacity", "/api/v1/figures/capacity",
                                  "/api/v1/freshness", "/api/v1/hosts",
                                  "/api/v1/figures/overview", "/metrics"])
def test_an_empty_store_serves_every_route(tmp_path, path):
    store = Store.open(f"sqlite:///{tmp_path / 'empty.db'}", host_name="h")
    assert create_app(None, store).test_client().get(path).status_code == 200


@pytest.mark.parametrize("path", ["/api/v1/timeline", "/api/v1/figures/timeline",
                                  "/api/v1/figures/leaks", "/api/v1/figures/risk",
                                  "/api/v1/analysis"])
def test_an_empty_store_says_no_device_has_reported(tmp_path, path):
    store = Store.open(f"sqlite:///{tmp_path / 'empty.db'}", host_name="h")
    r = create_app(None, store).test_client().get(path)
    assert r.status_code == 404
    assert r.get_json()["error"]["message"] == "no device has reported on host h yet"


@pytest.mark.parametrize(("host", "status"), [("localhost", 200), ("localhost:8321", 200),
                                              ("127.0.0.1:8321", 200), ("[::1]:8321", 200),
                                              ("[::1]", 200), ("evil.example:8321", 403),
                                              ("10.0.0.5", 403)])
def test_without_a_token_only_loopback_host_names_are_served(client, host, status):
    r = client.get("/api/v1/hosts", headers={"Host": host})
    assert r.status_code == status
    if status == 403:
        assert "dashboard.token" in r.get_json()["error"]["message"]


def test_with_a_token_any_host_name_is_served(token_client):
    r = token_client.get("/api/v1/hosts", headers={"Host": "gpu-dash.example",
                                                   "Authorization": "Bearer s3cret"})
    assert r.status_code == 200


def test_fleet_devices_riskiest_first(store):
    from vramscope.agent.config import parse_config
    from vramscope.agent.records import Sample
    from vramscope.dashboard.queries import device_rows

    t = 1_700_000_000.0
    store.write([Sample(t, 0, source="nvml", device_used_bytes=10, device_total_bytes=100,
                        host="a-host"),
                 Sample(t, 1, source="nvml", device_used_bytes=99, device_total_bytes=100,
                        host="a-host"),
                 Sample(t, 0, source="nvml", device_used_bytes=10, device_total_bytes=100,
                        host="b-host")])
    store.open_alert("oom_risk", "warning", t, device=0, host="b-host", message="low")
    rows = device_rows(store, parse_config({}, None, {}), t + 1)
    # The verdict is the alert engine's alone: a full device without an alert is "ok" here
    # (the dashboard once applied a headroom rule of its own and called it critical).
    assert [(r["host"], r["device"], r["risk"]) for r in rows] == [
        ("b-host", 0, "warning"), ("a-host", 0, "ok"), ("a-host", 1, "ok")]
    assert rows[0]["verdict"] == {"level": "warning", "reasons": [
        {"rule": "oom_risk", "severity": "warning", "message": "low", "fired_ts_s": t}]}
    assert rows[2]["verdict"] == {"level": "ok", "reasons": []}


def test_the_overview_names_the_leaking_process_from_the_stored_verdicts(client):
    """Each device row carries its running processes' stored verdicts (the Leaks page's):
    device 0's pid 4141 leaks 2 GiB/h, device 1's pid 4242 does not."""
    rows = {d["device"]: d for d in client.get("/api/v1/overview").get_json()["devices"]}
    [leaky] = rows[0]["verdicts"]
    assert (leaky["pid"], leaky["leak"], leaky["risk"]) == (4141, "leak", "ok")
    assert leaky["process"] == f"{F.XSS_NAME} (pid 4141)"
    assert leaky["leak_slope_bytes_per_h"] == pytest.approx(2 * F.GIB, rel=1e-6)
    leaks = client.get(f"/api/v1/figures/leaks?device=0&{WINDOW}").get_json()
    assert leaky["leak_slope_bytes_per_h"] == leaks["result"]["slope_bytes_per_h"]
    assert [(v["pid"], v["leak"]) for v in rows[1]["verdicts"]] == [(4242, "no_leak")]
