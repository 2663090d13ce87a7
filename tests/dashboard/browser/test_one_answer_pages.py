"""One answer in the browser (issue 31): the recording of ``tests/agent/test_one_answer.py`` (two
real client processes on one device through a real agent, one leaking 64 MiB a request, one
with a warm-up plateau; SQLite and PostgreSQL), and the Leaks, OOM-risk and Overview pages in
headless Chromium at windows of 15 min, 1 h and 24 h. Each page's per-process rows must read
what the alert engine stored: the leak state, the slope and the first detection (formatted by
the page's own ``rate`` / ``fmtTime``), the risk level; the leaking process named, and only
it."""

from __future__ import annotations

import pytest
from vramscope.agent.analysis.kv_leak import verdict_words
from vramscope.agent.config import parse_config
from vramscope.agent.store import Store
from vramscope.agent.store import verdicts as stored
from vramscope.dashboard.app import create_app

from tests.agent.test_one_answer import WINDOWS_S, recorded
from tests.dashboard.browser.test_pages import console_errors, driver, wait_for
from tests.support import dashboard_fixtures as F

pytestmark = pytest.mark.browser
_ = (driver, recorded)  # fixtures: the shared Chromium, the two-process recording

LEAK_WORDS = {"leak": "leak", "no_leak": "no leak", "insufficient_data": "not enough data yet"}


def _table(driver, table_id: str) -> dict[str, dict[str, str]]:
    """A table's rows by their first cell (the process), as {column: text}."""
    wait_for(driver, f"return document.querySelector('#{table_id} table') !== null;", table_id)
    heads, rows = driver.execute_script(
        f"const t = document.querySelector('#{table_id} table');"
        "return [[...t.querySelectorAll('thead th')].map(h => h.textContent),"
        " [...t.querySelectorAll('tbody tr')].map(r => [...r.cells].map(c => c.textContent))];")
    return {r[0]: dict(zip(heads, r)) for r in rows}


def overview_process_lines(driver, url: str, count: int) -> list[str]:
    """The Overview's per-process verdict lines, once ``count`` of them show."""
    driver.get(url + "/")
    wait_for(driver, "return document.querySelectorAll('#devices-table .process-verdict')"
                     f".length >= {count};", "the Overview's per-process verdicts")
    return driver.execute_script(
        "return [...document.querySelectorAll('#devices-table .process-verdict')]"
        ".map(e => e.textContent);")


def test_the_pages_show_each_process_s_stored_answer(recorded, driver):
    url, (leaky, healthy), last_s = recorded
    # the shared browser's log starts empty here: a page an earlier test left open polls a
    # server whose database is gone, and its errors are not this test's
    driver.get("about:blank")
    console_errors(driver)
    with Store.open(url) as store:
        live = {v.pid: v for v in stored.latest(store, 0, None, last_s)}
        names = {p["pid"]: p["process"] for p in stored.processes(store, 0, None, last_s)}
        server = F.ServedApp(create_app(parse_config({}, None), store))
        try:
            for width in WINDOWS_S:
                q = f"device=0&start={last_s - width}&end={last_s}"
                driver.get(f"{server.url}/leaks?{q}")
                leaks = _table(driver, "leak-processes-table")
                for pid, v in live.items():
                    row = leaks[names[pid]]
                    slope = driver.execute_script("return rate(arguments[0], arguments[1]);",
                                                  v.leak_slope_bytes_per_s * 3600,
                                                  v.leak_estimated_floor)
                    first = "–" if v.leak_first_detected_ts_s is None else driver.execute_script(
                        "return fmtTime(arguments[0]);", v.leak_first_detected_ts_s)
                    assert (row["Leak"], row["Slope"], row["First detected"]) == (
                        LEAK_WORDS[v.leak_state], slope, first), (width, pid)
                said = [name for name, row in leaks.items() if row["Leak"] == "leak"]
                assert said == [names[leaky]], width
                driver.get(f"{server.url}/risk?{q}")
                risk = _table(driver, "risk-processes-table")
                assert {name: row["Risk"] for name, row in risk.items()} == {
                    names[pid]: v.risk_level for pid, v in live.items()}, width
            lines = overview_process_lines(driver, server.url, 2)
            # the rate, its interval and the time to OOM with its range, as `status` says them
            said = verdict_words(live[leaky].to_json()["leak"])
            assert ", full in about " in said and " (" in said
            assert sorted(lines) == sorted([
                f"{names[leaky]}: LEAK {said} · OOM risk {live[leaky].risk_level}",
                f"{names[healthy]}: no leak · OOM risk {live[healthy].risk_level}"])
            assert console_errors(driver) == []
        finally:
            server.close()
