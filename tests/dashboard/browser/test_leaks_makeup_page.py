"""The Leaks page's make-up table in headless Chromium: rows, the diagnosis, no console error."""

from __future__ import annotations

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.records import Phase, Sample
from vramscope.agent.store import Store

from tests.agent.test_analysis_makeup import WS, after_calls, event
from tests.dashboard.browser.test_pages import console_errors, driver, wait_for  # noqa: F401
from tests.support import dashboard_fixtures as F

pytestmark = pytest.mark.browser
T0 = 1_700_000_000.0


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from vramscope.dashboard.app import create_app

    store = Store.open(f"sqlite:///{tmp_path_factory.mktemp('makeup') / 'm.db'}", host_name="h")
    store.write([Sample(T0 + t, 0, Phase.IDLE, "torch", 1, allocated_bytes=WS * (1 + t // 60))
                 for t in range(0, 600, 5)],
                [event(T0 + 60 * n + 30, after_calls(n + 1)) for n in range(10)])
    server = F.ServedApp(create_app(None, store, clock=FakeClock(T0 + 610)))
    yield server
    server.close()
    store.close()


def test_the_makeup_table_names_the_workspaces(driver, served):  # noqa: F811
    driver.get(served.url + "/leaks?device=0")
    wait_for(driver, "return document.querySelector('#makeup-table table') !== null;",
             "the make-up table")
    rows = driver.execute_script(
        "return [...document.querySelectorAll('#makeup-table tbody tr')]"
        ".map(r => [...r.cells].map(c => c.textContent));")
    assert rows == [
        ["live blocks", "32.0 MiB", "9", "288.0 MiB", "9 (9)", "–",
         "9 new blocks of 32 MiB, one per new stream", "(no allocation history)"],
        ["segments", "32.0 MiB", "9", "288.0 MiB", "9 (9)", "–",
         "9 new segments of 32 MiB, one per new stream", "(no allocation history)"],
        ["segments", "64.0 MiB", "1", "64.0 MiB", "1 (1)", "–",
         "1 new segment of 64 MiB on a new stream", "(no allocation history)"]]
    summary = driver.execute_script(
        "return document.getElementById('makeup-summary').textContent;")
    assert "Diagnosis: cuBLAS workspace cached per stream" in summary
    assert "torch._C._cuda_clearCublasWorkspaces()" in summary
    assert console_errors(driver) == []
