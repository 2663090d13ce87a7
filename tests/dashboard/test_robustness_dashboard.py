"""Stored values that must not break readers: the seeded database (real SQLite, real Store)
plus a deeply nested event written behind the validators' back, and markup in every stored
string that reaches a Plotly figure."""

from __future__ import annotations

import json
import sqlite3

import pytest
from vramscope.agent.records import Holder, Phase, PostMortem, Sample
from vramscope.dashboard import figures

from tests.support import dashboard_fixtures as F

EVIL_HOST = '<a href="https://evil.example/">CLICK-ME</a>'
EVIL_ESCAPED = '&lt;a href="https://evil.example/"&gt;CLICK-ME&lt;/a&gt;'


@pytest.fixture
def own_seed(tmp_path):
    """A seeded database of this test's own (the session one is shared read-only)."""
    seeded = F.seed(tmp_path / "seed.db")
    yield seeded
    seeded.store.close()


def _client(seeded):
    from vramscope.dashboard.app import create_app

    return create_app(seeded.config(), seeded.store, clock=seeded.clock).test_client()


def _store_deep_event(db_path: str, depth: int) -> None:
    """What an older agent, another tool or a hand edit could have stored: an `oom` event
    whose data nests ``depth`` deep (the validators refuse it at ingest and import now)."""
    data = '{"deep":' + "[" * depth + "]" * depth + "}"
    with sqlite3.connect(db_path) as c:
        (device_id,) = c.execute("SELECT id FROM devices WHERE device_index = 0").fetchone()
        c.execute("INSERT INTO events (device_id, ts_s, name, pid, data) VALUES (?, ?, 'oom', "
                  "4141, ?)", (device_id, F.T0 + 7000, data))


ROUTES = ["/api/v1/timeline", "/api/v1/figures/timeline",
          "/api/v1/analysis", "/api/v1/figures/risk",
          "/api/v1/figures/leaks", "/timeline"]


@pytest.mark.parametrize("route", ROUTES)
def test_a_deeply_nested_stored_event_breaks_no_route(own_seed, route):
    _store_deep_event(own_seed.url.removeprefix("sqlite:///"), 980)
    reply = _client(own_seed).get(route, query_string={"host": F.HOST, "device": 0})
    assert reply.status_code == 200, reply.get_data(as_text=True)[:300]


def test_the_store_returns_unreadable_data_as_a_marker(own_seed):
    _store_deep_event(own_seed.url.removeprefix("sqlite:///"), 5000)
    deep = [e for e in own_seed.store.events(0, host=F.HOST) if e.ts_s == F.T0 + 7000]
    assert len(deep) == 1 and set(deep[0].data) == {"unreadable"}


def test_a_host_name_with_markup_is_escaped_in_every_figure_label():
    rows = [{"host": EVIL_HOST, "device": 0, "latest": {"allocated_bytes": 1,
                                                         "processes": [{"process": "<b>x</b>",
                                                                        "reserved_bytes": 1}]},
             "peaks": {"allocated_bytes": 1}}]
    overview = figures.overview_figure(rows)
    assert overview["data"][0]["y"] == [f"{EVIL_ESCAPED} · GPU 0"]
    capacity = figures.capacity_figure({"devices": rows})
    assert capacity["data"][0]["x"] == [f"{EVIL_ESCAPED} · GPU 0"]
    text = json.dumps([overview, capacity])
    assert "<a href" not in text and "CLICK-ME</a>" not in text


def test_stack_frames_with_markup_are_escaped_in_the_holders_figure():
    pm = PostMortem(1.0, 0, 1, Phase.DECODE, 1, 1, 1, 1, 1, 1, 0.5,
                    top_holders=(Holder(2**20, ('<span style="x">f</span> & <br>',), None),))
    labels = figures.holders_figure(pm)["data"][0]["y"]
    assert labels == ['#1 &lt;span style="x"&gt;f&lt;/span&gt; &amp; &lt;br&gt;']


def test_through_the_api_a_stored_evil_host_comes_back_escaped(own_seed):
    own_seed.store.write([Sample(F.NOW_S - 10, 0, Phase.IDLE, "torch", 1, allocated_bytes=1,
                                 host=EVIL_HOST)])
    reply = _client(own_seed).get("/api/v1/figures/overview", query_string={"host": "*"})
    assert reply.status_code == 200
    labels = [y for trace in reply.get_json()["data"] for y in trace.get("y", [])]
    assert f"{EVIL_ESCAPED} · GPU 0" in labels
    assert not any("<a href" in str(y) for y in labels)


@pytest.mark.parametrize("host", ["LOCALHOST", "LocalHost:8050", "localhost.", "127.0.0.1"])
def test_loopback_host_names_are_case_insensitive(own_seed, host):
    reply = _client(own_seed).get("/healthz", headers={"Host": host})
    assert reply.status_code == 200
