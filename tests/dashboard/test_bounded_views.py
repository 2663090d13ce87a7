"""The views count a window before they build it: more raw samples than one request may analyse
are never fetched as ``Sample`` objects."""

from __future__ import annotations

import pytest
from vramscope.agent.config import parse_config
from vramscope.agent.records import Phase, Sample
from vramscope.agent.store import Store, reader
from vramscope.agent.store.phase_shares import phase_changes
from vramscope.agent.store.window import count_at_most, events_at_most
from vramscope.dashboard import queries, verdict_views, views

from tools.history_generator import T_END, History, generate, roll_up_all


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


def test_events_at_most_counts_each_name_on_its_index_up_to_one_past_the_limit(tmp_path):
    with Store.open(f"sqlite:///{tmp_path / 'e.db'}", host_name="h") as store:
        # an hour at 1 Hz: a request every 37 s, 97 starts and 97 ends a device
        generate(store, History(devices=2, hz=1.0, days=1 / 24))
        both = ("request_start", "request_end")
        assert events_at_most(store, 1, T_END - 3600, T_END, both, 1000) == 194
        assert events_at_most(store, 1, T_END - 3600, T_END, both, 194) == 194  # not over
        assert events_at_most(store, 1, T_END - 3600, T_END, both, 193) == 194  # one past
        assert events_at_most(store, 1, T_END - 3600, T_END, both, 50) == 51  # within the first
        assert events_at_most(store, 1, T_END - 370, T_END, both, 1000) == 20
        assert events_at_most(store, 1, T_END - 3600, T_END, ("oom",), 10) == 0
        assert events_at_most(store, 7, T_END - 3600, T_END, both, 10) == 0  # no such device


def test_the_timeline_reads_no_request_event_it_would_not_show(tmp_path, monkeypatch):
    with Store.open(f"sqlite:///{tmp_path / 'e.db'}", host_name="h") as store:
        generate(store, History(devices=2, hz=1.0, days=1 / 24))
        asked: list[tuple[str, ...]] = []
        events = store.events

        def watched(*args, **kwargs):
            asked.append(tuple(kwargs.get("names") or ()))
            return events(*args, **kwargs)
        monkeypatch.setattr(store, "events", watched)
        doc = queries.timeline(store, 1, None, T_END - 3600, T_END, 100, ("allocated_bytes",))
        assert doc["events_truncated"] is True and doc["events"] == []  # 194 > 100
        assert ("request_start", "request_end") not in asked
        doc = queries.timeline(store, 1, None, T_END - 370, T_END, 100, ("allocated_bytes",))
        assert doc["events_truncated"] is False
        # the window opens inside a request: its end comes first
        assert [e["name"] for e in doc["events"]] == ["request_end", "request_start"] * 10


def test_the_analysis_and_risk_views_build_no_window_over_the_limit(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setattr(reader, "RAW_SAMPLE_LIMIT", 1000)
    with _store(tmp_path) as store:
        def refuse(*args, **kwargs):
            raise AssertionError("samples built for a window over the limit")
        monkeypatch.setattr(store, "samples", refuse)
        doc = views.report(store, None, 1, None, T_END - 3600, T_END)
        assert (doc["tier"], doc["bucket_s"]) == ("per-minute rollups, 60 s buckets", 60.0)
        risk = verdict_views.risk_view(store, parse_config({}, None), 1, None, T_END - 3600,
                                       T_END)
        # the generated history's stored verdict of device 1's process: the page shows it
        assert (risk["now"]["pid"], risk["now"]["level"]) == (1001, "ok")


def test_a_tiered_analysis_shows_the_alerts_the_live_agent_stored(tmp_path, monkeypatch):
    """The agent ran the engine over every raw sample (no engine runs on a page), so its
    stored alerts are the window's: one resolved before the window is left out, one resolved
    inside and one still open are shown. Without stored alerts (an imported store) the
    document says that none are stored."""
    monkeypatch.setattr(reader, "RAW_SAMPLE_LIMIT", 1000)
    with _store(tmp_path) as store:
        doc = views.report(store, None, 1, None, T_END - 3600, T_END)
        assert (doc["alerts_from"], doc["alerts"]) == ("none_stored", [])
        old = store.open_alert("memory_leak", "warning", T_END - 7200, device=1, host="h")
        store.resolve_alert(old, T_END - 3700)
        inside = store.open_alert("oom_risk", "warning", T_END - 3000, device=1, host="h")
        store.resolve_alert(inside, T_END - 1000)
        store.open_alert("oom_risk_critical", "critical", T_END - 600, device=1, host="h")
        store.open_alert("memory_leak", "warning", T_END - 600, device=2, host="h")  # not 1
        doc = views.report(store, None, 1, None, T_END - 3600, T_END)
        assert doc["alerts_from"] == "agent"
        assert doc["alerts"] == [
            {"rule": "oom_risk", "severity": "warning", "device": 1, "fired_ts": T_END - 3000,
             "resolved_ts": T_END - 1000},
            {"rule": "oom_risk_critical", "severity": "critical", "device": 1,
             "fired_ts": T_END - 600, "resolved_ts": None}]


def test_tier_widths_keep_a_window_within_its_buckets():
    assert [reader.width_for(s) for s in (900, 3600, 86_400, 126_000, 126_060, 7 * 86_400)] \
        == [60.0, 60.0, 60.0, 60.0, 120.0, 600.0]
    assert [reader.width_for(s, views.REPORT_BUCKETS) for s in (3600, 86_400, 7 * 86_400)] \
        == [60.0, 1200.0, 7200.0]
    # from two minutes on, whole two-minute rollup groups a bucket (grouped along the index)
    assert all(w % 120 == 0 for w in reader.WIDTHS_S if w >= 120)


# A scripted device: a sample every 15 s; each minute's first is idle at the floor, which
# rises LEAK a minute (or stays), the other three are busy 1 GiB above it.
MIN = 60.0
T0 = 1_700_000_040.0  # a minute boundary
GIB = 2**30


def _scripted(store: Store, minutes: int, leak: int) -> None:
    out = []
    for k in range(minutes * 4):
        m, idle = k // 4, k % 4 == 0
        floor = 20 * GIB + m * leak
        out.append(Sample(T0 + 15 * k, 0, Phase.IDLE if idle else Phase.DECODE, "torch", 1,
                          allocated_bytes=floor if idle else floor + GIB,
                          device_total_bytes=80 * GIB))
    store.write(out)


@pytest.mark.parametrize("leak", [2**24, 0])
def test_a_long_window_draws_the_rollups_and_shows_the_stored_verdict(tmp_path, leak):
    """Three hours of minutes, rolled up: the page draws the floor points the engine judged on
    and its answer is the engine's verdict as ``import`` stored it, the same slope to the
    bit."""
    from vramscope.agent.alerts.engine import AlertEngine
    from vramscope.agent.store import verdicts as stored

    minutes = 180
    end = T0 + minutes * MIN
    with Store.open(f"sqlite:///{tmp_path / 's.db'}", host_name="h") as store:
        _scripted(store, minutes, leak)
        engine = AlertEngine.from_config(None)
        engine.feed(store.samples(0, T0, end))
        rows = engine.verdicts.take()
        stored.write(store, rows)
        roll_up_all(store, T0, end)
        view = verdict_views.leaks_view(store, None, 0, None, T0, end)
    last = engine.verdicts.history[-1]  # the process's newest row (the device's come after)
    assert view["result"]["state"] == last.leak_state == ("leak" if leak else "no_leak")
    assert view["result"]["slope_bytes_per_s"] == last.leak_slope_bytes_per_s
    assert view["result"]["first_detected_ts_s"] == last.leak_first_detected_ts_s
    if leak:
        assert last.leak_slope_bytes_per_s == pytest.approx(leak / MIN)
    # the floor the detector judged on, as its rows carry it: each minute's idle sample; the
    # newest row (minute 176, a heartbeat after 171) carries the points up to it, the last
    # minutes' come with the next row
    assert [(v.ts_s - T0) / MIN for v in engine.verdicts.history][-2:] == [171.0, 176.0]
    floor = [[(T0 + MIN * m) * 1000, (20 * GIB + m * leak) / GIB] for m in range(176)]
    assert _floor(view) == floor
    assert view["limit_bytes"] == 80 * GIB


def _floor(view: dict) -> list[list[float]]:
    trace = view["figure"]["data"][0]
    return [[x, y] for x, y in zip(trace["x"], trace["y"])]


def test_phase_changes_are_found_in_sql_and_bounded(tmp_path):
    with Store.open(f"sqlite:///{tmp_path / 'p.db'}", host_name="h") as store:
        phases = [Phase.IDLE, Phase.IDLE, Phase.UNKNOWN, Phase.PREFILL, Phase.DECODE,
                  Phase.DECODE, Phase.IDLE]
        store.write([Sample(T0 + i, 0, p, "torch", 1, allocated_bytes=1)
                     for i, p in enumerate(phases)])
        assert phase_changes(store, 0, T0, T0 + 10, 10) == [
            (T0, "idle"), (T0 + 3, "prefill"), (T0 + 4, "decode"), (T0 + 6, "idle")]
        assert phase_changes(store, 0, T0 + 1, T0 + 5, 10) == [
            (T0 + 1, "idle"), (T0 + 3, "prefill"), (T0 + 4, "decode")]
        assert phase_changes(store, 0, T0, T0 + 10, 3) is None  # 4 changes > 3
        assert phase_changes(store, 5, T0, T0 + 10, 3) == []  # no such device


def test_capacity_peaks_cover_the_newest_day_only(tmp_path):
    """A peak two days old is not read: the peaks' work is a day of rollups per device,
    whatever the store's age, and ``first_ts_s`` says where the day began."""
    with Store.open(f"sqlite:///{tmp_path / 'c.db'}", host_name="h") as store:
        old, new = T0, T0 + 2 * 86_400
        store.write([Sample(old, 0, Phase.IDLE, "torch", 1, allocated_bytes=50 * GIB),
                     Sample(new - 10, 0, Phase.IDLE, "torch", 1, allocated_bytes=3 * GIB),
                     Sample(new, 0, Phase.IDLE, "torch", 1, allocated_bytes=2 * GIB)])
        peaks = queries.measured_peaks(store, 0, None)
    assert peaks is not None
    assert (peaks["allocated_bytes"], peaks["first_ts_s"], peaks["last_ts_s"]) == (
        3 * GIB, (new - 86_400) // 600 * 600, new)


def test_a_window_longer_than_the_tier_reads_is_a_bad_start():
    from vramscope.dashboard.errors import BadParameter

    with pytest.raises(reader.WindowTooLong) as too_long:
        reader.width_for(101 * 86_400, views.REPORT_BUCKETS)  # 100 one-day buckets at most
    err = views.window_param(too_long.value)
    assert isinstance(err, BadParameter) and err.parameter == "start"
    assert "8640000 s" in str(err)
