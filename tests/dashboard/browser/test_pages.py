"""Every dashboard page in headless Chromium (Debian's package), served by waitress on loopback.

Each page loads from the seeded database with no console error (CSP violations included), its
plots hold the traces and points the data implies, zooming fetches a new range from the server,
and a process named ``<img src=x onerror=alert(1)>`` is shown as text. A screenshot of each page
is kept under docs/img/.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.support import dashboard_fixtures as F

pytestmark = pytest.mark.browser

CHROMEDRIVER = "/usr/bin/chromedriver"
IMG_DIR = Path(__file__).resolve().parents[3] / "docs" / "img"
WAIT_S = 30


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from vramscope.dashboard.app import create_app

    seeded = F.seed(tmp_path_factory.mktemp("browser") / "seed.db")
    server = F.ServedApp(create_app(seeded.config(), seeded.store, clock=seeded.clock))
    yield server, seeded
    server.close()


@pytest.fixture(scope="module")
def driver():
    if not (os.path.exists(CHROMEDRIVER) and shutil.which("chromium")):
        pytest.skip("Debian chromium and chromedriver are not installed")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--no-first-run", "--window-size=1400,1000"):
        options.add_argument(arg)
    profile = tempfile.mkdtemp(prefix="vramscope-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield d
    d.quit()
    shutil.rmtree(profile, ignore_errors=True)


def wait_for(driver, script: str, what: str):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(
        lambda d: d.execute_script(script), message=f"timed out waiting for {what}")


def open_page(driver, served, path: str, plots: tuple[str, ...], ready_table: str | None = None):
    server, _ = served
    driver.get(server.url + path)
    for plot in plots:
        wait_for(driver, f"const e = document.getElementById('{plot}');"
                         f"return e && e._fullLayout && e.data && e.data.length > 0;", plot)
    if ready_table:
        wait_for(driver, f"return document.querySelector('#{ready_table} table, "
                         f"#{ready_table} .empty') !== null;", ready_table)
    return traces(driver, plots)


def traces(driver, plots: tuple[str, ...]) -> dict[str, list[tuple[str, int]]]:
    return {p: [tuple(t) for t in driver.execute_script(
        f"return document.getElementById('{p}').data.map(t => [t.name, t.x.length]);")]
        for p in plots}


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def screenshot(driver, name: str) -> None:
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(height + 140, 4000))
    IMG_DIR.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(IMG_DIR / f"{name}.png"))
    driver.set_window_size(1400, 1000)


def in_window(start: float, end: float) -> int:
    """Samples of one source of device 0 in [start, end]: one per 2 s."""
    return sum(1 for i in range(F.STEPS) if start <= F.T0 + i * F.STEP_S <= end)


LAST_T = F.T0 + (F.STEPS - 1) * F.STEP_S


def test_overview(driver, served):
    got = open_page(driver, served, "/", ("overview-plot",), "processes-table")
    assert got["overview-plot"] == [("allocated", 2), ("reserved", 2), ("device used", 2),
                                    ("limit", 2)]
    assert console_errors(driver) == []
    screenshot(driver, "overview")


def test_a_hostile_process_name_is_text_and_runs_nothing(driver, served):
    open_page(driver, served, "/", ("overview-plot",), "processes-table")
    cells = driver.execute_script(
        "return [...document.querySelectorAll('#processes-table td')].map(td => td.textContent);")
    assert F.XSS_NAME in cells
    assert "llama-<script>" in cells
    assert driver.execute_script("return document.querySelectorAll('main img').length;") == 0
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018 - raises when no alert() ran
    assert console_errors(driver) == []


def test_timeline(driver, served):
    got = open_page(driver, served, "/timeline?device=0", ("timeline-plot",))["timeline-plot"]
    names = [n for n, _ in got]
    assert names == ["prefill", "decode", "allocated", "reserved", "device used", "limit",
                     "largest free block", "inactive split ratio", "external fragmentation",
                     "KV blocks used", "KV blocks cached", "KV blocks total",
                     "tokens per used block", "request start", "request end", "OOM",
                     "alloc retries", "alert fired"]
    points = dict(got)
    start = LAST_T - 3600
    assert points["allocated"] == points["limit"] == in_window(start, LAST_T) == 1801
    assert points["largest free block"] == 60  # one snapshot a minute
    requests = sum(1 for k in range(F.DURATION_S // F.REQUEST_EVERY_S)
                   if start <= F.T0 + k * F.REQUEST_EVERY_S <= LAST_T)
    assert points["request start"] == requests
    assert (points["OOM"], points["alloc retries"], points["alert fired"]) == (1, 2, 2)
    assert points["prefill"] == 5 * requests  # 4 corners and a gap per band
    assert console_errors(driver) == []
    screenshot(driver, "timeline")


def test_zoom_fetches_the_visible_range(driver, served):
    from selenium.webdriver.common.action_chains import ActionChains

    open_page(driver, served, "/timeline?device=0", ("timeline-plot",))
    count_fetches = ("return performance.getEntriesByType('resource').filter("
                     "e => e.name.includes('/api/v1/figures/timeline')).length;")
    before = driver.execute_script(count_fetches)
    drag = driver.find_element("css selector", "#timeline-plot .nsewdrag")
    width = drag.size["width"]
    ActionChains(driver).move_to_element_with_offset(drag, -width // 2 + 10, 0) \
        .click_and_hold().move_by_offset(width // 10, 0).release().perform()
    wait_for(driver, count_fetches[:-1] + f" > {before};",
             "a new timeline fetch")
    wait_for(driver, "return location.search.includes('start=');", "the zoomed address")
    start, end = driver.execute_script(
        "const p = new URLSearchParams(location.search); return [+p.get('start'), +p.get('end')];")
    assert LAST_T - 3600 < start < end < LAST_T - 3000  # about a tenth of the hour, at the left
    wait_for(driver, "const d = document.getElementById('timeline-plot').data;"
                     "const a = d.find(t => t.name === 'allocated');"
                     f"return a && a.x.length === {in_window(start, end)};",
             "the zoomed series")
    xs = driver.execute_script("return document.getElementById('timeline-plot').data"
                               ".find(t => t.name === 'allocated').x;")
    assert start * 1000 <= min(xs) and max(xs) <= end * 1000
    assert console_errors(driver) == []
    screenshot(driver, "timeline-zoom")


def test_leaks(driver, served):
    server, _ = served
    got = open_page(driver, served, "/leaks?device=0", ("leaks-plot",), "orphans-table")
    names = [n for n, _ in got["leaks-plot"]]
    assert names == ["idle floor", "trend (Theil–Sen)"]
    assert dict(got["leaks-plot"])["idle floor"] >= 110  # one point per minute of 2 hours
    verdict = driver.execute_script(
        "return document.querySelector('#leak-cards .card .value').textContent;")
    assert verdict == "leak"
    assert console_errors(driver) == []
    screenshot(driver, "leaks")


def test_risk(driver, served):
    got = open_page(driver, served, "/risk?device=0", ("risk-plot",), "warnings-table")
    points = dict(got["risk-plot"])
    start, width = LAST_T - 6 * 3600, 6 * 3600 / 2000  # default window: 6 h in 2000 buckets
    buckets = {int((F.T0 + i * F.STEP_S - start) // width) for i in range(F.STEPS)}
    assert points["headroom"] == len(buckets) == 667
    assert {"time to OOM", "warning fired", "critical fired"} <= set(points)
    assert console_errors(driver) == []
    screenshot(driver, "risk")


def test_alerts_link_to_the_moment(driver, served):
    open_page(driver, served, "/alerts", (), "history-table")
    rows = driver.execute_script(
        "return [...document.querySelectorAll('#active-table tbody tr')].map(r => r.textContent);")
    assert len(rows) == 1 and "idle floor rising <b>2 GiB/h</b>" in rows[0]
    href = driver.execute_script(
        "return document.querySelector('#active-table tbody a').getAttribute('href');")
    assert href == (f"/timeline?device=0&host={F.HOST}&start={F.T0 + 5400 - 600:.3f}"
                    f"&end={F.T0 + 5400 + 600:.3f}")
    assert console_errors(driver) == []
    screenshot(driver, "alerts")


def test_postmortems(driver, served):
    _, seeded = served
    open_page(driver, served, "/postmortems", (), "postmortems-table")
    assert driver.execute_script(
        "return document.querySelectorAll('#postmortems-table tbody tr').length;") == 1
    assert console_errors(driver) == []
    screenshot(driver, "postmortems")
    got = open_page(driver, served, f"/postmortems/{seeded.postmortem_id}",
                    ("segments-plot", "holders-plot"), "holders-table")
    assert got == {"segments-plot": [("allocated", 12), ("largest hole", 12), ("other free", 12)],
                   "holders-plot": [("held", 3)]}
    link = driver.execute_script("return [...document.querySelectorAll('#pm-facts a')]"
                                 ".map(a => a.getAttribute('href'));")
    assert f"/api/v1/postmortems/{seeded.postmortem_id}/snapshot" in link
    assert console_errors(driver) == []
    screenshot(driver, "postmortem")


def test_capacity(driver, served):
    got = open_page(driver, served, "/capacity", ("capacity-plot",), "peaks-table")
    assert got["capacity-plot"] == [("peak allocated", 2), ("peak reserved", 2),
                                    ("peak device used", 2), ("limit", 2), ("estimate", 2)]
    assert console_errors(driver) == []
    screenshot(driver, "capacity")
