"""Every dashboard page in headless Chromium (Debian's package), served by waitress on loopback.

Each page loads from the seeded database with no console error (CSP violations included), its
plots hold the traces and points the data implies, zooming fetches a new range from the server,
and a process named ``<img src=x onerror=alert(1)>`` is shown as text. On a ``vramscope demo``
database the Overview's verdicts equal the active alerts and the analysis, phases show at 1 h
and 6 h, and no page overflows at 1280 px; hours-old data shows a stale banner and no "live".

Screenshots of every page at 1280 and 1600 px go to ``$VRAMSCOPE_SCREENSHOT_DIR`` (default
``$TMPDIR/vramscope-screenshots``), never into the checkout: the README's pictures are updated
on purpose with ``python -m tools.screenshots --db URL --out docs/img``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support import dashboard_fixtures as F
from tests.support.tools import tool_missing
from tools import screenshots as shots

pytestmark = pytest.mark.browser

SHOT_DIR = Path(os.environ.get("VRAMSCOPE_SCREENSHOT_DIR")
                or Path(tempfile.gettempdir()) / "vramscope-screenshots")
REPO = Path(__file__).resolve().parents[3]
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
    if not shots.chromium_available():
        tool_missing(f"chromium and {shots.CHROMEDRIVER}",
                     "apt-get install chromium chromium-driver")
    d = shots.start_driver(1400)
    yield d
    shots.stop_driver(d)


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


def screenshot(driver, name: str, width: int = 1400) -> None:
    """Into SHOT_DIR, outside the checkout (a test run must not modify tracked files)."""
    shots.screenshot(driver, SHOT_DIR / f"{name}.png", width)


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
                     "largest free block", "idle floor (the leak detector's)",
                     "inactive split ratio", "external fragmentation",
                     "KV blocks used", "KV blocks cached", "KV blocks total",
                     "tokens per used block", "request start", "request end",
                     "alloc retries", "alert fired", "OOM"]
    points = dict(got)
    start = LAST_T - 3600
    # 1,801 samples (one per 2 s, both ends in) in the 2,000 buckets asked: 1,800 of 2 s on
    # whole seconds (downsample.second_grid), the sample at the window's end in the last one
    assert in_window(start, LAST_T) == 1801
    assert points["allocated"] == points["limit"] == 1800
    assert points["largest free block"] == 60  # one snapshot a minute
    # the floor the engine's leak detector judged on, as the leading process's stored rows
    # carry it (the same the Leaks page draws)
    from vramscope.agent.store import verdicts as stored

    judged = stored.judged_floor(served[1].store, 0, None, 4141, start, LAST_T)
    assert len(judged) >= 55 and points["idle floor (the leak detector's)"] == len(judged)
    requests = sum(1 for k in range(F.DURATION_S // F.REQUEST_EVERY_S)
                   if start <= F.T0 + k * F.REQUEST_EVERY_S <= LAST_T)
    assert points["request start"] == requests
    assert (points["OOM"], points["alloc retries"], points["alert fired"]) == (1, 2, 2)
    assert points["prefill"] == 5 * requests  # 4 corners and a gap per band
    assert console_errors(driver) == []
    screenshot(driver, "timeline")


def test_the_leak_is_visible_the_memory_axis_spans_the_data(driver, served):
    """Device 0 holds 14..26 GiB under an 80 GiB limit: the axis fits the data, and the
    "0 to the limit" button shows the limit on demand."""
    open_page(driver, served, "/timeline?device=0", ("timeline-plot",))
    y_range = "return document.getElementById('timeline-plot')._fullLayout.yaxis.range;"
    low, high = driver.execute_script(y_range)
    lo_data, hi_data = driver.execute_script(
        "const d = document.getElementById('timeline-plot').data;"
        "const ys = d.filter(t => ['allocated', 'reserved', 'device used'].includes(t.name))"
        "  .flatMap(t => t.y);"
        "return [Math.min(...ys), Math.max(...ys)];")
    limit = F.LIMIT_BYTES / F.GIB
    assert 0 < low < lo_data and hi_data < high < limit * 0.5
    note = driver.execute_script(
        "return document.getElementById('timeline-plot')._fullLayout.annotations[0].text;")
    assert note.startswith("idle floor +")  # 2 GiB/h over the hour
    buttons = driver.find_elements("css selector", "#timeline-plot .updatemenu-button")
    assert [b.text for b in buttons] == ["Fit the data", "0 to the limit"]
    buttons[1].click()
    wait_for(driver, f"const r = document.getElementById('timeline-plot')._fullLayout.yaxis"
                     f".range; return r[0] === 0 && r[1] > {limit};", "the limit in view")
    assert console_errors(driver) == []


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
    # which process leaks, named as text (the name is hostile markup)
    cells = driver.execute_script(
        "return [...document.querySelectorAll('#leak-processes-table td')]"
        ".map((td) => td.textContent);")
    assert cells[:3] == [f"{F.XSS_NAME} (pid 4141)", "leak", "2.00 GiB/h"]
    assert console_errors(driver) == []
    screenshot(driver, "leaks")


def test_risk(driver, served):
    got = open_page(driver, served, "/risk?device=0", ("risk-plot",), "warnings-table")
    points = dict(got["risk-plot"])
    start, width = LAST_T - 6 * 3600, 6 * 3600 / 2000  # default window: 6 h in 2000 buckets
    buckets = {int((F.T0 + i * F.STEP_S - start) // width) for i in range(F.STEPS)}
    assert points["headroom"] == len(buckets) == 667
    # the alert engine's stored verdicts forecast the OOM from the leak's rate (a 2 GiB/h leak
    # under 80 GiB: the growth model's time to OOM, hours away, risk ok); the page draws the
    # stored forecast and none of its own
    assert set(points) == {"headroom", "warning fired", "critical fired", "time to OOM",
                           "forecast soonest", "forecast latest"}
    cells = driver.execute_script(
        "return [...document.querySelectorAll('#risk-processes-table td')]"
        ".map((td) => td.textContent);")
    assert cells[:4] == [f"{F.XSS_NAME} (pid 4141)", "ok", "–", cells[3]]
    assert cells[4] != "not rising" and cells[4].endswith(" h")
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
    frames = driver.execute_script("return [...document.querySelectorAll('#holders-table pre')]"
                                   ".map(p => p.textContent);")
    assert frames[2].startswith("(no stack: the server ran with hooks.history")  # how to get one
    facts = driver.execute_script("return document.getElementById('pm-facts').textContent;")
    assert "80.00 GiB as torch saw it" in facts
    assert console_errors(driver) == []
    screenshot(driver, "postmortem")


def test_capacity(driver, served):
    got = open_page(driver, served, "/capacity", ("capacity-plot",), "peaks-table")
    # two devices and the estimate's own column
    assert got["capacity-plot"] == [("peak allocated", 3), ("peak reserved", 3),
                                    ("peak device used", 3), ("limit", 3),
                                    ("usable after margin", 3), ("estimate", 3)]
    facts = driver.execute_script("return document.getElementById('estimate-facts').textContent;")
    assert "8.03 B (counted from the shape, gated MLP)" in facts
    assert console_errors(driver) == []
    screenshot(driver, "capacity")


# --- a demo database: one verdict everywhere, phases at every span, nothing overflows ----------
@pytest.fixture(scope="module")
def demo_served(tmp_path_factory):
    """``vramscope demo`` for 20 s (healthy, leaking and fragmenting servers), then its database
    served by the dashboard alone, on the real clock."""
    from vramscope.agent.config import parse_config
    from vramscope.dashboard.app import create_app

    folder = tmp_path_factory.mktemp("demo")
    url = f"sqlite:///{folder}/demo.db"
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CONFIG_HOME": str(folder),
           "XDG_RUNTIME_DIR": str(folder), "XDG_DATA_HOME": str(folder)}
    proc = subprocess.run([sys.executable, "-m", "vramscope", "demo", "--duration", "20",
                           "--no-browser", "--db", url, "--port", "0"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    app = create_app(parse_config({"database": {"url": url}}, None, {}))
    server = F.ServedApp(app)
    yield server, url
    server.close()
    app.extensions["vramscope"].store.close()


def _get(server, path: str):
    import json
    import urllib.request

    with urllib.request.urlopen(server.url + path, timeout=60) as r:
        return json.load(r)


RANK = {"ok": 0, "info": 0, "warning": 1, "critical": 2}


def _worst(severities) -> str:
    return ["ok", "warning", "critical"][max((RANK[s] for s in severities), default=0)]


def test_overview_verdicts_equal_the_active_alerts_and_the_analysis(driver, demo_served):
    server, _ = demo_served
    open_page(driver, (server, None), "/", ("overview-plot",), "devices-table")
    shown = driver.execute_script(
        "return [...document.querySelectorAll('#devices-table tbody tr')].map(r => ["
        "  r.cells[0].querySelector('strong').textContent,"
        "  r.cells[1].querySelector('.badge').textContent,"
        "  r.cells[1].querySelector('.reasons').textContent]);")
    active = _get(server, "/api/v1/alerts?active=true")["alerts"]
    assert len(shown) == 3
    for label, level, reasons in shown:
        host, device = label.split(" · GPU ")
        device = int(device)
        mine = [a for a in active if (a["host"], a["device"]) == (host, device)]
        assert level == _worst(a["severity"] for a in mine), label
        assert reasons == (", ".join(f"{a['rule']} ({a['severity']})" for a in sorted(
            mine, key=lambda a: (-RANK[a["severity"]], a["fired_ts_s"]))) or "no active alert")
        doc = _get(server, f"/api/v1/analysis?device={device}&host={host}&span=86400")
        still_open = [a["severity"] for a in doc["alerts"] if a["resolved_ts"] is None]
        assert level == _worst(still_open), (label, doc["alerts"])
    card = driver.execute_script(
        "return document.querySelector('#summary-cards .card .value').textContent;")
    assert card == _worst(level for _, level, _ in shown)
    assert {level for _, level, _ in shown} != {"ok"}  # the leaking device has its alert
    assert console_errors(driver) == []


@pytest.mark.parametrize("span", [3600, 21600])
def test_phases_are_shown_at_an_hour_and_six_hours(driver, demo_served, span):
    """The demo records phases on samples only (no phase events): beyond 15 min the timeline
    shows each phase's share per bucket instead of nothing."""
    server, _ = demo_served
    got = open_page(driver, (server, None), f"/timeline?device=1&span={span}",
                    ("timeline-plot",))["timeline-plot"]
    shares = dict(got)
    assert {"prefill share", "decode share"} <= set(shares), got
    assert shares["prefill share"] > 10
    meta = driver.execute_script("return document.getElementById('timeline-meta').textContent;")
    assert "phases from samples" in meta
    assert console_errors(driver) == []


def _overflowing(driver) -> list[str]:
    """Elements wider than their box: the page itself, a panel, a card, a table cell's link."""
    return driver.execute_script(
        "const out = [];"
        "const doc = document.documentElement;"
        "if (doc.scrollWidth > doc.clientWidth + 1) out.push('page ' + doc.scrollWidth);"
        "for (const e of document.querySelectorAll('.panel, .card, header.top, .heading')) {"
        "  if (e.scrollWidth > e.clientWidth + 1)"
        "    out.push(e.className + '#' + e.id + ' ' + e.scrollWidth + '>' + e.clientWidth);"
        "}"
        "return out;")


def test_no_element_overflows_at_1280_px(driver, demo_served):
    server, _ = demo_served
    driver.set_window_size(1280, 1000)
    try:
        for name, path in shots.page_paths(server.url):
            driver.get(server.url + path)
            shots.wait_ready(driver, name)
            assert _overflowing(driver) == [], name
    finally:
        driver.set_window_size(1400, 1000)


def test_screenshots_of_every_page_at_1280_and_1600(driver, demo_served):
    server, _ = demo_served
    written = shots.capture(driver, server.url, SHOT_DIR / "demo", (1280, 1600))
    names = sorted(p.name for p in written)
    assert len(names) == 16 and "overview-1280.png" in names and "capacity-1600.png" in names
    assert all(p.stat().st_size > 10_000 for p in written)
    assert not any(REPO in p.parents for p in written)  # never into the checkout
    assert console_errors(driver) == []


def test_hours_old_data_shows_a_stale_banner_and_no_live(driver, served):
    from vramscope.agent.clock import FakeClock
    from vramscope.dashboard.app import create_app

    _, seeded = served
    old = F.ServedApp(create_app(seeded.config(), seeded.store,
                                 clock=FakeClock(F.NOW_S + 8.4 * 3600)))
    try:
        open_page(driver, (old, seeded), "/", ("overview-plot",), "devices-table")
        wait_for(driver, "return !document.getElementById('stale-banner').hidden;",
                 "the stale banner")
        banner = driver.find_element("id", "stale-banner").text
        assert banner.startswith("Stale data: the newest sample is 8.4 h old")
        live = driver.find_element("id", "live").text
        assert "live" not in live and live.startswith("○ stale")
        risk = driver.execute_script(
            "return document.querySelector('#summary-cards .card .sub').textContent;")
        assert "as of " in risk
        screenshot(driver, "overview-stale")
        open_page(driver, (old, seeded), "/timeline?device=0", ("timeline-plot",))
        wait_for(driver, "return !document.getElementById('timeline-note').hidden;",
                 "the old-window note")
        assert driver.find_element("id", "timeline-note").text.startswith(
            "This window ended 8.4 h ago")
        assert console_errors(driver) == []
    finally:
        old.close()


def test_an_empty_database_draws_no_blank_axis_and_claims_nothing(driver, tmp_path):
    from vramscope.agent.store import Store
    from vramscope.dashboard.app import create_app

    store = Store.open(f"sqlite:///{tmp_path / 'empty.db'}", host_name="h")
    empty = F.ServedApp(create_app(None, store))
    try:
        driver.get(empty.url + "/")
        wait_for(driver, "return document.querySelector('#devices-table .empty') !== null;",
                 "the empty devices table")
        assert driver.execute_script("return document.getElementById('overview-plot').hidden;")
        assert driver.find_element("css selector", "#devices-table .empty").text == \
            "No devices have reported yet."
        wait_for(driver, "return document.getElementById('live').textContent !== '○ checking';",
                 "the freshness answer")
        assert driver.find_element("id", "live").text == "○ no data yet"
        assert console_errors(driver) == []
    finally:
        empty.close()
        store.close()
