"""An old window, once retention has deleted its raw samples, is analysed from the per-second
tier: the Leaks, OOM-risk, analysis and timeline answers of a 15-minute window three days ago
carry the scripted floor and peaks, and say where they came from (``tier``). A window that
straddles the raw horizon reads the tier up to it and the raw samples after."""

from __future__ import annotations

from typing import Any

import pytest
from vramscope.agent.store import Store, reader
from vramscope.dashboard.app import create_app

from tests.support.aged_store import (
    BASE,
    BUSY,
    GIB,
    GROW,
    HORIZON,
    MIB,
    OLD_S,
    TOTAL,
    W0,
    allocated,
    run_retention,
    used,
    write_spans,
)

OLD = (W0, W0 + OLD_S)  # 15 minutes three days before retention's "now": raw samples gone
ACROSS = (HORIZON - OLD_S / 2, HORIZON + OLD_S / 2)  # raw samples from HORIZON on
ROUTES = ("figures/leaks", "figures/risk", "analysis", "timeline")


def _get(store: Store, route: str, window: tuple[float, float], extra: str = "") -> Any:
    r = create_app(None, store).test_client().get(
        f"/api/v1/{route}?device=0&start={window[0]}&end={window[1]}{extra}")
    assert r.status_code == 200, r.get_data(as_text=True)
    return r.get_json()


def _answers(store: Store, window: tuple[float, float]) -> dict[str, Any]:
    return {route: _get(store, route, window, "&max_points=300" if route == "timeline" else "")
            for route in ROUTES}


@pytest.fixture
def aged(any_url, monkeypatch):
    """(store after retention, the raw path's answers before it): the limit raised so that
    the raw samples of both windows were analysed one by one, as the tier's seconds are."""
    store = Store.open(any_url, host_name="h")
    write_spans(store)
    with monkeypatch.context() as m:
        m.setattr(reader, "RAW_SAMPLE_LIMIT", 100_000)
        raw = {window: _answers(store, window) for window in (OLD, ACROSS)}
    run_retention(store)
    assert store.samples(0, *OLD) == []
    assert min(s.ts_s for s in store.samples(0, *ACROSS)) == HORIZON
    yield store, raw
    store.close()


def test_an_old_window_s_leak_page_draws_the_tier_and_says_no_verdict_is_stored(aged):
    """The spans were written without the alert engine (no agent, no import): the page says
    that no verdict is stored, never one of its own, and draws no floor (the floor it draws
    is the one the engine judged on, which stored verdicts carry: none here)."""
    from vramscope.dashboard.verdict_views import NO_VERDICTS

    store, raw = aged
    view = _get(store, "figures/leaks", OLD)
    assert view["limit_bytes"] == TOTAL
    assert (view["result"]["state"], view["result"]["evidence"]) == ("no_verdict", NO_VERDICTS)
    assert view["processes"] == []
    assert view["floor_points"] == 0
    assert [(t["name"], t["x"]) for t in view["figure"]["data"]] == [("idle floor", [])]


def test_an_old_window_s_risk_reads_each_second_s_peak(aged):
    store, raw = aged
    view = _get(store, "figures/risk", OLD)
    assert view["limit_bytes"] == TOTAL
    # the last bucket's headroom: the limit less NVML's used in the last (decode) second
    assert view["latest_headroom_bytes"] == TOTAL - used(OLD_S - 1) == 36 * GIB - 899
    assert view["now"] is None  # no stored verdict: nothing is said
    headroom = view["figure"]["data"][0]
    assert min(headroom["y"]) == min(raw[OLD]["figures/risk"]["figure"]["data"][0]["y"])


def test_an_old_window_s_analysis_has_the_scripted_peaks(aged):
    store, _ = aged
    doc = _get(store, "analysis", OLD)
    assert (doc["tier"], doc["bucket_s"]) == ("per-second tier", 1.0)
    phases = doc["devices"]["0"]["phases"]
    # 900 seconds of two sources, each second a minimum and a maximum: 270 decode seconds
    assert (phases["decode"]["samples"], phases["idle"]["samples"]) == (270 * 4, 630 * 4)
    assert phases["decode"]["peak_allocated_bytes"] == allocated(899, 9) == (
        BASE + 14 * GROW + BUSY + 9 * MIB)
    assert phases["idle"]["peak_allocated_bytes"] == allocated(896, 9)


def test_an_old_15_minute_timeline_has_every_bucket_from_the_per_second_tier(aged):
    store, raw = aged
    doc = _get(store, "timeline", OLD, "&max_points=300")
    series = doc["series"]["allocated_bytes"]
    assert series["ts"] == [W0 + 3 * i for i in range(300)]
    seconds = [range(3 * i, 3 * i + 3) for i in range(300)]
    assert series["min"] == [min(allocated(k, 0) for k in ks) for ks in seconds]
    assert series["max"] == [max(allocated(k, 9) for k in ks) for ks in seconds]
    assert doc["series"] == raw[OLD]["timeline"]["series"]  # 3 s buckets: whole seconds


def test_a_window_across_the_raw_horizon_stitches_the_tier_and_the_raw_samples(aged):
    store, raw = aged
    leaks = _get(store, "figures/leaks", ACROSS)
    # no stored verdicts: no judged floor to draw, before the raw samples aged or after
    assert leaks["floor_points"] == 0
    assert [(t["name"], t["x"]) for t in leaks["figure"]["data"]] == [("idle floor", [])]
    assert raw[ACROSS]["figures/leaks"]["floor_points"] == 0
    risk = _get(store, "figures/risk", ACROSS)
    assert risk["latest_headroom_bytes"] == TOTAL - used(OLD_S - 1)
    doc = _get(store, "analysis", ACROSS)
    assert (doc["tier"], doc["bucket_s"]) == ("per-second tier, then raw samples", 1.0)
    timeline = _get(store, "timeline", ACROSS, "&max_points=300")
    assert timeline["series"] == raw[ACROSS]["timeline"]["series"]
