"""A new user's first hour, in headless Chromium (issue 34, items 4, 5 and 12).

One host, three devices: GPU 0 holds an imported 150 s recording that ended ten hours ago (torch
every second, NVML every 10 s up to 30 s before the end), GPU 1 has a warning alert and GPU 2 a
critical one. The agent reports now with no client connected while a server process is listed.

- device pages opened without a device open on GPU 2, the Overview's first row, with its verdict;
- the old 150 s recording fills the timeline; the Overview says when device used and reserved
  were each sampled, as they come from different moments;
- legends list only series that draw; Capacity's "Fits: no" is a critical badge; "Clients 0"
  beside a connected process says why; times show in the browser's zone when chosen (kept in
  localStorage), plots included; the From / to inputs set an absolute window.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.records import Phase, Sample
from vramscope.agent.store import Store

from tests.dashboard.browser.test_pages import console_errors, driver, wait_for  # noqa: F401
from tests.support import dashboard_fixtures as F

pytestmark = pytest.mark.browser
GIB, MIB = 2**30, 2**20
T0 = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
NOW_S = T0 + 10 * 3600
PAD_S = 3.0  # 2 % of the 150 s span on each side


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from vramscope.agent.config import parse_config
    from vramscope.dashboard.app import create_app

    store = Store.open(f"sqlite:///{tmp_path_factory.mktemp('first-hour') / 'f.db'}",
                       host_name="h")
    for i in range(3):
        store.describe_device(i, uuid=f"GPU-{i}", name="NVIDIA H100", total_bytes=80 * GIB)
    # a fragmented allocator: its largest free block (4 MiB) far under the axis fitted to the
    # memory in use, so that line draws nowhere
    torch = [Sample(T0 + t, 0, Phase.DECODE, "torch", 777, allocated_bytes=GIB,
                    reserved_bytes=2 * GIB, largest_free_block_bytes=4 * MIB)
             for t in range(151)]
    nvml = [Sample(T0 + t, 0, Phase.UNKNOWN, "nvml", None, device_used_bytes=615 * MIB,
                   device_total_bytes=80 * GIB) for t in range(0, 121, 10)]
    store.write(torch + nvml, [])
    store.open_alert("idle_floor_leak", "warning", T0, device=1, message="floor rising")
    store.open_alert("headroom", "critical", T0, device=2, message="headroom 2 %")
    store.upsert_process(777, NOW_S - 1, name="vllm-serve", device_indexes=[0])
    store.write_agent_stats(NOW_S - 1, clients=0, rows_per_s=0.0, queue_depth=0,
                            dropped_total=0, rejected_total=0, db_size_bytes=None)
    server = F.ServedApp(create_app(parse_config({}, None, {}), store, clock=FakeClock(NOW_S)))
    yield server
    server.close()
    store.close()


def _open(driver, served, path: str, ready: str):  # noqa: F811
    driver.get(served.url + path)
    wait_for(driver, f"return !!document.querySelector({ready!r});", ready)


def _plot_ready(driver, served, path: str):  # noqa: F811
    driver.get(served.url + path)
    wait_for(driver, "const e = document.getElementById('timeline-plot');"
                     "return e && e._fullLayout && e.data && e.data.length > 0;", "the timeline")


def _text(driver, css: str) -> str:  # noqa: F811
    return driver.execute_script(f"return document.querySelector({css!r}).textContent;")


@pytest.mark.parametrize("page", ["timeline", "leaks", "risk"])
def test_device_pages_open_on_the_most_severe_device(driver, served, page):  # noqa: F811
    with urllib.request.urlopen(served.url + "/api/v1/overview") as r:
        first = json.load(r)["devices"][0]
    assert (first["device"], first["verdict"]["level"]) == (2, "critical")
    _open(driver, served, f"/{page}", "#device-verdict")
    wait_for(driver, "const e = document.querySelector('#device-verdict > span:first-child');"
                     "return e && e.textContent === 'Verdict for h · GPU 2: ';",
             "the verdict line refreshed from /api/v1/devices")
    assert driver.execute_script("return document.body.dataset.device;") == "2"
    assert driver.execute_script("return document.getElementById('device-select').value;") == "2"
    assert _text(driver, "#device-verdict .badge") == "critical"
    assert _text(driver, "#device-verdict .reasons") == "headroom (critical)"
    assert console_errors(driver) == []


def test_a_device_given_in_the_address_keeps_its_verdict(driver, served):  # noqa: F811
    _open(driver, served, "/timeline?device=1", "#device-verdict")
    assert _text(driver, "#device-verdict .badge") == "warning"
    assert _text(driver, "#device-verdict .reasons") == "idle_floor_leak (warning)"


def test_above_a_window_that_ended_the_verdict_line_says_it_is_now(driver, served):  # noqa: F811
    """The verdict line is the device's verdict now: above a window ending an hour ago it says
    so, also once the page has refreshed it; a window up to now reads as before."""
    end = NOW_S - 3600
    path = f"/timeline?device=2&start={end - 600:.0f}&end={end:.0f}"
    with urllib.request.urlopen(served.url + path) as r:  # as the server renders it
        assert "Verdict now (after the window shown) for h · GPU 2:" in r.read().decode()
    _open(driver, served, path, "#device-verdict")
    wait_for(driver, "const e = document.querySelector('#device-verdict > span:first-child');"
                     "return e && e.textContent === "
                     "'Verdict now (after the window shown) for h · GPU 2: ';",
             "the refreshed verdict line saying it is now's")
    assert _text(driver, "#device-verdict .badge") == "critical"
    _open(driver, served, "/timeline?device=2&span=600", "#device-verdict")
    wait_for(driver, "const e = document.querySelector('#device-verdict > span:first-child');"
                     "return e && e.textContent === 'Verdict for h · GPU 2: ';",
             "the verdict line of a window up to now")
    assert console_errors(driver) == []


def _x_range(driver) -> list[str]:  # noqa: F811
    return driver.execute_script(
        "return document.getElementById('timeline-plot')._fullLayout.xaxis.range;")


def _utc(text: str) -> float:
    from datetime import datetime, timezone

    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def test_an_old_short_recording_fills_the_timeline(driver, served):  # noqa: F811
    _plot_ready(driver, served, "/timeline?device=0")
    lo, hi = _x_range(driver)
    assert (_utc(lo), _utc(hi)) == (T0 - PAD_S, T0 + 150 + PAD_S)
    assert console_errors(driver) == []


def test_legends_list_only_series_that_draw(driver, served):  # noqa: F811
    _plot_ready(driver, served, "/timeline?device=0")
    names = driver.execute_script(
        "return document.getElementById('timeline-plot').data.map(t => t.name);")
    legend = driver.execute_script(
        "return [...document.querySelectorAll('#timeline-plot .legendtext')]"
        ".map(e => e.textContent);")
    assert "largest free block" in names  # 4 MiB, under the axis' low end
    assert "largest free block" not in legend
    assert {"allocated", "reserved", "device used", "limit"} <= set(legend)


def _device_row(driver, gpu: str) -> list[str]:  # noqa: F811
    return driver.execute_script(
        "return [...document.querySelectorAll('#devices-table tbody tr')]"
        ".map(r => [...r.cells].map(c => c.textContent))"
        f".find(cells => cells[0].startsWith('h · GPU {gpu}'));")


def test_overview_says_when_used_and_reserved_were_sampled(driver, served):  # noqa: F811
    _open(driver, served, "/", "#devices-table table")
    row = _device_row(driver, "0")
    assert row[3] == "2.00 GiBat 2023-11-14 22:15:50Z"  # reserved: torch's newest, T0 + 150
    assert row[4] == "615.0 MiBat 2023-11-14 22:15:20Z"  # device used: NVML's, T0 + 120


def test_clients_zero_beside_a_connected_process_says_why(driver, served):  # noqa: F811
    _open(driver, served, "/", "#health-table table")
    cells = driver.execute_script(
        "return [...document.querySelectorAll('#health-table tbody td')].map(c => c.textContent);")
    assert cells[2] == "0 (+1 writing without a socket: simulated or replayed)"


def test_capacity_shortfall_is_a_critical_badge(driver, served):  # noqa: F811
    _open(driver, served, "/capacity?params_b=400&gpu_gib=80", "#estimate-facts .badge")
    assert driver.execute_script(
        "return document.querySelector('#estimate-facts .badge').className;") == "badge critical"
    assert _text(driver, "#estimate-facts .badge").startswith("no, short by ")


def test_times_in_the_browsers_zone_when_chosen(driver, served):  # noqa: F811
    driver.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Kolkata"})
    try:
        _open(driver, served, "/", "#devices-table table")
        assert _text(driver, "#tz-name") == "UTC"
        driver.find_element("id", "tz-toggle").click()  # reloads the page in the local zone
        wait_for(driver, "return document.getElementById('tz-name').textContent"
                         ".startsWith('Asia/');", "the local zone")
        wait_for(driver, "return !!document.querySelector('#devices-table table');", "devices")
        # Chromium's ICU names the zone by its old name
        assert _text(driver, "#tz-name") == "Asia/Calcutta (this browser)"
        assert _device_row(driver, "0")[3] == "2.00 GiBat 2023-11-15 03:45:50 +05:30"
        _plot_ready(driver, served, "/timeline?device=0")  # remembered on the next page
        assert _x_range(driver)[0] == "2023-11-15 03:43:17"  # T0 - 3 s, 5:30 ahead of UTC
        driver.execute_script(  # a zoom, in local wall clock, puts Unix seconds in the address
            "Plotly.relayout('timeline-plot', {'xaxis.range': "
            "['2023-11-15 03:44:20', '2023-11-15 03:45:20']});")
        wait_for(driver, "return location.search.includes('start=');", "the zoomed address")
        query = urllib.parse.parse_qs(urllib.parse.urlparse(driver.current_url).query)
        assert (query["start"], query["end"]) == ([f"{T0 + 60:.3f}"], [f"{T0 + 120:.3f}"])
        driver.find_element("id", "tz-toggle").click()
        wait_for(driver, "return document.getElementById('tz-name').textContent === 'UTC';",
                 "UTC again")
        assert driver.execute_script(
            "return localStorage.getItem('vramscope.timezone');") == "utc"
        _plot_ready(driver, served, "/timeline?device=0")  # UTC even in a browser 5:30 ahead
        assert _x_range(driver)[0] == "2023-11-14 22:13:17"
    finally:
        driver.execute_script("localStorage.clear();")
        driver.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": ""})


def test_from_and_to_set_an_absolute_window(driver, served):  # noqa: F811
    _plot_ready(driver, served, "/timeline?device=0")
    assert driver.execute_script(
        "return document.getElementById('start-at').value;") == "2023-11-14T22:13:17"
    driver.execute_script(
        "document.getElementById('start-at').value = '2023-11-14T22:14:00';"
        "document.getElementById('end-at').value = '2023-11-14T22:15:00';")
    driver.find_element("css selector", "#picker-form button[type=submit]").click()
    wait_for(driver, "return location.search.includes('start=');", "the new address")
    query = urllib.parse.parse_qs(urllib.parse.urlparse(driver.current_url).query)
    assert (query["device"], query["start"], query["end"]) == (
        ["0"], [f"{T0 + 40:.3f}"], [f"{T0 + 100:.3f}"])
    wait_for(driver, "const e = document.getElementById('timeline-plot');"
                     "return e && e._fullLayout && e.data && e.data.length > 0;", "the plot")
    lo, hi = _x_range(driver)
    assert (_utc(lo), _utc(hi)) == (T0 + 40, T0 + 100)
    assert console_errors(driver) == []
