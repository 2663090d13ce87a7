"""Phase bands of a timeline window older than the raw samples come from the per-second tier:
each second's phase (its last sample's), consecutive seconds of one phase one band, stitched
with the bands of the raw samples (or phase events) from the device's first raw sample on.

The scripted store (``tests/support/aged_store``) holds each second wholly in one phase (7 idle,
then 3 decode of every 10), so the tier's bands are exactly the ones the raw samples gave before
retention deleted them; each test compares with that answer and spells out the boundaries.
"""

from __future__ import annotations

from typing import Any

import pytest
from vramscope.agent.records import Event, Phase, Sample
from vramscope.agent.store import Store, downsample, reader
from vramscope.dashboard.app import create_app

from tests.support.aged_store import HORIZON, OLD_S, W0, busy, run_retention, span, write_spans
from tests.support.sql_watch import statements_sent

H = HORIZON  # the device's first raw sample once retention ran
OLD = (W0, W0 + OLD_S)  # device 0, 15 minutes at 10 Hz, raw samples all gone
ACROSS = (H - OLD_S / 2, H + OLD_S / 2)  # device 0 at 2 Hz: a decode run ends at the horizon
SHIFT = 3  # devices 1 and 2: the same span 3 s earlier, so an idle run straddles the horizon
SHIFTED = (H - OLD_S / 2 - SHIFT, H + OLD_S / 2 - SHIFT)
LONG_RAW = (H - 480, H + 960)  # device 0 again: 16 min of raw part, too long to read changes


def _on(device: int, samples: list[Sample]) -> list[Sample]:
    return [s._replace(device=device) for s in samples]


def _phase_events(device: int, t0: float, seconds: int) -> list[Event]:
    """A ``phase`` event at each change of ``span``'s script (its first second included)."""
    return [Event(t0 + k, "phase", device, phase=Phase.DECODE if busy(k) else Phase.IDLE)
            for k in range(seconds) if k == 0 or busy(k) != busy(k - 1)]


def _doc(store: Store, device: int, window: tuple[float, float]) -> dict[str, Any]:
    r = create_app(None, store).test_client().get(
        f"/api/v1/timeline?device={device}&start={window[0]}&end={window[1]}&max_points=300")
    assert r.status_code == 200, r.get_data(as_text=True)
    return r.get_json()


CASES = ((0, OLD), (0, ACROSS), (1, SHIFTED), (2, SHIFTED), (0, LONG_RAW))


@pytest.fixture
def aged(any_url):
    """(store after retention, each case's timeline before it). Device 2 also reports its
    phase changes as events (deleted with the raw samples before the horizon)."""
    store = Store.open(any_url, host_name="h")
    write_spans(store)
    t0 = SHIFTED[0]
    store.write(_on(1, span(t0, OLD_S, 2)))
    store.write(_on(2, span(t0, OLD_S, 2)), _phase_events(2, t0, OLD_S))
    raw = {case: _doc(store, *case) for case in CASES}
    run_retention(store)
    assert store.samples(0, *OLD) == []
    assert [min(s.ts_s for s in store.samples(d, *w)) for d, w in CASES[1:4]] == [H, H, H]
    yield store, raw
    store.close()


def _band(phase: str, start: float, end: float) -> dict[str, Any]:
    return {"phase": phase, "start": start, "end": end}


def test_an_old_window_s_bands_come_from_the_per_second_tier(aged):
    store, raw = aged
    doc = _doc(store, 0, OLD)
    assert doc["phase_source"] == "per-second tier"
    assert doc["phases"] == raw[(0, OLD)]["phases"]
    assert len(doc["phases"]) == 2 * OLD_S // 10  # an idle and a decode run every 10 s
    assert doc["phases"][:3] == [_band("idle", W0, W0 + 7), _band("decode", W0 + 7, W0 + 10),
                                 _band("idle", W0 + 10, W0 + 17)]
    # the last decode run lasts to the window's end, as a raw sample's phase would
    assert doc["phases"][-1] == _band("decode", W0 + OLD_S - 3, W0 + OLD_S)
    assert raw[(0, OLD)]["phase_source"] == "samples"


def test_bands_across_the_raw_horizon_are_the_tier_s_then_the_samples(aged):
    store, raw = aged
    doc = _doc(store, 0, ACROSS)
    assert doc["phase_source"] == "per-second tier, then samples"
    assert doc["phases"] == raw[(0, ACROSS)]["phases"]
    at = doc["phases"].index(_band("decode", H - 3, H))  # the tier's last band ...
    assert doc["phases"][at + 1] == _band("idle", H, H + 7)  # ... the samples' first
    assert doc["phases"][0] == _band("idle", ACROSS[0], ACROSS[0] + 7)


def test_a_phase_held_across_the_horizon_is_one_band(aged):
    store, raw = aged
    doc = _doc(store, 1, SHIFTED)
    assert doc["phase_source"] == "per-second tier, then samples"
    assert doc["phases"] == raw[(1, SHIFTED)]["phases"]
    # seconds 450-456 of the span are idle: 3 in the tier, 4 raw
    assert [b for b in doc["phases"] if b["start"] < H < b["end"]] == [
        _band("idle", H - 3, H + 4)]


def test_bands_across_the_horizon_stitch_with_phase_events(aged):
    """Phase events go with the raw samples: before the horizon the tier's phases stand in, and
    its last band lasts until the first event after it (events mark every change)."""
    store, raw = aged
    doc = _doc(store, 2, SHIFTED)
    assert (raw[(2, SHIFTED)]["phase_source"], doc["phase_source"]) == (
        "events", "per-second tier, then events")
    assert doc["phases"] == raw[(2, SHIFTED)]["phases"]
    assert _band("idle", H - 3, H + 4) in doc["phases"]  # no event at the horizon itself
    assert store.events(2, *SHIFTED, names=("phase",))[0].ts_s == H + 4


def test_a_long_raw_part_gives_shares_with_the_tier_s_seconds_counted(aged):
    """16 minutes of raw part: their changes are not read, so shares per 6 s bucket, the tier's
    seconds counting their samples (2 torch + 1 NVML a second) as the raw rows did."""
    store, raw = aged
    doc = _doc(store, 0, LONG_RAW)
    assert (doc["phases"], doc["phase_source"]) == ([], "per-second tier, then samples")
    shares = doc["phase_shares"]
    assert shares == raw[(0, LONG_RAW)]["phase_shares"]
    at = {ts: (shares["decode"][i], shares["idle"][i]) for i, ts in enumerate(shares["ts"])}
    assert at[H - 450] == (0.0, 1.0)  # the span's seconds 0-5 (the tier)
    assert at[H - 444] == (0.5, 0.5)  # 6, 7-9 decode, 10-11
    assert at[H - 6] == (0.5, 0.5)  # 444-446, 447-449 decode: the tier's last bucket
    assert at[H] == (0.0, 1.0)  # 450-455: raw samples
    assert min(shares["ts"]) == H - 450 and max(shares["ts"]) == H + 444  # the span's last


def test_a_part_before_the_raw_samples_longer_than_the_read_limit_says_nothing(
        aged, monkeypatch):
    """Beyond ``SECONDS_READ_MAX_S`` the tier is not unpacked for phases; the page says to zoom,
    not that no phase was reported."""
    store, _ = aged
    monkeypatch.setattr(downsample, "SECONDS_READ_MAX_S", 600.0)  # the 15 minutes are over it
    with statements_sent(store.engine, lambda sql: "seconds" in sql) as sent:
        bands = reader.phase_bands(store, reader.Span(0, *OLD), 300, [])
    assert bands == ([], None, "zoom to 0.166667 h or less")
    assert sent == []
    # ten minutes of it, within the limit, are read from the tier: one query
    with statements_sent(store.engine, lambda sql: "FROM seconds" in sql) as sent:
        assert reader.phase_bands(store, reader.Span(0, W0, W0 + 600), 300, [])[2] == (
            "per-second tier")
    assert len(sent) == 1
