"""The views count a window before they build it: more raw samples than one request may analyse
are never fetched as ``Sample`` objects."""

from __future__ import annotations

from vramscope.agent.store import Store
from vramscope.agent.store.history_generator import T_END, History, generate
from vramscope.agent.store.window import count_at_most
from vramscope.dashboard import views


def _store(tmp_path) -> Store:
    store = Store.open(f"sqlite:///{tmp_path / 'h.db'}", host_name="h")
    generate(store, History(devices=2, hz=1.0, days=1 / 24, events=False))  # 3,600 per device
    return store


def test_count_at_most_stops_one_past_the_limit(tmp_path):
    with _store(tmp_path) as store:
        assert count_at_most(store, 1, T_END - 100, T_END, 1000) == 100  # ends included
        assert count_at_most(store, 1, None, None, 1000) == 1001
        assert count_at_most(store, 1, None, None, 5000) == 3600
        assert count_at_most(store, 7, None, None, 10) == 0  # no such device
        assert count_at_most(store, 1, None, None, 10, host="other") == 0


def test_a_window_over_the_limit_is_not_built(tmp_path, monkeypatch):
    monkeypatch.setattr(views, "RAW_SAMPLE_LIMIT", 1000)
    with _store(tmp_path) as store:
        def refuse(*args, **kwargs):
            raise AssertionError("samples built for a window over the limit")
        monkeypatch.setattr(store, "samples", refuse)
        assert views._raw_records(store, 1, None, T_END - 3600, T_END) == (None, [])
        view = views.leaks_view(store, None, 1, None, T_END - 3600, T_END)
        assert (view["tier"], view["floor_points"]) == ("per-minute rollups, 60 s buckets", 60)
        assert view["method"] == "idle floor of per-minute rollups, 60 s buckets"
