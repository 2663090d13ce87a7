"""The server's side of issue 34's items 4, 5 and 12, without a browser (Flask's client):
which device and window a page opens on, the moments the Overview's values are from, and which
traces a legend lists. The browser side is tests/dashboard/browser/test_first_hour_pages.py."""

from __future__ import annotations

import re

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.config import parse_config
from vramscope.agent.records import Phase, Sample
from vramscope.agent.store import Store
from vramscope.dashboard import figures

GIB, MIB = 2**30, 2**20
T0 = 1_700_000_000.0
NOW_S = T0 + 10 * 3600


@pytest.fixture
def client(tmp_path):
    from vramscope.dashboard.app import create_app

    store = Store.open(f"sqlite:///{tmp_path / 'f.db'}", host_name="h")
    for i in range(3):
        store.describe_device(i, uuid=f"GPU-{i}", name="NVIDIA H100", total_bytes=80 * GIB)
    store.write([Sample(T0 + t, 0, Phase.DECODE, "torch", 777, allocated_bytes=GIB,
                        reserved_bytes=2 * GIB) for t in range(151)]
                + [Sample(T0 + t, 0, Phase.UNKNOWN, "nvml", None, device_used_bytes=615 * MIB)
                   for t in range(0, 121, 10)], [])
    store.open_alert("idle_floor_leak", "warning", T0, device=1, message="floor rising")
    store.open_alert("headroom", "critical", T0, device=2, message="headroom 2 %")
    clock = FakeClock(T0 + 160)  # 10 s after the last sample: live
    yield create_app(parse_config({}, None, {}), store, clock=clock).test_client(), clock
    store.close()


def _data(html: str, name: str) -> str:
    found = re.search(rf'data-{name}="([^"]*)"', html)
    assert found, name
    return found.group(1)


@pytest.mark.parametrize("path", ["/timeline", "/leaks", "/risk"])
def test_a_device_page_without_a_device_opens_on_the_overviews_first(client, path):
    c, _ = client
    assert c.get("/api/v1/overview").get_json()["devices"][0]["device"] == 2
    html = c.get(path).get_data(as_text=True)
    assert _data(html, "device") == "2"
    assert '<span class="badge critical">critical</span>' in html
    assert "headroom (critical)" in html


def test_a_short_recording_that_ended_long_ago_opens_on_its_own_span(client):
    c, clock = client
    html = c.get("/timeline?device=0").get_data(as_text=True)
    assert (_data(html, "start"), _data(html, "end")) == ("", "")  # live: follows the hour
    clock.advance(NOW_S - clock.time_s())  # ten hours later: a recording of the past
    html = c.get("/timeline?device=0").get_data(as_text=True)
    assert (_data(html, "start"), _data(html, "end")) == (str(T0 - 3), str(T0 + 153))
    html = c.get("/timeline?device=0&span=900").get_data(as_text=True)
    assert (_data(html, "start"), _data(html, "end")) == ("", "")  # a window asked for: kept


def test_the_overview_gives_the_moment_of_each_value(client):
    c, _ = client
    row = next(d for d in c.get("/api/v1/overview").get_json()["devices"] if d["device"] == 0)
    assert row["latest"]["moments"] == {"allocated_bytes": T0 + 150,
                                        "reserved_bytes": T0 + 150,
                                        "device_used_bytes": T0 + 120}


def test_legends_leave_out_traces_that_draw_nothing():
    traces = figures.drawn_in_legend([
        figures._line("none", [1, 2], [None, None], "#000"),
        figures._line("isolated", [1, 2, 3], [1.0, None, 2.0], "#000"),
        figures._line("drawn", [1, 2], [1.0, 2.0], "#000"),
        {"type": "scatter", "mode": "markers", "name": "one marker", "x": [1], "y": [1.0]}])
    assert [t.get("showlegend", True) for t in traces] == [False, False, True, True]
