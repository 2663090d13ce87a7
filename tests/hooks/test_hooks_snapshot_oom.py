"""Fragmentation and OOM post-mortems from recorded snapshot dicts (no CUDA needed)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.records import Phase, PostMortem
from vramscope.hooks import phase as ph
from vramscope.hooks.oom import MAX_HOLDERS, OomObserver, build_postmortem, format_frames
from vramscope.hooks.sink import ListSink
from vramscope.hooks.snapshot import SnapshotSource, summarize

DATA = Path(__file__).resolve().parents[1] / "data"
MiB = 2**20


def small():
    return json.loads((DATA / "snapshot_segments_small.json").read_text())["segments"]


def test_summarize_splits_like_segsum_by_hand():
    f = summarize(small(), device=0)
    assert f.segments == 2
    assert f.reserved_bytes == 22 * MiB
    assert f.allocated_bytes == 10 * MiB + 512
    assert f.requested_bytes == (8 * MiB - 512) + 2 * MiB + 500
    assert f.internal_waste_bytes == 524
    assert f.free_inactive_bytes == 4 * MiB + 6 * MiB + (MiB - 512)
    assert f.free_external_bytes == f.free_inactive_bytes + MiB  # awaiting-free counts as segsum
    assert f.largest_free_block_bytes == 6 * MiB
    assert f.external_fragmentation_ratio == round(1 - 6 * MiB / (11 * MiB - 512), 6)


def test_other_devices_and_a_single_hole():
    f = summarize(small(), device=1)
    assert (f.segments, f.largest_free_block_bytes, f.external_fragmentation_ratio) == (
        1, 20 * MiB, 0.0)
    assert summarize([], device=0).external_fragmentation_ratio is None


def _segsum_totals(segments):
    """torch's own ``segsum`` printout, parsed: the independent oracle for our split."""
    from torch.cuda._memory_viz import segsum

    text = segsum({"segments": segments})
    return {name: re.search(rf"^{name}: (\S+)", text, re.M).group(1)
            for name in ("total_reserved", "total_allocated", "total_free")}


def _assert_matches_segsum(segments):
    from torch.cuda._memory_viz import Bytes

    f = summarize(segments)
    assert _segsum_totals(segments) == {
        "total_reserved": str(Bytes(f.reserved_bytes)),
        "total_allocated": str(Bytes(f.requested_bytes)),  # segsum's "allocated" is requested
        "total_free": str(Bytes(f.free_external_bytes + f.internal_waste_bytes))}


def test_agrees_with_torch_segsum_on_hand_made_segments():
    _assert_matches_segsum([s for s in small() if s["device"] == 0])


def test_agrees_with_torch_segsum_on_recorded_h200_snapshot():
    path = DATA / "gpu_snapshot_segments.json"
    if not path.exists():
        pytest.skip("recorded H200 snapshot not present")
    _assert_matches_segsum(json.loads(path.read_text())["segments"])


def test_postmortem_names_failed_size_largest_hole_and_holders():
    pm = build_postmortem(small(), ts_s=5.0, device=0, pid=99, phase=Phase.PREFILL,
                          failed_alloc_bytes=12 * MiB, driver_free_bytes=3 * MiB,
                          device_total_bytes=40 * MiB, requests_in_flight=["a", "b"])
    assert pm.failed_alloc_bytes == 12 * MiB
    assert pm.largest_free_block_bytes == 6 * MiB
    assert pm.allocated_bytes == 10 * MiB + 512 and pm.reserved_bytes == 22 * MiB
    assert [h.size_bytes for h in pm.top_holders] == [8 * MiB, 2 * MiB, 512]
    assert pm.top_holders[0].frames == ("/srv/app/server.py:42:handle",)  # torch frames dropped
    assert pm.top_holders[1].phase is Phase.DECODE  # from _set_memory_metadata
    assert [s["total_size_bytes"] for s in pm.segments] == [20 * MiB, 2 * MiB]
    assert pm.segments[0]["largest_free_block_bytes"] == 6 * MiB
    assert pm.requests_in_flight == ("a", "b")
    assert "tried to allocate 12582912 bytes" in pm.message
    assert PostMortem.from_json(json.loads(json.dumps(pm.to_json()))) == pm


def test_holders_are_bounded():
    blocks = [{"size": i + 1, "requested_size": i + 1, "state": "active_allocated"}
              for i in range(50)]
    pm = build_postmortem([{"total_size": 2000, "blocks": blocks}], ts_s=0, device=0, pid=None,
                          phase=Phase.UNKNOWN, failed_alloc_bytes=1, driver_free_bytes=0,
                          device_total_bytes=1)
    assert [h.size_bytes for h in pm.top_holders] == list(range(50, 50 - MAX_HOLDERS, -1))


def test_frames_keep_torch_only_when_nothing_else():
    torch_only = [{"filename": "/x/site-packages/torch/a.py", "line": 1, "name": "f"}]
    assert format_frames(torch_only) == ("/x/site-packages/torch/a.py:1:f",)


def _observer(sink, clock, **kw):
    return OomObserver(sink, take_segments=small, clock=clock, min_interval_s=60.0, **kw)


def test_observer_rate_limits_and_ships_postmortem_and_event():
    clock, sink = FakeClock(100.0), ListSink()
    ph.configure(sink=ListSink(), clock=clock)
    ph.set_phase("decode")
    ph.request_started("r1")
    obs = _observer(sink, clock)
    try:
        obs(0, 12 * MiB, 40 * MiB, 3 * MiB)
        clock.advance(30)
        obs(0, 12 * MiB, 40 * MiB, 3 * MiB)  # within a minute: counted, not built
        [pm] = sink.postmortems()
        assert (pm.phase, pm.requests_in_flight, pm.device_total_bytes) == (
            Phase.DECODE, ("r1",), 40 * MiB)
        [event] = sink.events()
        assert event.name == "oom" and event.data["failed_alloc_bytes"] == 12 * MiB
        assert (obs.seen, obs.suppressed) == (2, 1)
        clock.advance(31)
        obs(0, 1, 1, 1)
        assert len(sink.postmortems()) == 2
    finally:
        ph.reset()


def test_observer_never_raises_and_goes_quiet_when_disabled():
    def boom():
        raise RuntimeError("snapshot failed")

    sink = ListSink()
    obs = OomObserver(sink, take_segments=boom, clock=FakeClock(), min_interval_s=0)
    obs(0, 1, 2, 3)
    assert (obs.failures, sink.records) == (1, [])
    obs.enabled = False
    obs(0, 1, 2, 3)
    assert obs.seen == 1


def test_observer_keeps_snapshot_pickle_and_phases_from_history(tmp_path):
    import pickle

    segments = small()
    addr = segments[0]["blocks"][0]["address"]  # the 8 MiB holder
    # A history entry as torch 2.11 records it (seen on the H200): the stamp is on the entry.
    entry = {"action": "alloc", "addr": addr, "size": 8 * MiB, "stream": 0,
             "compile_context": "N/A", "user_metadata": "vramscope.phase=prefill"}
    full = {"segments": segments, "device_traces": [[entry]]}
    sink = ListSink()
    obs = _observer(sink, FakeClock(200.0), full_snapshot=lambda: full,
                    snapshot_dir=str(tmp_path / "s"))
    obs(0, 1, 2, 3)
    [pm] = sink.postmortems()
    with open(pm.snapshot_path, "rb") as fh:
        assert pickle.load(fh) == full
    assert [h.phase for h in pm.top_holders] == [Phase.PREFILL, Phase.DECODE, None]


def test_snapshot_source_records_cost_and_spaces_out_costly_snapshots():
    clock = FakeClock(0.0)
    costs = iter([0.2, 0.2, 0.01, 0.01])

    def take():
        clock.advance(next(costs))
        return small()

    src = SnapshotSource(0, take, interval_s=60.0, max_cost_s=0.05, clock=clock, pid=1)
    sample, event = src.read()
    assert sample.largest_free_block_bytes == 6 * MiB and sample.source == "torch_snapshot"
    assert event.name == "snapshot" and event.data["cost_s"] == pytest.approx(0.2)
    assert src.interval_s == 120.0
    src.read()
    assert src.interval_s == 240.0
    src.read()
    assert src.interval_s == 120.0  # cheap again: back towards the configured rate
    src.read()
    assert src.interval_s == 60.0


def test_snapshot_source_waits_for_cuda():
    src = SnapshotSource(0, small, interval_s=1, max_cost_s=0, ready=lambda: False)
    assert src.read() is None


def test_snapshot_records_carry_this_processs_pid():
    """As install() makes it (no pid given): the snapshot is this process's, like its allocator
    samples, not a pid-less record the engine would read as the device's own process."""
    import os

    sample, event = SnapshotSource(0, small, interval_s=1, max_cost_s=0).read()
    assert sample.pid == os.getpid() and event.pid == os.getpid()
