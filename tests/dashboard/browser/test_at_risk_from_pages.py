"""A process at risk from another's growth in the browser: the Overview's per-process lines,
the device line and the OOM-risk page's Cause column print "growth (at risk from pid N's
growth)" from its stored row, and the grower's plain "growth" (the stored verdicts of
``tests/dashboard/test_at_risk_from.py``), in headless Chromium."""

from __future__ import annotations

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.config import parse_config
from vramscope.dashboard.app import create_app

from tests.dashboard.browser.test_one_answer_pages import _table, overview_process_lines
from tests.dashboard.browser.test_pages import console_errors, driver, wait_for
from tests.dashboard.test_at_risk_from import AT_RISK, END, stored_pair
from tests.support import dashboard_fixtures as F

pytestmark = pytest.mark.browser
_ = (driver,)  # fixture: the shared Chromium


def test_the_pages_print_whose_growth_a_process_is_at_risk_from(tmp_path, driver):
    driver.get("about:blank")  # the shared browser's log starts empty here
    console_errors(driver)
    with stored_pair(f"sqlite:///{tmp_path / 'pair.db'}") as store:
        app = create_app(parse_config({}, None), store, clock=FakeClock(END))
        server = F.ServedApp(app)
        try:
            # the grower's leak with its interval and time to OOM, as `status` words them
            lead = ("LEAK 210.9 GiB/h (179.3 GiB/h to 242.6 GiB/h), full in about 10 min "
                    "(9 min – 12 min) · OOM risk critical")
            assert overview_process_lines(driver, server.url, 2) == [
                f"unknown (pid 1): {lead} (growth)",
                f"unknown (pid 2): not enough data yet · OOM risk critical ({AT_RISK})"]
            driver.get(f"{server.url}/risk?device=0&start=0&end={END}")
            rows = _table(driver, "risk-processes-table")
            assert {name: row["Cause"] for name, row in rows.items()} == {
                "unknown (pid 1)": "growth", "unknown (pid 2)": AT_RISK}
            # the device line, as the page refreshes it from /api/v1/devices
            wait_for(driver, "return document.querySelector('#device-verdict a') !== null"
                             " && document.getElementById('device-verdict').textContent"
                             ".includes('all devices');", "the device line")
            line = driver.execute_script(
                "return document.getElementById('device-verdict').textContent;")
            assert f"unknown (pid 2): not enough data yet, OOM risk critical ({AT_RISK})" in \
                " ".join(line.split())
            assert console_errors(driver) == []
        finally:
            server.close()
