"""A vLLM server's pages in headless Chromium (issue 33, and issue 34's catching-up banner), on
the scripted database of ``tests/support/vllm_store.py`` (what the plugin writes on a CPU host).

An idle, connected server shows no stale banner and says "idle"; a server whose agent stopped,
or whose process is gone, says which; history being written says "catching up"; the Overview
lists the server (model, pid, port) with its KV usage and requests per minute and the old pids
as ended; the timeline draws KV as steps with a gap and the running / waiting / preemption lane.
"""

from __future__ import annotations

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.dashboard.app import create_app

from tests.dashboard.browser.test_pages import console_errors, driver, screenshot, wait_for
from tests.support import dashboard_fixtures as F
from tests.support import vllm_store as V

pytestmark = pytest.mark.browser
_ = driver  # the shared Chromium fixture


def _serve(store, now: float = V.NOW) -> F.ServedApp:
    return F.ServedApp(create_app(V.config(), store, clock=FakeClock(now)))


def _overview(driver, server: F.ServedApp) -> None:
    driver.get(server.url + "/")
    wait_for(driver, "return document.querySelector('#processes-table table') !== null && "
                     "!document.getElementById('live').classList.contains('stale');",
             "the processes table and the freshness answer")


def _rows(driver, table: str) -> list[list[str]]:
    return driver.execute_script(
        f"return [...document.querySelectorAll('#{table} tbody tr')]"
        f".map(r => [...r.cells].map(c => c.textContent));")


def test_an_idle_server_is_idle_and_listed_with_its_kv_and_requests(driver, tmp_path):
    server = _serve(V.vllm_store(tmp_path / "idle.db"))
    try:
        _overview(driver, server)
        assert driver.find_element("id", "stale-banner").get_attribute("hidden") is not None
        assert driver.find_element("id", "live").text == "● idle"
        heads = driver.execute_script("return [...document.querySelectorAll("
                                      "'#processes-table thead th')].map(h => h.textContent);")
        rows = [dict(zip(heads, r)) for r in _rows(driver, "processes-table")]
        assert [(r["PID"], r["State"][:5]) for r in rows] == [
            ("4242", "conne"), ("4200", "ended"), ("4100", "ended")]  # the live server first
        live = rows[0]
        assert (live["Name"], live["Model"]) == (V.NAME, V.MODEL)
        assert (live["KV used"], live["Requests/min"]) == ("0.0 % (0 / 63 blocks)", "2")
        dev_heads = driver.execute_script("return [...document.querySelectorAll("
                                          "'#devices-table thead th')].map(h => h.textContent);")
        (device,) = [dict(zip(dev_heads, r)) for r in _rows(driver, "devices-table")]
        assert device["Last sample"].endswith("(idle)")
        assert (device["KV used"], device["Requests/min"]) == ("0.0 %", "2")
        # no GPU, no memory counter: no empty memory charts, a line that says why
        assert driver.execute_script(
            "return [document.getElementById('overview-plot').hidden,"
            " document.getElementById('no-memory-note').hidden];") == [True, False]
        screenshot(driver, "vllm-overview-idle")
        assert console_errors(driver) == []
    finally:
        server.close()


@pytest.mark.parametrize(("kwargs", "now", "says"), [
    ({}, V.NOW + 60, "The agent's last report is 62.0 s old: is the agent running?"),
    ({"clients": 0, "seen_ts": V.IDLE2}, V.NOW,
     "no server process is connected to it: did the server stop?"),
])
def test_stale_names_who_stopped_reporting(driver, tmp_path, kwargs, now, says):
    server = _serve(V.vllm_store(tmp_path / "stale.db", **kwargs), now)
    try:
        driver.get(server.url + "/")
        wait_for(driver, "return !document.getElementById('stale-banner').hidden;",
                 "the stale banner")
        banner = driver.find_element("id", "stale-banner").text
        assert banner.startswith("Stale data: the newest sample is ") and says in banner
        assert driver.find_element("id", "live").text.startswith("○ stale")
    finally:
        server.close()


def test_history_being_written_says_catching_up(driver, tmp_path):
    later = V.NOW + 6 * 3600
    store = V.vllm_store(tmp_path / "demo.db", agent_ts=later - 1, clients=0,
                         rows_per_s=1500.0, seen_ts=V.NOW - 300)
    server = _serve(store, later)
    try:
        driver.get(server.url + "/")
        wait_for(driver, "return !document.getElementById('stale-banner').hidden;",
                 "the catching-up banner")
        banner = driver.find_element("id", "stale-banner").text
        assert banner.startswith("Catching up: the agent is writing stored history")
        assert "Is the agent running" not in banner and "Stale" not in banner
        assert driver.find_element("id", "live").text == "◐ catching up"
        screenshot(driver, "vllm-overview-catching-up")
    finally:
        server.close()


def test_the_timeline_draws_kv_steps_with_a_gap_and_the_load_lane(driver, tmp_path):
    server = _serve(V.vllm_store(tmp_path / "tl.db"))
    start, end = V.WINDOW
    try:
        driver.get(f"{server.url}/timeline?device=0&start={start}&end={end}")
        wait_for(driver, "const e = document.getElementById('timeline-plot');"
                         "return e && e._fullLayout && e.data && e.data.length > 0;",
                 "the timeline")
        drawn = driver.execute_script(
            "return document.getElementById('timeline-plot').data.map("
            "t => [t.name, t.line ? t.line.shape || null : null, t.y.filter(v => v === null)"
            ".length]);")
        by_name = {name: (shape, gaps) for name, shape, gaps in drawn}
        assert by_name["KV blocks used"] == ("hv", 1)  # a step line, broken once: 51 s silent
        assert by_name["running requests"] == ("hv", 0)
        assert by_name["waiting requests"] == ("hv", 0)
        assert "preemptions" in by_name
        screenshot(driver, "vllm-timeline")
        assert console_errors(driver) == []
    finally:
        server.close()
