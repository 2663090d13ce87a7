"""The Overview's health table shows what the agent refused by reason under the total
(issue 45, item 1; the stored counts: tests/dashboard/test_rejected_by_reason.py), in headless
Chromium."""

from __future__ import annotations

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.store import Store

from tests.dashboard.browser.test_pages import console_errors, driver, wait_for  # noqa: F401
from tests.support import dashboard_fixtures as F

pytestmark = pytest.mark.browser
NOW_S = 1_800_000_000.0


@pytest.fixture
def served(tmp_path):
    from vramscope.agent.config import parse_config
    from vramscope.dashboard.app import create_app

    store = Store.open(f"sqlite:///{tmp_path / 'r.db'}", host_name="h")
    store.write_agent_stats(NOW_S - 1, clients=1, rows_per_s=1.0, queue_depth=0,
                            dropped_total=0, rejected_total=48, db_size_bytes=None,
                            rejected_by_reason={"budget_rows": 7, "chatter": 1, "names": 40})
    server = F.ServedApp(create_app(parse_config({}, None, {}), store, clock=FakeClock(NOW_S)))
    yield server
    server.close()
    store.close()


def test_the_health_table_shows_the_reasons_under_the_total(driver, served):  # noqa: F811
    driver.get(served.url + "/")
    wait_for(driver, "return !!document.querySelector('#health-table table');", "the table")
    heads, cells = driver.execute_script(
        "const t = document.querySelector('#health-table table');"
        "return [[...t.querySelectorAll('th')].map(c => c.textContent),"
        "        [...t.querySelectorAll('tbody td')].map(c => c.textContent)];")
    # the total, then each reason, the largest first
    assert cells[heads.index("Rejected")] == "48names 40, budget_rows 7, chatter 1"
    assert console_errors(driver) == []
