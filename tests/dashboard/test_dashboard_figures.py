"""The pure shaping functions (dashboard/timeline.py) and figures (dashboard/figures.py), on
literal inputs with exact expected outputs."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest
from vramscope.agent.records import Event, Holder, Phase, PostMortem
from vramscope.agent.store import phase_shares
from vramscope.dashboard import figures
from vramscope.dashboard import timeline as tl
from vramscope.dashboard.timeline_figure import build as timeline_figure

GIB = 2**30


def row(ts, **cols):
    out = {"ts_s": ts}
    for name in tl.TIMELINE_COLUMNS:
        lo, hi, last = cols.get(name, (None, None, None))
        out.update({f"{name}_min": lo, f"{name}_max": hi, f"{name}_last": last})
    return out


def test_series_skip_empty_buckets_and_keep_min_and_max():
    rows = [row(0.0, allocated_bytes=(1, 5, 4)), row(1.0), row(2.0, allocated_bytes=(2, 9, 9))]
    assert tl.series_from_rows(rows, ("allocated_bytes", "reserved_bytes")) == {
        "allocated_bytes": {"ts": [0.0, 2.0], "min": [1, 2], "max": [5, 9]}}


@pytest.mark.parametrize(("largest", "reserved", "allocated", "expected"), [
    (GIB, 10 * GIB, 6 * GIB, 0.75),  # 4 GiB free, largest hole 1 GiB
    (4 * GIB, 10 * GIB, 6 * GIB, 0.0),  # one hole holds all the free memory
    (GIB, 6 * GIB, 6 * GIB, None),  # nothing free: undefined
    (None, 10 * GIB, 6 * GIB, None),  # no snapshot in the bucket's last row
])
def test_external_fragmentation_from_the_last_row(largest, reserved, allocated, expected):
    r = row(0.0, largest_free_block_bytes=(largest, largest, largest),
            reserved_bytes=(reserved, reserved, reserved),
            allocated_bytes=(allocated, allocated, allocated))
    got = tl.derived_series([r]).get("external_fragmentation")
    assert (got["max"][0] if got else None) == expected


def test_inactive_split_ratio_is_split_over_reserved_per_bucket():
    r = row(5.0, inactive_split_bytes=(0, GIB, GIB), reserved_bytes=(GIB, 4 * GIB, 4 * GIB))
    assert tl.derived_series([r])["inactive_split_ratio"] == {"ts": [5.0], "max": [0.25]}


def test_retry_markers_where_the_counter_rose():
    series = {"num_alloc_retries": {"ts": [0, 1, 2, 3], "min": [3, 3, 3, 5],
                                    "max": [3, 3, 5, 7]}}
    assert tl.retry_markers(series) == [{"ts": 2, "count": 2}, {"ts": 3, "count": 2}]
    assert tl.retry_markers({}) == []


def test_bands_from_events_run_until_the_next_change():
    events = [Event(10.0, "phase", phase=Phase.PREFILL), Event(12.0, "phase", phase=Phase.DECODE),
              Event(20.0, "phase", phase=Phase.DECODE), Event(25.0, "phase", phase=Phase.IDLE)]
    assert phase_shares.bands_from_events(events, 30.0) == [
        {"phase": "prefill", "start": 10.0, "end": 12.0},
        {"phase": "decode", "start": 12.0, "end": 25.0},
        {"phase": "idle", "start": 25.0, "end": 30.0}]


def test_phase_shares_per_bucket_from_sample_counts():
    counts = {0: {"prefill": 1, "decode": 3}, 2: {"idle": 2, "decode": 2}}
    assert phase_shares.shares_from_counts(counts, 0.0, 30.0, 3) == {
        "ts": [0.0, 20.0], "prefill": [0.25, 0.0], "decode": [0.75, 0.5], "idle": [0.0, 0.5]}


def test_phase_shares_from_bands_keep_a_prefill_narrower_than_a_bucket():
    bands = [{"phase": "prefill", "start": 0.0, "end": 2.0},
             {"phase": "decode", "start": 2.0, "end": 22.0},
             {"phase": "idle", "start": 22.0, "end": 30.0},
             {"phase": "prefill", "start": 30.0, "end": 32.0},
             {"phase": "decode", "start": 32.0, "end": 60.0}]
    got = phase_shares.shares_from_bands(bands, 0.0, 60.0, 2)
    assert got["ts"] == [0.0, 30.0]
    assert got["prefill"] == pytest.approx([2 / 30, 2 / 30])
    assert got["decode"] == pytest.approx([20 / 30, 28 / 30])


def test_event_markers_keep_strings_as_strings_and_cap_messages():
    e = Event(1.0, "oom", 0, 7, None, None, {"message": "<b>" + "x" * 600})
    (m,) = tl.event_markers([e])
    assert m["message"].startswith("<b>xx") and len(m["message"]) == 500
    assert (m["ts"], m["name"], m["pid"], m["request_id"]) == (1.0, "oom", 7, None)


def timeline_doc():
    s = {"allocated_bytes": {"ts": [0.0, 1.0], "min": [GIB, GIB], "max": [GIB, 2 * GIB]},
         "device_total_bytes": {"ts": [0.0, 1.0], "min": [8 * GIB] * 2, "max": [8 * GIB] * 2},
         "kv_blocks_used": {"ts": [0.0], "min": [3], "max": [4]}}
    return {"start": 0.0, "end": 2.0, "series": s, "bucket_s": 1.0, "phase_source": "events",
            "events_truncated": False,
            "phases": [{"phase": "prefill", "start": 0.0, "end": 0.5},
                       {"phase": "idle", "start": 0.5, "end": 2.0}],
            "events": [{"ts": 0.0, "name": "request_start", "request_id": "r1", "message": None,
                        "pid": 1}, {"ts": 1.5, "name": "oom", "request_id": None,
                                    "message": "boom", "pid": 1}],
            "retries": [{"ts": 1.0, "count": 2}]}


def test_timeline_figure_traces_units_and_axes():
    fig = timeline_figure(timeline_doc())
    got = [(t["name"], t["yaxis"], len(t["x"])) for t in fig["data"]]
    assert got == [("prefill", "y", 5), ("allocated", "y", 2), ("limit", "y", 2),
                   ("KV blocks used", "y3", 2), ("request start", "y4", 1),
                   ("alloc retries", "y4", 1), ("OOM", "y4", 1)]
    assert fig["data"][1]["y"] == [1.0, 2.0]  # GiB, the bucket max
    # a counter is a step: its one bucket's peak, held to the bucket's end
    assert (fig["data"][3]["x"], fig["data"][3]["y"]) == ([0.0, 1000.0], [4, 4])
    assert fig["data"][1]["x"] == [0.0, 1000.0]  # epoch milliseconds on a date axis
    # the axis fits the data (1..2 GiB, padded by 8 % of the span), not 0..8 GiB
    assert fig["layout"]["yaxis"]["range"] == pytest.approx([0.92, 2.08])
    assert fig["data"][0]["y"] == pytest.approx([0, 8.4, 8.4, 0, None])  # bands reach the limit
    (buttons,) = fig["layout"]["updatemenus"]
    assert [(b["label"], b["args"][0]["yaxis.range"]) for b in buttons["buttons"]] == [
        ("Fit the data", pytest.approx([0.92, 2.08])), ("0 to the limit", [0, pytest.approx(8.4)])]
    assert fig["layout"]["xaxis"]["range"] == [0.0, 2000.0]
    # times of day up to 12 h a tick, dates beyond; the date itself in the axis title
    assert [f["value"] for f in fig["layout"]["xaxis"]["tickformatstops"]] == ["%H:%M", "%b %d"]
    assert fig["layout"]["xaxis"]["title"]["text"] == "time (UTC), 1970-01-01"
    assert fig["layout"]["yaxis4"]["categoryarray"] == ["request start", "alloc retries", "OOM"]
    assert fig["data"][-2]["text"] == ["+2 retries"]
    assert "yaxis2" not in fig["layout"] and "yaxis6" not in fig["layout"]  # no empty lanes
    go.Figure(fig)  # Plotly itself accepts every property


def test_timeline_figure_keeps_a_near_limit_in_view_and_shows_the_floor_growth():
    doc = timeline_doc()
    ts = [i * 60.0 for i in range(5)]
    doc["series"] = {
        "allocated_bytes": {"ts": ts, "min": [6 * GIB + i * GIB // 4 for i in range(5)],
                            "max": [7 * GIB] * 5},
        "device_total_bytes": {"ts": ts, "min": [8 * GIB] * 5, "max": [8 * GIB] * 5}}
    doc["bucket_s"], doc["end"] = 60.0, 300.0
    # the floor the leak detector judged on, as its stored rows carry it (not the series'
    # minima: those stand 1 GiB above it here)
    doc["floor"] = {"pid": 7, "process": "vllm (pid 7)",
                    "points": [[t + 30.0, 5 * GIB + i * GIB // 4] for i, t in enumerate(ts)]}
    doc["phase_shares"] = {"ts": [0.0, 150.0], "prefill": [0.1, 0.2], "decode": [0.9, 0.8]}
    fig = timeline_figure(doc, fragmentation_warning_ratio=0.5)
    low, high = fig["layout"]["yaxis"]["range"]
    # limit within 1.25x: in range; the floor under allocated too (5 GiB, padded by 8 % of
    # the 3 GiB span)
    assert high == pytest.approx(8.24) and low == pytest.approx(5.0 - 0.24)
    buttons = fig["layout"]["updatemenus"][0]["buttons"]
    assert buttons[1]["args"][0]["yaxis.range"] == [0, pytest.approx(8.24 * 1.05)]
    floor = next(t for t in fig["data"] if t["name"] == "idle floor (the leak detector's)")
    assert floor["y"] == [5.0, 5.25, 5.5, 5.75, 6.0]
    assert floor["x"] == [30_000.0, 90_000.0, 150_000.0, 210_000.0, 270_000.0]
    assert fig["layout"]["annotations"][0]["text"] == "idle floor +1.00 GiB over this window"
    shares = [(t["name"], t["type"], t["yaxis"]) for t in fig["data"] if t["yaxis"] == "y6"]
    assert shares == [("prefill share", "bar", "y6"), ("decode share", "bar", "y6")]
    assert fig["layout"]["barmode"] == "stack"
    go.Figure(fig)


def test_fragmentation_is_drawn_with_its_warning_setting_and_what_it_means():
    doc = timeline_doc()
    doc["series"]["external_fragmentation"] = {"ts": [0.0], "max": [0.9]}
    fig = timeline_figure(doc, fragmentation_warning_ratio=0.5)
    (line,) = fig["layout"]["shapes"]
    assert (line["yref"], line["y0"], line["y1"]) == ("y2", 0.5, 0.5)
    note = fig["layout"]["annotations"][-1]["text"]
    assert note.startswith("external fragmentation: the share of cached free memory outside "
                           "the largest free block.<br>A risk only when the largest request "
                           "fits neither")
    ext = next(t for t in fig["data"] if t["name"] == "external fragmentation")
    assert ext["line"]["color"] == "#6e7781"  # neutral: a high value alone is not an alarm
    go.Figure(fig)


def test_overview_figure_has_one_bar_group_per_device():
    rows = [{"host": "h", "device": 0, "latest": {"allocated_bytes": 2 * GIB,
                                                 "reserved_bytes": 3 * GIB,
                                                 "device_used_bytes": 4 * GIB,
                                                 "device_total_bytes": 80 * GIB}},
            {"host": "h", "device": 1, "latest": None}]
    fig = figures.overview_figure(rows)
    assert [(t["name"], t["x"]) for t in fig["data"]] == [
        ("allocated", [2.0, None]), ("reserved", [3.0, None]), ("device used", [4.0, None]),
        ("limit", [80.0, None])]
    assert fig["data"][0]["y"] == ["h · GPU 0", "h · GPU 1"]
    go.Figure(fig)


def test_leaks_and_risk_figures_are_valid_plotly():
    leaks = figures.leaks_figure([(0.0, GIB), (60.0, 2 * GIB)], [[0.0, GIB], [60.0, 2 * GIB]],
                                 80 * GIB)
    assert [t["name"] for t in leaks["data"]] == ["idle floor", "trend (Theil–Sen)"]
    go.Figure(leaks)
    risk = figures.risk_figure({"ts": [0.0, 1.0], "bytes": [GIB, GIB // 2]},
                               {"ts": [0.0], "time_to_oom_s": [7200.0], "low_s": [3600.0],
                                "high_s": [10800.0]},
                               [{"ts": 1.0, "severity": "warning", "label": "x"}], 10 * GIB,
                               {"warning": 0.1, "critical": 0.03})
    assert [t["name"] for t in risk["data"]] == ["headroom", "forecast soonest",
                                                "forecast latest", "time to OOM",
                                                "warning fired"]
    assert risk["data"][3]["y"] == [2.0]  # hours
    assert [s["y0"] for s in risk["layout"]["shapes"]] == pytest.approx([1.0, 0.3])
    go.Figure(risk)


def test_postmortem_figures_read_hook_or_torch_segments():
    pm = PostMortem(0.0, 0, 1, Phase.PREFILL, None, None, None, None, None, None, None,
                    top_holders=(Holder(3 * 2**20, ("a.py:1:f",)), Holder(2**20)),
                    segments=({"total_size_bytes": 20 * 2**20, "allocated_bytes": 5 * 2**20,
                               "largest_free_block_bytes": 10 * 2**20},
                              {"total_size": 2 * 2**20, "allocated_size": 2**20}))
    seg = figures.segment_map_figure(pm)
    assert [(t["name"], t["x"]) for t in seg["data"]] == [
        ("allocated", [5.0, 1.0]), ("largest hole", [10.0, 0.0]), ("other free", [5.0, 1.0])]
    holders = figures.holders_figure(pm)
    assert holders["data"][0]["y"] == ["#1 a.py:1:f", "#2 (no stack)"]
    assert holders["data"][0]["x"] == [3.0, 1.0]
    go.Figure(seg)
    go.Figure(holders)


def test_token_occupancy_from_the_last_kv_reading():
    rows = [row(0.0, kv_tokens_used=(0, 900, 700), kv_blocks_used=(0, 60, 50)),
            row(1.0, kv_tokens_used=(0, 0, 0), kv_blocks_used=(0, 0, 0)),  # empty pool: none
            row(2.0)]
    assert tl.derived_series(rows)["kv_tokens_per_block"] == {"ts": [0.0], "max": [14.0]}


def test_the_request_rate_lane_stands_in_where_the_markers_cannot():
    rate = {"bucket_s": 60.0, "ts": [0.0, 60.0], "per_min": [3.0, 0.0]}
    shown = timeline_doc() | {"request_rate": rate}  # a request marker in the window
    assert "requests / min" not in [t["name"] for t in timeline_figure(shown)["data"]]
    busy = shown | {"events_truncated": True, "events": []}  # too many to draw
    old = shown | {"events": []}  # retention deleted the window's request events
    quiet = old | {"request_rate": rate | {"per_min": [0.0, 0.0]}}
    for doc in (busy, old):
        fig = timeline_figure(doc)
        (lane,) = [t for t in fig["data"] if t["name"] == "requests / min"]
        assert (lane["x"], lane["y"], lane["yaxis"]) == ([0.0, 60_000.0], [3.0, 0.0], "y7")
        assert fig["layout"]["yaxis7"]["domain"][1] < fig["layout"]["yaxis"]["domain"][0]
    assert "yaxis7" not in timeline_figure(quiet)["layout"]


def test_the_floor_note_leaves_the_model_load_out():
    """An imported recording opens before the weights are in (issue 34 item 5): the floor note
    counts the growth after the load (the first floor of at least half the last), not the load:
    +63 MiB of leak, not +442 MiB."""
    from vramscope.dashboard.timeline_figure import _floor_note

    mib = 2**20
    loading = {"ts": [0.0, 60.0, 120.0, 180.0], "min": [0, 379 * mib, 400 * mib, 442 * mib]}
    assert _floor_note(loading)[0]["text"] == "idle floor +63 MiB after the model load"
    settled = {"ts": [0.0, 60.0], "min": [400 * mib, 442 * mib]}
    assert _floor_note(settled)[0]["text"] == "idle floor +42 MiB over this window"


def test_an_empty_leak_chart_spans_its_window_not_the_year_2000():
    """Nothing to draw (no allocated memory, no stored floor): the time axis is the window's,
    where Plotly's empty date axis opens on 1 January 2000."""
    start, end = 1_800_000_000.0, 1_800_003_600.0
    fig = figures.leaks_figure([], None, None, (start, end))
    assert fig["layout"]["xaxis"]["range"] == [start * 1000, end * 1000]
    drawn = figures.leaks_figure([(start + 60, 2**30)], None, None, (start, end))
    assert "range" not in drawn["layout"]["xaxis"]  # a floor sets its own range
    go.Figure(fig)


def test_a_process_exit_is_a_marker_and_an_unknown_name_none():
    """``process_exit`` is one of the timeline's rare events (agent.store.reader.RARE_EVENTS):
    its marker says which process exited; a name the figure has no marker for is left out,
    not a KeyError that takes the page down."""
    doc = timeline_doc()
    doc["events"] += [{"ts": 1.8, "name": "process_exit", "request_id": None, "message": None,
                       "pid": 7},
                      {"ts": 1.9, "name": "a_future_event", "request_id": None,
                       "message": None, "pid": 7}]
    fig = timeline_figure(doc)
    (exit_marker,) = [t for t in fig["data"] if t["name"] == "process exit"]
    assert (exit_marker["x"], exit_marker["text"], exit_marker["yaxis"]) == (
        [1800.0], ["pid 7 exited"], "y4")
    assert fig["layout"]["yaxis4"]["categoryarray"] == [
        "request start", "alloc retries", "process exit", "OOM"]
    assert "a_future_event" not in str(fig["data"])
    go.Figure(fig)
