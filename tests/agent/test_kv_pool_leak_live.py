"""Issue 44, "a KV-pool leak, tried as a new user would": two CPU servers with
``vramscope.install()``, phases and a ``KVBlockPool`` beside a real ``vramscope agent
--no-nvml``, one forgetting to free every other request (``tests/support/kv_leak_scenario.py``).

No allocator counters (CPU), so no idle floor: the leak is the pool check's. Every surface
shows the same figures, and they are the scripted leak's: the latest count of orphaned blocks
(160, never a sum of the 80 checks), their rate in blocks (8 a second) and bytes per second
with its interval, the time until the pool's 864 free blocks run out, and a floor drawn on the
real time axis. Was: "VERDICT leak" beside "SLOPE 0 B/h", "ORPHANED KV BLOCKS 1949" and an
empty chart on a year-2000 axis.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from vramscope.agent.analysis.growth import per_hour
from vramscope.agent.analysis.kv_leak import kv_leak_from_json, kv_words
from vramscope.agent.config import parse_config
from vramscope.agent.store import Store
from vramscope.dashboard.app import create_app

from tests.dashboard.browser.test_pages import driver  # noqa: F401 - a fixture
from tests.support import kv_leak_scenario as S
from tools.agent_process import REPO_ROOT

GIB = 2**30


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The scenario, recorded once; the surfaces are read while the agent still runs
    (``status``) and after it stopped (everything else reads the same stored verdicts)."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="vs-kv-", dir="/tmp")  # a short socket path
    with S.recorded(folder) as rec:
        status = _vramscope("status", "--socket", rec.socket_path, "--db", rec.db_url)
    yield rec, status
    shutil.rmtree(folder, ignore_errors=True)


def _vramscope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vramscope", *args], capture_output=True,
                          text=True, timeout=120, cwd=str(REPO_ROOT))


def _kv(rec: S.Recorded) -> dict:
    leak = S.stored_leak(rec.db_url, rec.leaky_pid)
    assert leak is not None
    return leak


def test_the_stored_verdict_is_the_scripted_leak(run):
    rec, _ = run
    leak = _kv(rec)
    kv = leak["kv_pool"]
    assert leak["state"] == "leak"
    assert (kv["orphaned_blocks"], leak["orphaned_blocks"], kv["reports"]) == (
        S.ORPHANED, S.ORPHANED, S.REPORTS)  # the latest check's count, not a sum of checks
    assert kv["bytes_per_block"] == S.BYTES_PER_BLOCK == 16384
    assert kv["free_blocks"] == S.FREE_BLOCKS
    # the rate: its interval holds the scripted 8 blocks a second, and is narrow (80 checks)
    assert kv["blocks_per_s_low"] <= S.BLOCKS_PER_S <= kv["blocks_per_s_high"]
    assert kv["blocks_per_s"] == pytest.approx(S.BLOCKS_PER_S, rel=0.03)
    assert kv["blocks_per_s_high"] - kv["blocks_per_s_low"] < 0.05 * S.BLOCKS_PER_S
    # ...in bytes too: the verdict's slope and interval are the pool's
    assert leak["slope_bytes_per_s"] == kv["blocks_per_s"] * S.BYTES_PER_BLOCK
    assert (leak["rate_low_bytes_per_s"], leak["rate_high_bytes_per_s"]) == (
        kv["blocks_per_s_low"] * S.BYTES_PER_BLOCK, kv["blocks_per_s_high"] * S.BYTES_PER_BLOCK)
    assert leak["time_to_oom_s"] is None  # blocks lost in a pool take no memory from the device
    # the pool runs out of its free blocks at that rate
    assert kv["exhaustion_s"] == pytest.approx(S.FREE_BLOCKS / kv["blocks_per_s"])
    assert kv["exhaustion_low_s"] == pytest.approx(S.FREE_BLOCKS / kv["blocks_per_s_high"])
    assert kv["exhaustion_high_s"] == pytest.approx(S.FREE_BLOCKS / kv["blocks_per_s_low"])
    assert kv["exhaustion_s"] == pytest.approx(S.FREE_BLOCKS / S.BLOCKS_PER_S, rel=0.03)
    # the floor: the bytes the orphaned blocks hold, at the checks' real times
    floor = kv["floor"]
    assert [b for _, b in floor] == sorted(b for _, b in floor)
    assert floor[0][1] == S.BYTES_PER_BLOCK * 4 and floor[-1][1] == S.ORPHANED * S.BYTES_PER_BLOCK
    assert rec.started_s < floor[0][0] < floor[-1][0] <= rec.leaky_done_s
    assert leak["first_detected_ts"] == floor[0][0]  # named at the first check that failed
    healthy = S.stored_leak(rec.db_url, rec.healthy_pid)
    assert healthy is not None and healthy["state"] != "leak"
    assert (healthy["orphaned_blocks"], healthy["kv_pool"]) == (0, None)


def test_status_and_analyze_say_the_stored_figures(run):
    rec, status = run
    leak = _kv(rec)
    words = kv_words(kv_leak_from_json(leak["kv_pool"]))
    kv = leak["kv_pool"]
    # the words carry the scripted figures themselves
    assert words.startswith(f"{S.ORPHANED} orphaned KV blocks (latest check); rising "
                            f"{kv['blocks_per_s']:.3g} blocks/s ({kv['blocks_per_s_low']:.3g} "
                            f"blocks/s to {kv['blocks_per_s_high']:.3g} blocks/s, 90 %) = "
                            f"{per_hour(leak['slope_bytes_per_s'])} (")
    assert f"; the pool's {S.FREE_BLOCKS} free blocks last about " in words
    assert f"pid {rec.leaky_pid} (python kv_server.py): LEAK KV pool: {words}; OOM risk" \
        in status.stdout, status.stdout
    assert "0.0 MiB/h" not in status.stdout and "0 B/h" not in status.stdout
    # up to the moment the leaky server was done (it exits right after: then `process_exit`
    # ends it, and the device's answer is the processes' left, as a minute of silence made it);
    # the answer then is its row of that moment, a check or two before its last (160 blocks)
    until = ("--until", str(rec.leaky_done_s))
    text = _vramscope("analyze", "--db", rec.db_url, *until)
    assert text.returncode == 0, text.stderr
    doc = json.loads(_vramscope("analyze", "--db", rec.db_url, "--json", *until).stdout)
    d = doc["devices"]["0"]["leak"]
    then = d["kv_pool"]
    assert (d["pid"], d["state"], d["orphaned_blocks"]) == (
        rec.leaky_pid, "leak", then["orphaned_blocks"])
    assert 0 < then["orphaned_blocks"] <= S.ORPHANED and then["orphaned_blocks"] % 8 == 0
    said = kv_words(kv_leak_from_json(then))
    assert "  leak: DETECTED at " in text.stdout and f", KV pool: {said}\n" in text.stdout
    assert f"(pid {rec.leaky_pid}): LEAK KV pool: {said} since " in text.stdout
    assert d["slope_bytes_per_s"] == then["blocks_per_s"] * S.BYTES_PER_BLOCK
    assert (d["rate_low_bytes_per_s"], d["rate_high_bytes_per_s"]) == (
        then["blocks_per_s_low"] * S.BYTES_PER_BLOCK, then["blocks_per_s_high"] * S.BYTES_PER_BLOCK)


def test_the_leaks_page_and_metrics_show_the_stored_figures(run):
    rec, _ = run
    leak = _kv(rec)
    kv = leak["kv_pool"]
    # a window ending while the leaky server ran (it exits right after leaky_done_s)
    start, end = rec.started_s - 60, rec.leaky_done_s
    with Store.open(rec.db_url) as store:
        client = create_app(parse_config({}, None), store).test_client()
        doc = client.get(f"/api/v1/figures/leaks?device=0&start={start}&end={end}").get_json()
        page = client.get("/leaks?device=0")
        metrics = client.get("/metrics").get_data(as_text=True)
    r = doc["result"]
    then = r["kv_pool"]  # its answer as the window ends, a check or two before its last
    assert (r["pid"], r["state"], r["orphaned_blocks"]) == (
        rec.leaky_pid, "leak", then["orphaned_blocks"])
    assert 0 < then["orphaned_blocks"] <= S.ORPHANED and then["bytes_per_block"] == 16384
    assert r["slope_bytes_per_h"] == then["blocks_per_s"] * S.BYTES_PER_BLOCK * 3600 > 0
    assert then["floor"] == kv["floor"][:len(then["floor"])]  # the same checks, fewer
    floor, line = doc["figure"]["data"]
    assert floor["name"] == "orphaned KV blocks" and line["name"] == "at the pool's rate"
    # drawn on the checks' own times (ms), not on an empty axis of 1 January 2000
    assert floor["x"] == [t * 1000 for t, _ in then["floor"]]
    assert floor["y"] == [b / GIB for _, b in then["floor"]]
    assert line["x"] == [then["floor"][0][0] * 1000, then["floor"][-1][0] * 1000]
    assert line["y"][1] == then["orphaned_blocks"] * S.BYTES_PER_BLOCK / GIB
    assert page.status_code == 200
    pid = f'pid="{rec.leaky_pid}"'
    series = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
              if pid in line and line.startswith(("vramscope_process_kv_orphaned",
                                                  "vramscope_process_leak_slope"))}
    # /metrics is now: the leaky server exited (`process_exit`), so none of its series is left
    assert series == {}


def test_the_memory_leak_alert_names_the_pid_with_the_rate(run):
    rec, _ = run
    with Store.open(rec.db_url) as store:
        alerts = [a for a in store.alerts(device=0, limit=100) if a["rule"] == "memory_leak"]
    assert len(alerts) == 1
    message = alerts[0]["message"]
    # fired once four checks gave a rate: the fourth failed check found 8 blocks (the
    # first and second leaked requests), and the text names the pid and the rate
    assert message.startswith("KV pool leaking blocks: 8 orphaned KV blocks (latest check); "
                              "rising "), message
    assert " blocks/s (" in message and "90 %) = " in message and " MiB/h (" in message
    assert message.endswith(f"(leak) [pid {rec.leaky_pid}]")
    # the fourth failed check comes three requests after the first (one check a request)
    assert alerts[0]["fired_ts_s"] - _kv(rec)["first_detected_ts"] == pytest.approx(
        3 * S.PERIOD_S, abs=0.2)


def _js_number(v: float) -> str:
    """``+v.toPrecision(3)`` as the page prints it (``8``, ``7.97``)."""
    return f"{float(f'{v:.3g}'):g}"


@pytest.mark.browser
def test_the_leaks_page_in_chromium_shows_the_pools_figures(run, driver):  # noqa: F811
    import time

    from tests.dashboard.browser.test_pages import wait_for as wait_in
    from tests.support.dashboard_fixtures import ServedApp

    rec, _ = run
    leak = _kv(rec)
    kv = leak["kv_pool"]
    with Store.open(rec.db_url) as store:
        server = ServedApp(create_app(parse_config({}, None), store))
        try:
            driver.get(server.url + "/leaks?device=0")
            wait_in(driver, "const e = document.getElementById('leaks-plot');"
                            "return e && e._fullLayout && e.data && e.data.length > 0 &&"
                            " document.querySelectorAll('#leak-cards .card').length > 0;",
                    "the Leaks page")
            cards = driver.execute_script(
                "return [...document.querySelectorAll('#leak-cards .card')]"
                ".map(c => [...c.children].map(x => x.textContent));")
            traces, x_range = driver.execute_script(
                "const e = document.getElementById('leaks-plot');"
                "return [e.data.map(t => [t.name, t.x.length]), e._fullLayout.xaxis.range];")
            errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        finally:
            server.close()
    by_label = {c[0]: c[1:] for c in cards}
    assert by_label["Verdict"] == ["leak", f"for python kv_server.py (pid {rec.leaky_pid})"]
    mib_h = leak["slope_bytes_per_s"] * 3600 / 2**20
    assert by_label["Slope"][0] == f"{mib_h:.1f} MiB/h"
    assert by_label["Slope"][1].startswith("90 %: ") and by_label["Slope"][1].endswith("MiB/h")
    rate = (f"{_js_number(kv['blocks_per_s'])} blocks/s (90 %: "
            f"{_js_number(kv['blocks_per_s_low'])} blocks/s – "
            f"{_js_number(kv['blocks_per_s_high'])} blocks/s)")
    assert by_label["Orphaned KV blocks"] == [str(S.ORPHANED), "latest check · " + rate]
    assert by_label["KV pool full in"][0] == f"about {kv['exhaustion_s']:.1f} s"
    assert by_label["KV pool full in"][1].endswith(f" · {S.FREE_BLOCKS} free blocks")
    assert traces == [["orphaned KV blocks", len(kv["floor"])], ["at the pool's rate", 2]]
    year = str(time.gmtime(rec.started_s).tm_year)
    assert str(x_range[0]).startswith(year) and str(x_range[1]).startswith(year), x_range
    assert errors == []
