"""The caching-allocator model against the behaviours of PyTorch's CUDA caching allocator."""

from __future__ import annotations

import pytest
from vramscope.agent.sim.caching_allocator import CachingAllocatorModel, SimulatedOOM, round_size

MiB = 1 << 20


def counters(a: CachingAllocatorModel) -> tuple[int, int, int, int]:
    return a.allocated_bytes, a.reserved_bytes, a.inactive_split_bytes, a.requested_bytes


def test_rounding_to_512_bytes():
    assert [round_size(n) for n in (0, 1, 512, 513, 1000)] == [512, 512, 512, 1024, 1024]


def test_small_request_gets_a_2mib_segment_and_is_split():
    a = CachingAllocatorModel(limit_bytes=1 << 30)
    a.malloc(100)
    assert counters(a) == (512, 2 * MiB, 2 * MiB - 512, 100)
    assert a.num_segments == 1


def test_mid_size_request_gets_a_20mib_segment():
    a = CachingAllocatorModel(limit_bytes=1 << 30)
    a.malloc(5 * MiB)
    assert counters(a) == (5 * MiB, 20 * MiB, 15 * MiB, 5 * MiB)


def test_large_request_is_rounded_to_2mib_and_a_small_remainder_is_not_split():
    a = CachingAllocatorModel(limit_bytes=1 << 30)
    a.malloc(11 * MiB + 1)
    # segment 12 MiB; remainder 1 MiB - 512 is not > 1 MiB, so the whole block is handed out
    assert counters(a) == (12 * MiB, 12 * MiB, 0, 11 * MiB + 1)


def test_small_requests_never_use_large_segments():
    a = CachingAllocatorModel(limit_bytes=1 << 30)
    big = a.malloc(5 * MiB)
    a.free(big)  # a free 20 MiB large segment is cached
    a.malloc(4096)
    assert a.reserved_bytes == 22 * MiB
    # snapshot is by address, and the newer (small) segment lies below the older one
    assert [s["segment_type"] for s in a.snapshot()] == ["small", "large"]


def test_best_fit_takes_the_smallest_free_block_that_fits():
    a = CachingAllocatorModel(limit_bytes=1 << 30)
    h16, h12 = a.malloc(16 * MiB), a.malloc(12 * MiB)
    a.free(h16)
    a.free(h12)
    got = a.malloc(11 * MiB)
    assert got == h12  # 12 MiB segment, not the 16 MiB one
    assert a.allocated_bytes == 12 * MiB


def test_new_segments_lie_below_older_ones():
    a = CachingAllocatorModel(limit_bytes=1 << 30)
    first, second = a.malloc(12 * MiB), a.malloc(14 * MiB)
    assert second + 14 * MiB == first  # the driver on the H200 hands out addresses downwards


def test_equal_sized_holes_tie_break_to_the_lower_address_the_newer_segment():
    """Which of two same-sized holes is reused decides where the next holes merge; the H200
    record (tests/agent/test_sim_vs_h200_replay.py) diverged at step 1879 when this went the
    other way."""
    a = CachingAllocatorModel(limit_bytes=1 << 30)
    old = [a.malloc(MiB // 2) for _ in range(4)]  # fills 2 MiB small segment one
    new = [a.malloc(MiB // 2) for _ in range(4)]  # and segment two, below it
    assert new[0] + 2 * MiB == old[0]
    a.free(old[1])
    a.free(new[2])  # two free 512 KiB blocks inside split segments
    assert a.malloc(MiB // 2) == new[2]  # lower address: the newer segment's hole
    assert a.malloc(MiB // 2) == old[1]


def test_free_merges_neighbours_inside_a_segment():
    a = CachingAllocatorModel(limit_bytes=1 << 30)
    h = [a.malloc(5 * MiB) for _ in range(4)]  # fills one 20 MiB segment exactly
    assert a.num_segments == 1 and a.inactive_split_bytes == 0
    a.free(h[0])
    a.free(h[2])
    assert a.inactive_split_bytes == 10 * MiB
    assert a.largest_free_block_bytes == 5 * MiB
    assert a.external_fragmentation_ratio() == 0.5
    a.free(h[1])  # bridges the two holes
    assert a.largest_free_block_bytes == 15 * MiB
    assert [b["size"] for b in a.snapshot()[0]["blocks"]] == [15 * MiB, 5 * MiB]
    a.free(h[3])
    assert counters(a) == (0, 20 * MiB, 0, 0)
    assert a.snapshot()[0]["blocks"] == [
        {"address": h[0], "size": 20 * MiB, "requested_size": 0, "state": "inactive",
         "frames": []}]


def test_coalescing_never_crosses_segments():
    a = CachingAllocatorModel(limit_bytes=1 << 30)
    x, y = a.malloc(12 * MiB), a.malloc(12 * MiB)
    assert y == x - 12 * MiB  # adjacent in the pretend address space (top-down)
    a.free(x)
    a.free(y)
    assert a.largest_free_block_bytes == 12 * MiB
    assert a.num_segments == 2


def test_cached_segments_are_released_and_the_malloc_retried():
    a = CachingAllocatorModel(limit_bytes=40 * MiB)
    x = a.malloc(12 * MiB)
    a.malloc(12 * MiB)
    a.free(x)  # 12 MiB cached
    a.malloc(20 * MiB)  # 24 + 20 > 40: release x's segment, retry
    assert (a.num_alloc_retries, a.num_ooms) == (1, 0)
    assert counters(a) == (32 * MiB, 32 * MiB, 0, 32 * MiB)
    assert a.num_segment_frees == 1


def test_oom_when_the_retry_fails_too():
    a = CachingAllocatorModel(limit_bytes=40 * MiB)
    a.malloc(12 * MiB)
    a.malloc(20 * MiB)
    with pytest.raises(SimulatedOOM) as info:
        a.malloc(10 * MiB)
    assert (a.num_alloc_retries, a.num_ooms) == (1, 1)
    assert info.value.size_bytes == 10 * MiB
    assert "Tried to allocate 10.00 MiB" in str(info.value)
    assert counters(a) == (32 * MiB, 32 * MiB, 0, 32 * MiB)  # nothing changed


def test_fragmentation_oom_with_enough_free_in_total():
    """Split segments keep holes that neither merge across segments nor can be released."""
    a = CachingAllocatorModel(limit_bytes=40 * MiB)
    h = [a.malloc(5 * MiB) for _ in range(8)]  # two 20 MiB segments
    for i in (0, 2, 4, 6):
        a.free(h[i])
    assert a.reserved_bytes - a.allocated_bytes == 20 * MiB
    with pytest.raises(SimulatedOOM):
        a.malloc(8 * MiB)
    assert a.external_fragmentation_ratio() == 0.75
    assert (a.num_alloc_retries, a.num_ooms) == (1, 1)


def test_stats_and_snapshot_shapes_match_torch():
    a = CachingAllocatorModel(limit_bytes=1 << 30, device=3)
    a.malloc(1000)
    stats = a.memory_stats()
    assert stats["allocated_bytes.all.current"] == 1024
    assert stats["inactive_split_bytes.all.current"] == 2 * MiB - 1024
    seg = a.snapshot()[0]
    assert {k: seg[k] for k in ("device", "total_size", "allocated_size", "requested_size",
                                "segment_type")} == {
        "device": 3, "total_size": 2 * MiB, "allocated_size": 1024, "requested_size": 1000,
        "segment_type": "small"}
    assert [(b["size"], b["state"]) for b in seg["blocks"]] == [
        (1024, "active_allocated"), (2 * MiB - 1024, "inactive")]


def test_bad_calls_raise_clear_errors():
    a = CachingAllocatorModel(limit_bytes=1 << 30)
    with pytest.raises(KeyError, match="unknown or already freed"):
        a.free(12345)
    with pytest.raises(ValueError, match="Invalid limit_bytes: 0"):
        CachingAllocatorModel(limit_bytes=0)
    h = a.malloc(10)
    a.free(h)
    with pytest.raises(KeyError):
        a.free(h)
