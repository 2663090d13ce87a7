"""A process near the limit that does not grow itself reads "at risk from pid N's growth"
(issue 44): the engine's rule (``RiskModel.at_risk_from``) is stored with its verdict row
(``risk.at_risk_from_pid``) and every surface prints it from there in one wording
(``diagnosis.cause_words``), the words the alert says.

The scripted device is tests/agent/test_growth.py's pair: pid 1 grows 60 MiB/s from 300 s
(a leak, named at 600 s), pid 2 stays at a flat 10 GiB; NVML sees both, so pid 2's demand
holds pid 1's growth and it is warned at 660.1 s, critical at 949.1 s."""

from __future__ import annotations

import html

import pytest
from vramscope.agent.alerts.engine import AlertEngine
from vramscope.agent.alerts.sinks import StoreSink
from vramscope.agent.analysis.report_text import _process_lines
from vramscope.agent.cli.cmd_status import _render_verdicts
from vramscope.agent.clock import FakeClock
from vramscope.agent.config import parse_config
from vramscope.agent.store import Store
from vramscope.agent.store import verdicts as stored
from vramscope.dashboard.app import create_app

from tests.agent.test_growth import _pair

END = 1000.0
AT_RISK = "growth (at risk from pid 1's growth)"


def stored_pair(url: str) -> Store:
    """A store with the pair's verdict rows and alerts, as the agent writes them."""
    s = Store.open(url)
    engine = AlertEngine.from_config(None)
    changes = engine.feed(_pair(int(END)))
    stored.write(s, engine.verdicts.take())
    sink = StoreSink(s)
    for change in changes:
        sink.write(change)
    return s


@pytest.fixture
def store(any_url):
    s = stored_pair(any_url)
    yield s
    s.close()


def test_the_victims_rows_keep_whose_growth_it_is_at_risk_from(store):
    rows = stored.history(store, 0, None, 0.0, END)
    assert [(v.ts_s, v.pid, v.risk_level, v.risk_cause, v.risk_at_risk_from_pid)
            for v in rows if v.risk_level != "ok"] == [
        (601.0, 1, "warning", "growth", None),
        (660.1, 2, "warning", "growth", 1),
        (901.0, 1, "warning", "growth", None),
        (949.0, 1, "critical", "growth", None),
        (949.1, 2, "critical", "growth", 1)]
    # the grower's own growth is its answer: it is at risk from no one
    procs = {d["pid"]: d for d in stored.processes(store, 0, None, END)}
    assert {p: (d["leak"]["state"], d["risk"]["at_risk_from_pid"], d["cause_text"])
            for p, d in procs.items()} == {1: ("leak", None, "growth"),
                                           2: ("insufficient_data", 1, AT_RISK)}


def test_the_pages_and_the_status_line_print_it_from_the_stored_row(store):
    client = create_app(parse_config({}, None), store, clock=FakeClock(END)).test_client()
    risk = client.get(f"/api/v1/figures/risk?device=0&start=0&end={END}").get_json()
    assert {p["pid"]: (p["risk"]["at_risk_from_pid"], p["cause_text"])
            for p in risk["processes"]} == {1: (None, "growth"), 2: (1, AT_RISK)}
    now = risk["now"]  # the riskiest process the engine stored: the grower
    assert (now["pid"], now["cause"], now["at_risk_from_pid"], now["cause_text"]) == (
        1, "growth", None, "growth")
    (device,) = client.get("/api/v1/devices").get_json()["devices"]
    assert [(v["pid"], v["risk"], v["cause"], v["at_risk_from_pid"], v["cause_text"])
            for v in device["verdicts"]] == [(1, "critical", "growth", None, "growth"),
                                             (2, "critical", "growth", 1, AT_RISK)]
    # the device line the server renders on the device pages
    page = html.unescape(client.get("/risk?device=0").get_data(as_text=True))
    assert ("unknown (pid 2): not enough data yet, OOM risk critical "
            f"({AT_RISK})") in " ".join(page.split())
    # `vramscope status` and `analyze`'s per-process lines
    leak = "LEAK 210.9 GiB/h (179.3 GiB/h to 242.6 GiB/h), full in about 10 min (9 min – 12 min)"
    status = _render_verdicts(stored.newest_all(store, "*")).splitlines()[2:]
    assert [line.split(" GPU ", 1)[1] for line in status] == [  # after the host's name
        f"0 pid 1 (?): {leak}; OOM risk critical (growth)",
        f"0 pid 2 (?): not enough data yet; OOM risk critical ({AT_RISK})"]
    assert _process_lines(stored.processes(store, 0, None, END)) == [
        "  per process:",
        f"    unknown (pid 1): {leak} since 1970-01-01T00:10:00.000Z; OOM risk critical (growth)",
        f"    unknown (pid 2): not enough data yet; OOM risk critical ({AT_RISK})"]
