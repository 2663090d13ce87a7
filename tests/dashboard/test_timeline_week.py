"""The timeline over a week: ten-minute buckets on the grid the rollups are indexed by, each
bucket's min / max / last exactly those of the samples in it; OOM markers and phase bands
found by name among thousands of request events; the figure route on the same document."""

from __future__ import annotations

import math

from vramscope.agent.records import Event, Phase, Sample
from vramscope.agent.store import Store
from vramscope.agent.store.maintenance import rollup_window
from vramscope.dashboard.app import create_app

T0 = 1_700_000_400.0  # a ten-minute boundary
WEEK = 7 * 86_400.0
STEP = 60.0  # one sample a minute: 10,081 a week, rolled up but for the newest hour


def _allocated(i: int) -> int:
    return 1_000_000 + (i * 7919) % 100_000 + 10 * i  # wavy, slowly rising


def _history() -> tuple[list[Sample], list[Event]]:
    n = int(WEEK / STEP) + 1
    samples = [Sample(T0 + 30 + i * STEP, 1, Phase.DECODE, "torch", 42,
                      allocated_bytes=_allocated(i), reserved_bytes=2_000_000 + i)
               for i in range(n)]
    events = [Event(T0 + 10 + j * 150, name, 1, 42, None, f"r{j}")
              for j in range(int(WEEK / 150)) for name in ("request_start", "request_end")]
    events += [Event(T0 + 3 * 86_400 + 5, "oom", 1, 42, None, None, {"message": "OOM"}),
               Event(T0 + 86_400, "phase", 1, 42, Phase.PREFILL),
               Event(T0 + 86_400 + 20, "phase", 1, 42, Phase.DECODE)]
    return samples, events


def _store(tmp_path) -> tuple[Store, list[Sample]]:
    store = Store.open(f"sqlite:///{tmp_path / 'week.db'}", host_name="h")
    samples, events = _history()
    store.write(samples, events)
    rollup_window(store, T0, T0 + WEEK - 3600)
    return store, samples


def _expected(samples: list[Sample], start: float, end: float, grid_start: float,
              width: float, count: int) -> dict[str, list[float]]:
    """allocated_bytes per bucket, straight from the samples written."""
    buckets: dict[int, list[int]] = {}
    for s in samples:
        if start <= s.ts_s <= end:
            k = min(int((s.ts_s - grid_start) // width), count - 1)
            buckets.setdefault(k, []).append(s.allocated_bytes or 0)
    ks = sorted(buckets)
    return {"ts": [grid_start + k * width for k in ks], "min": [min(buckets[k]) for k in ks],
            "max": [max(buckets[k]) for k in ks]}


def test_a_week_is_drawn_in_ten_minute_buckets_exact_to_the_samples(tmp_path):
    store, samples = _store(tmp_path)
    start, end = T0 + 17, T0 + 17 + WEEK  # a window that starts off the grid
    client = create_app(None, store).test_client()
    doc = client.get(f"/api/v1/timeline?device=1&start={start!r}&end={end!r}").get_json()
    assert doc["bucket_s"] == 600.0 and doc["max_points"] == 2000
    count = math.ceil((end - T0) / 600)
    assert count == 1009
    allocated = doc["series"]["allocated_bytes"]
    assert allocated == _expected(samples, start, end, T0, 600.0, count)
    # the last bucket holds the window's last 17 s, no sample
    assert len(allocated["ts"]) == 1008 and all(t % 600 == 0 for t in allocated["ts"])
    assert doc["series"]["reserved_bytes"]["max"][:2] == [2_000_009, 2_000_019]
    # the OOM among 8,064 request events (too many to draw: truncated), phases from events
    assert [(e["name"], e["ts"]) for e in doc["events"]] == [("oom", T0 + 3 * 86_400 + 5)]
    assert doc["events_truncated"] is True
    assert doc["phase_source"] == "events"
    assert doc["phases"] == [
        {"phase": "prefill", "start": T0 + 86_400, "end": T0 + 86_400 + 20},
        {"phase": "decode", "start": T0 + 86_400 + 20, "end": end}]
    # requests started per minute on the same grid: 4 starts in every ten minutes (one every
    # 150 s), none in the bucket of the window's last 17 s; the counts retention made of the
    # rolled-up minutes, the raw events of the newest hour
    rate = doc["request_rate"]
    assert (rate["bucket_s"], rate["ts"][:2]) == (600.0, [T0, T0 + 600])
    assert rate["per_min"] == [0.4] * 1008 + [0.0]
    figure = client.get(f"/api/v1/figures/timeline?device=1&start={start!r}&end={end!r}")
    assert figure.status_code == 200
    fig = figure.get_json()
    assert fig["layout"]["meta"]["bucket_s"] == 600.0
    # the markers cannot show 8,064 requests: the rate's lane does
    (lane,) = [t for t in fig["data"] if t["name"] == "requests / min"]
    assert (lane["yaxis"], lane["y"][:3], lane["width"]) == ("y7", [0.4] * 3, 600_000.0)
    assert fig["layout"]["yaxis7"]["title"]["text"] == "requests/min"
    # retention deletes the request events older than a day: the rate stays
    with store.engine.begin() as c:
        c.exec_driver_sql(f"DELETE FROM events WHERE name LIKE 'request_%' "
                          f"AND ts_s < {T0 + WEEK - 86_400!r}")
    again = client.get(f"/api/v1/timeline?device=1&start={start!r}&end={end!r}").get_json()
    assert again["request_rate"] == rate
    store.close()


def test_a_day_keeps_the_grid_it_asked_for(tmp_path):
    store, _ = _store(tmp_path)
    start, end = T0 + WEEK - 86_400 - 17, T0 + WEEK - 17  # 43.2 s buckets: not a tier
    doc = create_app(None, store).test_client().get(
        f"/api/v1/timeline?device=1&start={start!r}&end={end!r}").get_json()
    assert doc["bucket_s"] == 43.2
    ts = doc["series"]["allocated_bytes"]["ts"]
    assert ts[0] >= start and len(ts) == 1440  # one a minute: the other buckets are empty
    assert all(abs((t - start) / 43.2 - round((t - start) / 43.2)) < 1e-6 for t in ts)
    store.close()


def test_the_analysis_views_of_a_week_read_the_ten_minute_groups(tmp_path):
    """The risk page asks for 2,000 buckets (302 s over a week), the Leaks page for at most
    2,100 of a tier width, the analysis document for 100: each is read on whole ten-minute
    groups (ten minutes, two hours), from the ``rollups_10m`` table along its key rather than
    the week's minutes grouped (SQLite sorted them for a computed bucket); the buckets' maxima
    and minima are the samples'."""
    from vramscope.agent.config import parse_config
    from vramscope.dashboard import verdict_views, views

    from tests.support.sql_watch import statements_sent

    store, samples = _store(tmp_path)
    start, end = T0 + 17, T0 + 17 + WEEK

    def tables(sent: list[tuple[str, object]]) -> list[str]:
        return [" ".join(q.split()).split(" FROM ")[1].split()[0] for q, _ in sent]

    reads = (lambda q: "min_value" in q)
    with statements_sent(store.engine, reads) as sent:
        risk = verdict_views.risk_view(store, parse_config({}, None), 1, None, start, end)
    # the first partial group's minutes, the week's groups; the newest hour is raw samples
    assert tables(sent) == ["rollups", "rollups_10m"]
    assert not any("GROUP BY" in q for q, _ in sent)
    assert risk["limit_bytes"] is None  # no device total in this history
    # ten-minute buckets from T0 (the window's start floored): the samples' extremes
    rows = store.timeline(1, start, end, 1, ("allocated_bytes",), width_s=600.0, lasts=False)
    expected = _expected(samples, start, end, T0, 600.0, math.ceil((end - T0) / 600))
    assert [r["ts_s"] for r in rows] == expected["ts"]
    assert [r["allocated_bytes_max"] for r in rows] == expected["max"]
    assert [r["allocated_bytes_min"] for r in rows] == expected["min"]
    with statements_sent(store.engine, reads) as sent:
        leaks = verdict_views.leaks_view(store, None, 1, None, start, end)
    assert "rollups_10m" in tables(sent)  # the limit line's read
    # the floor drawn is the one the engine judged on, carried by stored verdicts: this
    # history has none, so none is drawn (never one made here from the groups)
    assert leaks["floor_points"] == 0 and leaks["figure"]["data"][0]["y"] == []
    with statements_sent(store.engine, reads) as sent:
        doc = views.report(store, None, 1, None, start, end)
    assert (doc["tier"], doc["bucket_s"]) == ("per-minute rollups, 7.2e+03 s buckets", 7200.0)
    assert tables(sent) == ["rollups", "rollups_10m"]
    store.close()


def test_capacity_peaks_of_the_newest_day_read_its_ten_minute_groups(tmp_path):
    from vramscope.dashboard import queries

    from tests.support.sql_watch import statements_sent

    store, samples = _store(tmp_path)
    newest = samples[-1].ts_s
    with statements_sent(store.engine, lambda q: "min_value" in q) as sent:
        peaks = queries.measured_peaks(store, 1, None)
    # the day from the ten-minute boundary at or before its start
    first = (newest - 86_400) // 600 * 600
    assert peaks is not None and peaks["first_ts_s"] == first
    day = [s for s in samples if s.ts_s >= first]
    assert peaks["allocated_bytes"] == max(s.allocated_bytes or 0 for s in day)
    assert peaks["reserved_bytes"] == max(s.reserved_bytes or 0 for s in day)
    # the day's groups, no partial group at its start; its newest hour is raw samples
    assert [" ".join(q.split()).split(" FROM ")[1].split()[0] for q, _ in sent] == [
        "rollups_10m"]
    store.close()
