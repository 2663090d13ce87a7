"""The rough rate in the browser: the Overview's per-process lines and the Leaks page's cards
and table put "about" before a rate the engine read off an estimated floor, and only there
(the stored verdicts of ``tests/dashboard/test_rough_rate.py``), in headless Chromium."""

from __future__ import annotations

import pytest
from vramscope.agent.config import parse_config
from vramscope.agent.store import Store
from vramscope.dashboard.app import create_app

from tests.dashboard.browser.test_one_answer_pages import _table, overview_process_lines
from tests.dashboard.browser.test_pages import console_errors, driver
from tests.dashboard.test_rough_rate import T0, url
from tests.support import dashboard_fixtures as F

pytestmark = pytest.mark.browser
_ = (driver, url)  # fixtures: the shared Chromium, the store of two stored leak verdicts


def test_the_pages_say_about_before_a_rough_rate_only(url, driver):
    with Store.open(url) as store:
        server = F.ServedApp(create_app(parse_config({}, None), store))
        try:
            assert overview_process_lines(driver, server.url, 2) == [
                "unknown (pid 7): LEAK about 600.0 MiB/h · OOM risk ok",
                "unknown (pid 8): LEAK 300.0 MiB/h · OOM risk ok"]
            driver.get(f"{server.url}/leaks?device=0&start={T0}&end={T0 + 7200}")
            rows = _table(driver, "leak-processes-table")
            assert {name: row["Slope"] for name, row in rows.items()} == {
                "unknown (pid 7)": "about 600.0 MiB/h", "unknown (pid 8)": "300.0 MiB/h"}
            cards = driver.execute_script(
                "return [...document.querySelectorAll('#leak-cards .card')].map(c =>"
                " [...c.children].map(e => e.textContent));")
            slope = {c[0]: c[1:] for c in cards}["Slope"]  # the headline: the steeper leak
            assert slope == ["about 600.0 MiB/h", "rough: an estimated floor"]
            assert console_errors(driver) == []
        finally:
            server.close()
