"""The fleet page and a fleet's Overview in headless Chromium, on 64 hosts x 8 GPUs with
scripted verdicts (tests/support/fleet_store.py): the devices in the stored verdicts' order,
filtered by a host from the select, one click to the device's page; the Overview's hosts,
at-risk first; no console error."""

from __future__ import annotations

import pytest
from vramscope.agent.clock import FakeClock

from tests.dashboard.browser.test_pages import console_errors, driver, wait_for  # noqa: F401
from tests.support import dashboard_fixtures as F
from tests.support import fleet_store as FS

pytestmark = pytest.mark.browser
ROWS = ("return [...document.querySelectorAll('#fleet-table tbody tr')]"
        ".map(r => [...r.cells].map(c => c.textContent));")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from vramscope.dashboard.app import create_app

    built = FS.build(f"sqlite:///{tmp_path_factory.mktemp('fleet') / 'fleet.db'}")
    server = F.ServedApp(create_app(None, built.store, clock=FakeClock(FS.NOW_S)))
    yield server
    server.close()
    built.store.close()


def test_filter_by_a_host_then_click_through_to_a_device(driver, served):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver.get(served.url + "/fleet")
    wait_for(driver, "return document.querySelectorAll('#fleet-table tbody tr').length === 512;",
             "the fleet's 512 devices")
    rows = driver.execute_script(ROWS)
    assert [r[0] for r in rows[:6]] == ["node-07 · GPU 6", "node-41 · GPU 5", "node-07 · GPU 2",
                                        "node-12 · GPU 0", "node-20 · GPU 3", "node-33 · GPU 4"]
    assert rows[0][1:5] == [FS.H200, "critical" + "vllm (pid 1006) (kv_cache)", "4.0 min",
                            "no leak"]
    assert rows[5][4] == "LEAK 8.0 MiB/h · vllm (pid 1004)"
    assert rows[6][5].endswith("ago (stale)") and rows[6][0] == "node-50 · GPU 0"

    Select(driver.find_element(By.ID, "fleet-host")).select_by_value("node-41")
    wait_for(driver, "return document.querySelectorAll('#fleet-table tbody tr').length === 8;",
             "node-41's 8 devices")
    rows = driver.execute_script(ROWS)
    assert [r[0] for r in rows] == ["node-41 · GPU 5"] + [
        f"node-41 · GPU {d}" for d in (0, 1, 2, 3, 4, 6, 7)]
    assert driver.current_url == served.url + "/fleet?host=node-41"
    cards = driver.execute_script(
        "return [...document.querySelectorAll('#fleet-cards .value')].map(c => c.textContent);")
    assert cards == ["1", "0", "0", "0"]

    driver.find_element(By.LINK_TEXT, "node-41 · GPU 5").click()
    wait_for(driver, "return document.body.dataset.page === 'timeline';", "the device page")
    assert driver.execute_script("return [document.body.dataset.device, "
                                 "document.body.dataset.host];") == ["5", "node-41"]
    # its verdict line, from the device's own row: the answer the fleet page showed
    wait_for(driver, "return document.getElementById('device-verdict').textContent"
             ".includes('Verdict for node-41 · GPU 5');", "the device's verdict line")
    line = driver.execute_script("return document.getElementById('device-verdict').textContent;")
    assert "vllm (pid 1005): no leak, OOM risk critical (kv_cache)" in line
    assert console_errors(driver) == []


def test_the_overview_of_a_fleet_is_its_hosts_at_risk_first(driver, served):  # noqa: F811
    driver.get(served.url + "/")
    wait_for(driver, "return document.querySelectorAll('#fleet-hosts tbody tr').length === 64;",
             "the fleet's 64 hosts")
    rows = driver.execute_script(
        "return [...document.querySelectorAll('#fleet-hosts tbody tr')]"
        ".map(r => [...r.cells].map(c => c.textContent));")
    assert [r[0] for r in rows[:7]] == ["node-07", "node-41", "node-12", "node-20", "node-33",
                                        "node-50", "node-00"]
    assert rows[0][4] == "GPU 6: critical, OOM in 4.0 minGPU 2: critical, OOM in 30.0 min"
    assert rows[6][4] == "nothing"
    assert driver.execute_script("return document.getElementById('overview-plot');") is None
    assert console_errors(driver) == []
