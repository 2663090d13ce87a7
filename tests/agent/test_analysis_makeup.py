"""A leak's make-up: scripted allocator snapshots -> memory_layout events -> the diff, exactly.

The snapshots are the segment dicts ``torch.cuda.memory_snapshot()`` returns (the ``Segment`` /
``Block`` TypedDicts), written by hand, so every number below follows from them.
"""

from __future__ import annotations

import json

import pytest
from vramscope.agent.analysis.makeup import (
    CUBLAS_DIAGNOSIS,
    CUBLAS_REMEDY,
    GrowthRow,
    diff_layouts,
    layout_from_event,
    leak_makeup,
    pick_layouts,
)
from vramscope.agent.records import Event, Phase, Sample
from vramscope.hooks.idle_layout import (
    LAYOUT_EVENT,
    MAX_GROUPS,
    cublas_workspace_bytes,
    layout_summary,
)

MIB = 2**20
WS = 32 * MIB  # the cuBLAS workspace on Hopper
STEP = 32 * MIB // 6  # a floor rising 32 MiB a minute, sampled every 10 s
MAIN = 7  # the default stream's handle


def seg(size, stream, *blocks, device=0):
    """A segment of ``size`` on ``stream``; blocks are (size, state) or (size, state, extra)."""
    out = []
    for b in blocks:
        block = {"size": b[0], "requested_size": b[0], "state": b[1]}
        if len(b) > 2:
            block.update(b[2])
        out.append(block)
    return {"device": device, "address": 0, "total_size": size, "stream": stream,
            "segment_type": "large", "blocks": out}


def base_segments():
    """Weights (two 8 MiB tensors in a 20 MiB segment) and the default stream's workspace."""
    return [seg(20 * MIB, MAIN, (8 * MIB, "active_allocated"), (8 * MIB, "active_allocated"),
                (4 * MIB, "inactive")),
            seg(WS, MAIN, (WS, "active_allocated"))]


def after_calls(n, first_stream=101):
    """``n`` generate_batch calls later: one workspace segment per call's new stream, and the
    last call's freed 64 MiB of activations still cached on its stream."""
    segs = base_segments()
    for i in range(n):
        segs.append(seg(WS, first_stream + i, (WS, "active_allocated")))
    segs.append(seg(64 * MIB, first_stream + n - 1, (64 * MIB, "inactive")))
    return segs


def event(ts, segments, workspace=None, device=0):
    data = layout_summary(segments, device, workspace_bytes=workspace)
    json.dumps(data)  # what the sink ships must be JSON
    return Event(ts, LAYOUT_EVENT, device, 1, Phase.IDLE, None, data)


def test_the_summary_groups_segments_and_live_blocks():
    data = layout_summary(after_calls(2) + [seg(2 * MIB, 5, (MIB, "active_allocated"),
                                                device=1)], 0)
    assert data == {
        "segments": 5, "reserved_bytes": (20 + 32 * 3 + 64) * MIB,
        "allocated_bytes": (16 + 32 * 3) * MIB,
        # [segment size, stream, count, allocated bytes], heaviest first
        "segment_groups": [[64 * MIB, 102, 1, 0], [WS, MAIN, 1, WS], [WS, 101, 1, WS],
                           [WS, 102, 1, WS], [20 * MIB, MAIN, 1, 16 * MIB]],
        # [block size, stream, count, phase, stack]
        "block_groups": [[WS, MAIN, 1, None, None], [WS, 101, 1, None, None],
                         [WS, 102, 1, None, None], [8 * MIB, MAIN, 2, None, None]],
        "stacks": [], "dropped_groups": 0, "dropped_bytes": 0, "cublas_workspace_bytes": None}


def test_cublas_workspace_per_new_stream_is_named_with_its_remedy():
    before, after = event(100.0, after_calls(1)), event(160.0, after_calls(4))
    m = diff_layouts(layout_from_event(before), layout_from_event(after))
    # calls 2, 3 and 4 each left a workspace on their new stream (102, 103, 104); the freed
    # activations moved from stream 101's cache to stream 104's
    assert m.blocks == (GrowthRow("blocks", WS, 3, 3 * WS, 3, 3),)
    assert m.segments == (GrowthRow("segments", WS, 3, 3 * WS, 3, 3),
                          GrowthRow("segments", 64 * MIB, 1, 64 * MIB, 1, 1))
    assert (m.allocated_growth_bytes, m.reserved_growth_bytes, m.new_bytes) == (
        3 * WS, 3 * WS, 3 * WS)
    assert (m.diagnosis, m.remedy) == (CUBLAS_DIAGNOSIS, CUBLAS_REMEDY)
    assert m.summary == ("allocated +96.0 MiB, reserved +96.0 MiB between the idle points at "
                         "1970-01-01T00:01:40.000Z and 1970-01-01T00:02:40.000Z: 3 new blocks of "
                         "32 MiB, one per new stream; "
                         "3 new segments of 32 MiB, one per new stream")
    assert not m.incomplete


def test_the_same_growth_on_one_stream_is_not_the_workspace():
    """Three 32 MiB tensors kept on the default stream: a tensor leak, not cuBLAS."""
    later = base_segments() + [seg(WS, MAIN, (WS, "active_allocated")) for _ in range(3)]
    m = diff_layouts(layout_from_event(event(1.0, base_segments())),
                     layout_from_event(event(2.0, later)))
    assert m.blocks == (GrowthRow("blocks", WS, 3, 3 * WS, 1, 0),)
    assert m.diagnosis is None and m.remedy is None
    assert m.summary.endswith("3 new blocks of 32 MiB on one stream; "
                              "3 new segments of 32 MiB on one stream")


def test_the_workspace_size_comes_from_cublas_workspace_config():
    assert cublas_workspace_bytes(":4096:8") == 32 * MIB
    assert cublas_workspace_bytes(":4096:2:16:8") == 8 * MIB + 128 * 1024
    assert cublas_workspace_bytes(":16:8") == 128 * 1024
    assert cublas_workspace_bytes("") is None and cublas_workspace_bytes("4096") is None
    four = 4 * MIB
    before = [seg(20 * MIB, MAIN, (four, "active_allocated"))]
    after = before + [seg(20 * MIB, s, (four, "active_allocated")) for s in (11, 12)]
    diff = [diff_layouts(layout_from_event(event(1.0, before, ws)),
                         layout_from_event(event(2.0, after, ws))) for ws in (None, four)]
    assert [m.diagnosis for m in diff] == [None, CUBLAS_DIAGNOSIS]  # 4 MiB only when configured
    assert diff[1].blocks[0] == GrowthRow("blocks", four, 2, 2 * four, 2, 2)
    assert diff[1].segments == (GrowthRow("segments", 20 * MIB, 2, 40 * MIB, 2, 2),)


def test_blocks_are_grouped_by_phase_and_stack_where_history_was_on():
    frames = [{"filename": "/srv/app/cache.py", "line": 42, "name": "remember"},
              {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/module.py",
               "line": 1, "name": "_call_impl"}]
    stamped = {"frames": frames, "user_metadata": "vramscope.phase=decode"}
    before = [seg(20 * MIB, MAIN, (MIB, "active_allocated"))]
    after = [seg(20 * MIB, MAIN, (MIB, "active_allocated"), (2 * MIB, "active_allocated",
                                                              stamped),
                 (2 * MIB, "active_allocated", stamped), (3 * MIB, "active_allocated"))]
    data = layout_summary(after)
    assert data["stacks"] == [["/srv/app/cache.py:42:remember"]]
    assert data["block_groups"] == [[2 * MIB, MAIN, 2, "decode", 0], [3 * MIB, MAIN, 1, None, None],
                                    [MIB, MAIN, 1, None, None]]
    m = diff_layouts(layout_from_event(event(1.0, before)), layout_from_event(event(2.0, after)))
    assert m.blocks == (
        GrowthRow("blocks", 2 * MIB, 2, 4 * MIB, 1, 0, "decode",
                  ("/srv/app/cache.py:42:remember",)),
        GrowthRow("blocks", 3 * MIB, 1, 3 * MIB, 1, 0))


def test_groups_past_the_bound_are_counted_not_shipped():
    segs = [seg(2 * MIB, 1000 + i, (MIB, "active_allocated")) for i in range(MAX_GROUPS + 3)]
    data = layout_summary(segs)
    assert len(data["segment_groups"]) == len(data["block_groups"]) == MAX_GROUPS
    assert (data["dropped_groups"], data["dropped_bytes"]) == (6, 3 * MIB)
    assert len(json.dumps(data)) < 64_000
    assert layout_from_event(Event(1.0, LAYOUT_EVENT, data=data)).dropped_groups == 6


def test_the_worst_layout_still_passes_the_ingest_and_trace_import_limits():
    """Hundreds of streams with 15-digit handles, long frames, many stacks: under 64 KiB, the
    event-data limit of the ingest and of trace import (over it a client's batch is refused)."""
    from vramscope.agent.trace import MAX_DATA_BYTES, event_to_json, record_from_json

    def frames(i):
        return [{"filename": f"/srv/{'deep/' * 60}module_{i}.py", "line": 10_000 + i,
                 "name": f"function_number_{i}"}] * 6

    segs = [seg(2 * MIB * (1 + i % 7), 140_000_000_000_000 + i,
                (MIB + 512 * i, "active_allocated",
                 {"frames": frames(i), "user_metadata": "vramscope.phase=prefill"}),
                (MIB + 512 * i + 1, "active_allocated", {"frames": frames(i + 1000)}))
            for i in range(700)]
    e = event(1.0, segs, workspace=32 * MIB)
    size = len(json.dumps(e.data, separators=(",", ":")))
    assert size <= 56_000 < MAX_DATA_BYTES
    assert len(e.data["stacks"]) == 32 and len(e.data["block_groups"]) == 256
    assert e.data["dropped_groups"] == (700 - 256) + (1400 - 256)
    back = record_from_json(event_to_json(e))  # the strict import path takes it
    assert layout_from_event(back).dropped_groups == e.data["dropped_groups"]


def test_a_layout_over_the_size_bound_sheds_stacks_then_groups(monkeypatch):
    from vramscope.hooks import idle_layout

    monkeypatch.setattr(idle_layout, "MAX_EVENT_BYTES", 3_000)
    frames = [{"filename": "/srv/app.py", "line": 1, "name": "f" * 100}]
    segs = [seg(2 * MIB, 100 + i, (MIB, "active_allocated", {"frames": frames})) for i in range(80)]
    data = layout_summary(segs)
    assert len(json.dumps(data, separators=(",", ":"))) <= 3_000
    assert data["stacks"] == [] and {g[4] for g in data["block_groups"]} == {None}
    kept = len(data["block_groups"])
    assert kept < 80 and data["dropped_bytes"] == (80 - kept) * MIB
    assert data["dropped_groups"] == (80 - kept) + (80 - len(data["segment_groups"]))


def test_pick_layouts_takes_the_last_before_the_rise_and_the_latest():
    layouts = [layout_from_event(event(float(t), base_segments())) for t in (10, 20, 30, 40)]
    assert [x.ts_s for x in pick_layouts(layouts)] == [10.0, 40.0]
    assert [x.ts_s for x in pick_layouts(layouts, start_ts_s=25.0)] == [20.0, 40.0]
    assert [x.ts_s for x in pick_layouts(layouts, start_ts_s=5.0)] == [10.0, 40.0]
    assert pick_layouts(layouts[:1]) is None


def test_leak_makeup_reads_the_device_events_and_reports_bad_ones():
    events = [event(1.0, after_calls(1)), event(2.0, after_calls(3)),
              event(1.5, after_calls(9), device=1),
              Event(1.7, LAYOUT_EVENT, 0, data={"block_groups": [[1, 2, 3]]}),
              Event(1.8, "phase", 0, phase=Phase.IDLE)]
    doc = leak_makeup(events, device=0)
    assert doc["blocks"][0] == {"size_bytes": WS, "count": 2, "bytes": 2 * WS, "streams": 2,
                                "new_streams": 2, "phase": None, "stack": [],
                                "description": "2 new blocks of 32 MiB, one per new stream"}
    assert doc["diagnosis"] == CUBLAS_DIAGNOSIS and doc["layouts"] == 2
    assert doc["skipped"] == ["memory_layout event at ts 1.7: block_groups[0] must be a list of "
                              "5, got [1, 2, 3]"]
    assert leak_makeup(events[:1], device=0) is None


@pytest.mark.parametrize("data, message", [
    ({"segment_groups": [[1, 2, 3, -4]]}, "segment_groups[0]: expected an integer >= 0, got -4"),
    ({"block_groups": [[1, 2, 3, None, 0]]}, "stack 0 is not an index into stacks"),
    ({"block_groups": [[1, 2, 3, 5, None]]}, "phase must be a string or null, got 5"),
    ({"stacks": "x"}, "stacks must be a list, got 'x'"),
])
def test_malformed_layouts_name_the_key_and_the_event(data, message):
    with pytest.raises(ValueError, match="memory_layout event at ts 3.0") as err:
        layout_from_event(Event(3.0, LAYOUT_EVENT, data=data))
    assert message in str(err.value)


def test_analyze_adds_the_makeup_on_demand_and_to_a_detected_leak():
    from vramscope.agent.alerts.offline import analyze_records

    samples = [Sample(float(t), 0, Phase.IDLE, "torch", allocated_bytes=STEP * t // 10,
                      device_total_bytes=80 * 2**30) for t in range(0, 3600, 10)]
    layouts = [event(100.0, after_calls(1)), event(3500.0, after_calls(5))]
    plain = analyze_records(samples, layouts)["devices"]["0"]["leak"]
    config = {"alerts.leak_warmup_s": 0.0, "alerts.leak_floor_window_s": 60.0}
    leak = analyze_records(samples, layouts, config)["devices"]["0"]["leak"]
    assert leak["detected"] and leak["makeup"]["diagnosis"] == CUBLAS_DIAGNOSIS
    assert leak["makeup"]["blocks"][0]["count"] == 4
    assert plain["detected"] is (plain["makeup"] is not None)
    flat = [s._replace(allocated_bytes=MIB) for s in samples]
    assert analyze_records(flat, layouts)["devices"]["0"]["leak"]["makeup"] is None
    on_demand = analyze_records(flat, layouts, makeup=True)["devices"]["0"]["leak"]
    assert not on_demand["detected"] and on_demand["makeup"]["new_bytes"] == 4 * WS


def test_cli_analyze_makeup_prints_the_table(tmp_path, capsys, monkeypatch):
    from vramscope.agent.cli import main
    from vramscope.agent.trace import write_trace

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "t.jsonl"
    samples = [Sample(float(t), 0, Phase.IDLE, "torch", allocated_bytes=MIB) for t in range(5)]
    with open(path, "w") as fh:
        write_trace(fh, samples, [event(1.0, after_calls(1)), event(4.0, after_calls(3))])
    assert main(["analyze", str(path), "--makeup"]) == 0
    out = capsys.readouterr().out
    assert ("  make-up: allocated +64.0 MiB, reserved +64.0 MiB between the idle points at "
            "1970-01-01T00:00:01.000Z and 1970-01-01T00:00:04.000Z: 2 new blocks of 32 MiB, "
            "one per new stream; 2 new segments of "
            "32 MiB, one per new stream") in out
    assert "          64.0 MiB  2 new blocks of 32 MiB, one per new stream" in out
    assert f"  diagnosis: {CUBLAS_DIAGNOSIS}\n    - {CUBLAS_REMEDY}" in out
    with open(path, "w") as fh:
        write_trace(fh, samples, [event(1.0, after_calls(1))])
    assert main(["analyze", str(path), "--makeup"]) == 0
    assert "device 0: no make-up: the recording has fewer than two memory_layout events" in \
        capsys.readouterr().out
