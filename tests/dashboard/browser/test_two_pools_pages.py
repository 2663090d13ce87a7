"""Two servers on one GPU with KV pools of 63 and 16,384 blocks, in headless Chromium (issue
47 item 6), on the scripted database of ``tests/support/two_pools.py``: the timeline draws
each server's pool as its own series, named by process and pid, against its own size (the
small pool's full cycle reads 0 % to 100 %, not a flat line under the big one); the Overview
lists both pools on the device row and each server's pool on its process row.
"""

from __future__ import annotations

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.dashboard.app import create_app

from tests.dashboard.browser.test_pages import console_errors, driver, screenshot, wait_for
from tests.support import dashboard_fixtures as F
from tests.support import two_pools as P

pytestmark = pytest.mark.browser
_ = driver  # the shared Chromium fixture

SMALL = "vllm engine core (port 8000) (pid 4100) · KV used of its 63 blocks"
BIG = "vllm engine core (port 8001) (pid 4200) · KV used of its 16,384 blocks"


@pytest.fixture
def server(tmp_path):
    store = P.two_pools_store(f"sqlite:///{tmp_path / 'two-pools.db'}")
    served = F.ServedApp(create_app(P.config(), store, clock=FakeClock(P.NOW)))
    yield served
    served.close()
    store.close()


def test_the_timeline_draws_each_pool_apart_against_its_own_size(driver, server):
    start, end = P.WINDOW
    driver.get(f"{server.url}/timeline?device=0&start={start}&end={end}")
    wait_for(driver, "const e = document.getElementById('timeline-plot');"
                     "return e && e._fullLayout && e.data && e.data.length > 0;", "the timeline")
    drawn = driver.execute_script(
        "const e = document.getElementById('timeline-plot');"
        "return e.data.filter(t => t.yaxis === 'y3').map(t => [t.name, t.y, t.customdata,"
        " t.legendgroup]);")
    by_name = {name: (ys, blocks, group) for name, ys, blocks, group in drawn}
    assert sorted(by_name) == sorted([SMALL, BIG])  # two series, no third over both
    small_ys, small_blocks, small_group = by_name[SMALL]
    big_ys, _, big_group = by_name[BIG]
    assert (small_group, big_group) == ("process 4100", "process 4200")
    # the page's own window (its buckets as the server chose them): every value each pool
    # took, exactly, and the small pool's cycle from empty to full
    assert sorted(set(small_ys) - {None}) == [0.0, 1 / 3, 2 / 3, 1.0]
    assert sorted(set(big_ys) - {None}) == [0.0, 0.03125, 0.0625, 0.09375]
    assert [63, 63] in small_blocks and [21, 63] in small_blocks
    # readable: the axis is shares, 0 to 100 %, so the small pool spans it
    layout = driver.execute_script(
        "const l = document.getElementById('timeline-plot')._fullLayout;"
        "return [l.yaxis3.range, l.yaxis3.tickformat,"
        " [...document.querySelectorAll('#timeline-plot .legendtext')]"
        ".map(t => t.textContent)];")
    assert layout[0] == [0, 1.05] and layout[1] == ".0%"
    assert SMALL in layout[2] and BIG in layout[2]  # both named in the legend
    screenshot(driver, "two-pools-timeline")
    assert console_errors(driver) == []


def test_the_overview_lists_both_pools(driver, server):
    driver.get(server.url + "/")
    wait_for(driver, "return document.querySelector('#processes-table table') !== null && "
                     "document.querySelector('#devices-table table') !== null;",
             "the devices and processes tables")

    def rows(table: str) -> list[dict[str, str]]:
        return driver.execute_script(
            f"const heads = [...document.querySelectorAll('#{table} thead th')]"
            ".map(h => h.textContent);"
            f"return [...document.querySelectorAll('#{table} tbody tr')].map(r =>"
            " Object.fromEntries([...r.cells].map((c, i) => [heads[i], c.textContent])));")

    (device,) = rows("devices-table")
    # the full small pool first: never the sum's 9.7 % that would hide it
    assert device["KV · req/min"] == ("100.0 % of 63 (pid 4100) · 9.4 % of 16,384 (pid 4200)"
                                      " · 0")
    procs = {r["PID"]: r["KV used"] for r in rows("processes-table")}
    assert procs == {"4100": "100.0 % (63/63)", "4200": "9.4 % (1536/16384)"}
    screenshot(driver, "two-pools-overview")
    assert console_errors(driver) == []
