"""A timeline request crosses from the dashboard into the store three times at most
(docs/architecture.md, "The reader"): is the device known, where does its data end (only
without ``end``), and the reader's one timeline read. Counted on a real store by watching every
call a dashboard module makes to a ``Store`` method or to the reader."""

from __future__ import annotations

import inspect
import sys
from typing import Any

import pytest
from vramscope.agent.records import Event, Phase, Sample
from vramscope.agent.store import Store, reader
from vramscope.dashboard.app import create_app

T0 = 1_700_000_040.0  # a minute boundary


@pytest.fixture
def crossings(tmp_path, monkeypatch):
    """(store, the names the dashboard called across the boundary, in order)."""
    store = Store.open(f"sqlite:///{tmp_path / 'c.db'}", host_name="h")
    store.write([Sample(T0 + k, 0, Phase.DECODE if k % 10 > 6 else Phase.IDLE, "torch", 7,
                        allocated_bytes=2**30 + k, reserved_bytes=2**31) for k in range(600)],
                [Event(T0 + k, "request_start", 0, 7) for k in range(0, 600, 30)])
    called: list[str] = []

    def watch(owner: Any, name: str) -> None:
        real = getattr(owner, name)

        def crossing(*args: Any, **kwargs: Any) -> Any:
            if sys._getframe(1).f_globals.get("__name__", "").startswith("vramscope.dashboard"):
                called.append(name)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, crossing)

    for name, _ in inspect.getmembers(Store, inspect.isfunction):
        if not name.startswith("_"):
            watch(store, name)
    for name in reader.__all__:
        if inspect.isfunction(getattr(reader, name)):
            watch(reader, name)
    yield store, called
    store.close()


def test_a_timeline_request_crosses_into_the_store_three_times(crossings):
    store, called = crossings
    client = create_app(None, store).test_client()
    r = client.get("/api/v1/timeline?device=0&span=600")  # no end: the newest sample's
    assert r.status_code == 200, r.get_data(as_text=True)
    assert called == ["devices", "time_range", "timeline"]
    doc = r.get_json()
    assert doc["end"] == T0 + 599 and len(doc["series"]["allocated_bytes"]["ts"]) == 600
    # the window opens a second before T0: its first minute holds no request start
    assert doc["request_rate"]["per_min"] == [0.0] + [2.0] * 10
    assert doc["phase_source"] == "samples"
    called.clear()
    r = client.get(f"/api/v1/figures/timeline?device=0&start={T0}&end={T0 + 300}")
    assert r.status_code == 200 and called == ["devices", "timeline"]
