"""A leak rate read off an estimated floor (a server rarely or never idle, without KV figures) is
rough, and the engine's verdict says so (``leak.estimated_floor``): every surface that prints
the rate puts "about" before it, the ones read off an exact floor do not. Two processes on one
device, each with a scripted stored verdict (the store's rows, not an engine run): the
analysis document, ``/api/v1/devices``, ``/api/v1/figures/leaks`` and ``vramscope status``."""

from __future__ import annotations

import pytest
from vramscope.agent.alerts.verdicts import DeviceVerdict, Verdict
from vramscope.agent.cli import main
from vramscope.agent.config import parse_config
from vramscope.agent.records import Phase, Sample
from vramscope.agent.store import Store
from vramscope.agent.store import verdicts as stored
from vramscope.dashboard.app import create_app

GIB, MIB = 2**30, 2**20
T0 = 1_790_000_000.0  # 2026-09: the Overview's now is the wall clock
ROUGH, EXACT = 7, 8  # pids: the steeper leak is the rough one (the pages' headline)


def leak_row(pid: int, mib_per_h: float, estimated: bool) -> Verdict:
    return Verdict(T0 + 7200, 0, None, pid, "leak", mib_per_h * MIB / 3600, T0 + 1800,
                   T0 + 5400, 7200.0, f"scripted: leak of pid {pid}", "ok", None, (), 40 * GIB,
                   None, None, None, None, None, leak_estimated_floor=estimated)


@pytest.fixture
def url(tmp_path):
    url = f"sqlite:///{tmp_path / 'rough.db'}"
    with Store.open(url) as store:
        store.write([Sample(T0 + 7200, 0, Phase.DECODE, "torch", pid, allocated_bytes=20 * GIB,
                            device_total_bytes=80 * GIB) for pid in (ROUGH, EXACT)], [])
        # and the device's answer, as the engine stores it: the steeper leak leads
        stored.write(store, [leak_row(ROUGH, 600.0, True), leak_row(EXACT, 300.0, False),
                             DeviceVerdict(T0 + 7200, 0, None, "ok", ROUGH, ROUGH)])
    return url


def test_the_verdict_keeps_the_flag_and_a_row_written_before_it_reads_as_exact():
    row = leak_row(ROUGH, 600.0, True)
    assert stored.verdict_from_json(row.to_json()) == row
    old = row.to_json()
    del old["leak"]["estimated_floor"]  # a row written before verdicts kept it
    assert stored.verdict_from_json(old).leak_estimated_floor is False
    odd = row.to_json()
    odd["leak"]["estimated_floor"] = "yes"  # damage is no claim that the rate is rough
    assert stored.verdict_from_json(odd).leak_estimated_floor is False


def test_every_surface_says_about_before_a_rough_rate_only(url, capsys):
    with Store.open(url) as store:
        client = create_app(parse_config({}, None), store).test_client()
        q = f"device=0&start={T0}&end={T0 + 7200}"
        doc = client.get(f"/api/v1/analysis?{q}").get_json()
        d = doc["devices"]["0"]
        assert (d["leak"]["pid"], d["leak"]["estimated_floor"]) == (ROUGH, True)
        assert {p["pid"]: p["leak"]["estimated_floor"] for p in d["processes"]} == {
            ROUGH: True, EXACT: False}
        leaks = client.get(f"/api/v1/figures/leaks?{q}").get_json()["result"]
        assert (leaks["pid"], leaks["slope_bytes_per_h"], leaks["estimated_floor"]) == (
            ROUGH, 600.0 * MIB, True)
        devices = client.get("/api/v1/devices").get_json()["devices"]
        assert [(v["pid"], v["leak_slope_bytes_per_h"], v["leak_estimated_floor"],
                 v["leak_text"]) for v in devices[0]["verdicts"]] == [
            (ROUGH, 600.0 * MIB, True, "about 600.0 MiB/h"),
            (EXACT, 300.0 * MIB, False, "300.0 MiB/h")]
    assert main(["status", "--db", url, "--socket", "/nonexistent/agent.sock"]) == 1
    lines = [line.split(" GPU 0 ")[-1] for line in capsys.readouterr().out.splitlines()
             if " GPU 0 pid " in line]
    assert lines == ["pid 7 (?): LEAK about 600.0 MiB/h; OOM risk ok",
                     "pid 8 (?): LEAK 300.0 MiB/h; OOM risk ok"]


def test_the_device_line_says_a_leak_s_interval_and_time_to_oom(tmp_path):
    """The Overview's and the device pages' per-process line print a leak's rate, its 90 %
    interval and its time to OOM with its range, from the stored verdict, in the words
    ``vramscope status`` uses (nothing but the alert said "full in about ..." before)."""
    row = leak_row(EXACT, 750.0, False)._replace(
        leak_rate_low_bytes_per_s=690.0 * MIB / 3600, leak_rate_high_bytes_per_s=810.0 * MIB / 3600,
        leak_time_to_oom_s=11_520.0, leak_time_to_oom_low_s=10_080.0,
        leak_time_to_oom_high_s=13_320.0)
    url = f"sqlite:///{tmp_path / 'tto.db'}"
    with Store.open(url) as store:
        store.write([Sample(T0 + 7200, 0, Phase.DECODE, "torch", EXACT, allocated_bytes=20 * GIB,
                            device_total_bytes=80 * GIB)], [])
        stored.write(store, [row, DeviceVerdict(T0 + 7200, 0, None, "ok", EXACT, EXACT)])
        client = create_app(parse_config({}, None), store).test_client()
        (v,) = client.get("/api/v1/devices").get_json()["devices"][0]["verdicts"]
        said = ("750.0 MiB/h (690.0 MiB/h to 810.0 MiB/h), full in about 3 h 12 min "
                "(2 h 48 min – 3 h 42 min)")
        assert v["leak_text"] == said
        page = client.get("/risk?device=0").get_data(as_text=True)
        assert f"unknown (pid {EXACT}): LEAK {said}, OOM risk ok" in " ".join(page.split())
