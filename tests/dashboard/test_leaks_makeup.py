"""The Leaks page's make-up table: two idle-point layouts from a real SQLite store, diffed."""

from __future__ import annotations

import pytest
from vramscope.agent.analysis.makeup import CUBLAS_DIAGNOSIS, CUBLAS_REMEDY
from vramscope.agent.records import Phase, Sample
from vramscope.agent.store import Store
from vramscope.dashboard import views
from vramscope.dashboard.app import create_app

from tests.agent.test_analysis_makeup import WS, after_calls, event

T0 = 1_700_000_000.0


@pytest.fixture
def store(tmp_path):
    """Ten calls a minute apart, each leaving a cuBLAS workspace on its new stream."""
    s = Store.open(f"sqlite:///{tmp_path / 'm.db'}", host_name="h")
    s.write([Sample(T0 + t, 0, Phase.IDLE, "torch", 1, allocated_bytes=WS * (1 + t // 60))
             for t in range(0, 600, 5)],
            [event(T0 + 60 * n + 30, after_calls(n + 1)) for n in range(10)])
    yield s
    s.close()


def test_the_leaks_api_names_the_makeup_of_the_growth(store):
    client = create_app(None, store).test_client()
    doc = client.get(f"/api/v1/figures/leaks?device=0&start={T0}&end={T0 + 600}").get_json()
    m = doc["makeup"]
    assert (m["before_ts"], m["after_ts"]) == (T0 + 30, T0 + 570)  # the first and the latest
    assert m["blocks"] == [{"size_bytes": WS, "count": 9, "bytes": 9 * WS, "streams": 9,
                            "new_streams": 9, "phase": None, "stack": [],
                            "description": "9 new blocks of 32 MiB, one per new stream"}]
    assert (m["diagnosis"], m["remedy"]) == (CUBLAS_DIAGNOSIS, CUBLAS_REMEDY)
    html = client.get("/leaks?device=0").get_data(as_text=True)
    assert 'id="makeup-table"' in html and 'id="makeup-summary"' in html


def test_the_makeup_starts_at_the_rise_and_reads_only_a_few_layouts(store, monkeypatch):
    monkeypatch.setattr(views, "LAYOUT_READ_LIMIT", 2)
    reads = []
    real = store.events

    def counting(*args, **kwargs):
        got = real(*args, **kwargs)
        reads.append(len(got))
        return got

    monkeypatch.setattr(store, "events", counting)
    m = views.leak_makeup_view(store, None, 0, None, T0, T0 + 600, rise_ts_s=T0 + 200)
    assert (m["before_ts"], m["after_ts"]) == (T0 + 150, T0 + 570)
    assert m["blocks"][0]["count"] == 7
    assert sum(reads) <= 6  # never the whole window's layouts
    whole = views.leak_makeup_view(store, None, 0, None, T0, T0 + 10_000, None)
    assert whole["after_ts"] == T0 + 570  # paged on to the newest past the read limit
    assert views.leak_makeup_view(store, None, 0, None, T0, T0 + 60, None) is None
