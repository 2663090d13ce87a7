"""Screenshots of every dashboard page, in headless Chromium, on purpose and only on request.

    python -m tools.screenshots --db sqlite:///demo.db --out docs/img

writes ``<page>.png`` (1400 px wide; ``--widths 1280,1600`` writes ``<page>-<width>.png`` for
each) for the Overview, the timeline and Leaks of the riskiest device, OOM risk, Alerts, the
post-mortems, the newest post-mortem and Capacity. The README's picture (``docs/img/demo.png``)
is the Overview of a ``vramscope demo`` database. The browser tests take the same pictures into
a temporary folder: a test run never rewrites files of the checkout.

Needs ``selenium`` (a test dependency) and Debian's ``chromium`` and ``chromedriver``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 30
MAX_HEIGHT = 4000


def chromium_available() -> bool:
    return Path(CHROMEDRIVER).exists() and shutil.which("chromium") is not None


def start_driver(width: int = 1400) -> Any:
    """Headless Chromium with a throwaway profile; ``driver.profile_dir`` to remove after."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--no-first-run", "--hide-scrollbars",
                f"--window-size={width},1000"):
        options.add_argument(arg)
    profile = tempfile.mkdtemp(prefix="vramscope-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.profile_dir = profile  # type: ignore[attr-defined]  # ours: removed at quit
    return driver


def stop_driver(driver: Any) -> None:
    driver.quit()
    shutil.rmtree(driver.profile_dir, ignore_errors=True)


def wait_ready(driver: Any, what: str = "the page") -> None:
    """Every plot drawn and every table (or its "nothing here") filled."""
    from selenium.webdriver.support.ui import WebDriverWait

    script = ("const plots = [...document.querySelectorAll('.plot')].filter(p => !p.hidden);"
              "const tables = [...document.querySelectorAll('main [id$=\"-table\"]')];"
              "return document.readyState === 'complete'"
              " && plots.every(p => p._fullLayout && p.data)"
              " && tables.every(t => t.querySelector('table, .empty'));")
    WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(
        lambda d: d.execute_script(script), message=f"timed out waiting for {what}")


def screenshot(driver: Any, path: Path, width: int) -> Path:
    """The whole page at ``width`` CSS pixels (as tall as its content, at most 4000)."""
    driver.set_window_size(width, 1000)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, min(height + 140, MAX_HEIGHT))
    relayout(driver)
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
    driver.set_window_size(width, 1000)
    return path


def relayout(driver: Any) -> None:
    """Every plot re-laid out at the window's new size, before the picture is taken."""
    driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "const plots = [...document.querySelectorAll('.plot')].filter(p => p._fullLayout);"
        "Promise.all(plots.map(p => Plotly.Plots.resize(p)))"
        ".then(() => requestAnimationFrame(() => done(true)), () => done(false));"
        "if (!plots.length) done(true);")


def page_paths(base_url: str) -> list[tuple[str, str]]:
    """``(name, path)`` of every page, the device pages on the riskiest device."""
    devices = _get(base_url, "/api/v1/devices")["devices"]
    pms = _get(base_url, "/api/v1/postmortems")["postmortems"]
    device = ""
    if devices:
        leaking = [d for d in devices
                   if any(r["rule"] == "memory_leak" for r in d["verdict"]["reasons"])]
        d = (leaking or devices)[0]
        device = f"?device={d['device']}&host={d['host']}"
    pages = [("overview", "/"), ("timeline", f"/timeline{device}"),
             ("leaks", f"/leaks{device}"), ("risk", f"/risk{device}"), ("alerts", "/alerts"),
             ("postmortems", "/postmortems")]
    if pms:
        pages.append(("postmortem", f"/postmortems/{pms[-1]['id']}"))
    return pages + [("capacity", "/capacity")]


def capture(driver: Any, base_url: str, out: Path, widths: Sequence[int],
            pages: Iterable[tuple[str, str]] | None = None) -> list[Path]:
    """Every page at every width into ``out``; the file names carry the width when there is
    more than one."""
    written = []
    for name, path in pages or page_paths(base_url):
        driver.get(base_url + path)
        wait_ready(driver, name)
        for width in widths:
            suffix = f"-{width}" if len(widths) > 1 else ""
            written.append(screenshot(driver, out / f"{name}{suffix}.png", width))
    return written


@contextmanager
def served_in_browser(db_url: str) -> Iterator[tuple[Any, str]]:
    """The dashboard of the database at ``db_url``, served on a free loopback port, and a
    browser to open it: ``(driver, base_url)``, both stopped on the way out."""
    from vramscope.agent.config import parse_config
    from vramscope.dashboard.app import create_app
    from waitress.server import create_server

    app = create_app(parse_config({"database": {"url": db_url}}, None, {}))
    server = create_server(app, host="127.0.0.1", port=0, threads=4)
    threading.Thread(target=server.run, name="screenshots-server", daemon=True).start()
    try:
        driver = start_driver()
        try:
            yield driver, f"http://127.0.0.1:{server.effective_port}"
        finally:
            stop_driver(driver)
    finally:
        server.close()


def _get(base_url: str, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(base_url + path, timeout=30) as r:
        doc: dict[str, Any] = json.load(r)
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.screenshots",
                                description="Screenshots of every dashboard page.")
    p.add_argument("--db", required=True, metavar="URL", help="database to show (must exist)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the PNG files")
    p.add_argument("--widths", default="1400", help="comma-separated widths (default 1400)")
    args = p.parse_args(argv)
    from vramscope.agent.cli.common import require_existing_database

    if not chromium_available():
        p.error("needs Debian's chromium and chromedriver (apt-get install chromium "
                "chromium-driver) and selenium")
    require_existing_database(args.db, "dashboard")
    widths = [int(w) for w in args.widths.split(",")]
    with served_in_browser(args.db) as (driver, base_url):
        for path in capture(driver, base_url, Path(args.out), widths):
            print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
