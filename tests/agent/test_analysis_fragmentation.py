"""Fragmentation, phases and KV exhaustion on literal samples."""

import pytest
from vramscope.agent.analysis.fragmentation import (
    FragPoint,
    fragmentation_point,
    fragmentation_series,
    fragmentation_summary,
)
from vramscope.agent.analysis.kv import kv_exhaustion
from vramscope.agent.analysis.phases import Spike, peak_phase, phase_stats, prefill_spikes
from vramscope.agent.records import Phase, Sample

P, D, IDLE = Phase.PREFILL, Phase.DECODE, Phase.IDLE


def S(ts, phase=Phase.UNKNOWN, **kw):
    return Sample(ts, 0, phase, "t", **kw)


@pytest.mark.parametrize("sample, expected", [
    # cached free 4; split 2/10; external 1 - 3/4; waste 6 - 5
    (S(1, allocated_bytes=6, reserved_bytes=10, inactive_split_bytes=2,
       largest_free_block_bytes=3, requested_bytes=5),
     FragPoint(1, 0, 4, 0.2, 0.25, 3, 1)),
    # no snapshot: external fragmentation unknown
    (S(2, allocated_bytes=6, reserved_bytes=10, inactive_split_bytes=5),
     FragPoint(2, 0, 4, 0.5, None, None, None)),
    # one hole holds all the free memory: 0
    (S(3, allocated_bytes=6, reserved_bytes=10, largest_free_block_bytes=4),
     FragPoint(3, 0, 4, None, 0.0, 4, None)),
    # nothing free: no external fragmentation to speak of
    (S(4, allocated_bytes=10, reserved_bytes=10, largest_free_block_bytes=0),
     FragPoint(4, 0, 0, None, None, 0, None)),
])
def test_fragmentation_point(sample, expected):
    assert fragmentation_point(sample) == expected


def test_series_skips_samples_without_allocator_counters_and_summary_takes_maxima():
    samples = [S(1, device_used_bytes=5),
               S(2, allocated_bytes=6, reserved_bytes=10, inactive_split_bytes=2,
                 largest_free_block_bytes=1),
               S(3, allocated_bytes=2, reserved_bytes=10, inactive_split_bytes=4,
                 largest_free_block_bytes=6)]
    assert [p.ts_s for p in fragmentation_series(samples)] == [2, 3]
    summary = fragmentation_summary(samples)
    assert summary.max_inactive_split_ratio == 0.4
    assert summary.max_external_fragmentation == pytest.approx(0.75)  # 1 - 1/4


TRACE = [S(0, D, allocated_bytes=10, reserved_bytes=12), S(1, P, allocated_bytes=15),
         S(2, P, allocated_bytes=18, reserved_bytes=20), S(3, D, allocated_bytes=11),
         S(4, P, allocated_bytes=20), S(5, IDLE, allocated_bytes=9)]


def test_phase_stats():
    stats = phase_stats(TRACE)
    assert stats["prefill"] == (3, 20, 20)
    assert stats["decode"] == (2, 11, 12)
    assert stats["idle"] == (1, 9, 0)
    assert stats["unknown"] == (0, 0, 0)


def test_prefill_spikes_are_measured_over_the_baseline_before_them():
    assert prefill_spikes(TRACE) == [Spike(2, 8, 18, 10), Spike(4, 9, 20, 11)]


def test_a_prefill_without_a_baseline_is_not_a_spike():
    assert prefill_spikes([S(0, P, allocated_bytes=50), S(1, D, allocated_bytes=10)]) == []


@pytest.mark.parametrize("start, end, expected", [(0, 5, P), (0, 1, P), (0, 0, D), (5, 5, IDLE),
                                                  (6, 9, None)])
def test_peak_phase(start, end, expected):
    assert peak_phase(TRACE, start, end) == expected


def test_kv_exhaustion_from_the_rate_of_the_last_30_s():
    # 100 -> 200 used blocks over 10 s: 10 blocks/s, 800 left -> 80 s
    samples = [S(t, kv_blocks_used=100 + 10 * t, kv_blocks_total=1000) for t in range(11)]
    points = kv_exhaustion(samples)
    assert [p.exhaustion_s for p in points[:5]] == [None] * 5  # under 5 s of data
    assert points[10].exhaustion_s == 80.0
    assert points[10].usage_ratio == 0.2


def test_kv_exhaustion_is_none_when_used_blocks_fall_and_ignores_other_devices():
    samples = [S(t, kv_blocks_used=500 - 10 * t, kv_blocks_total=1000) for t in range(11)]
    samples.append(Sample(11, 1, kv_blocks_used=999, kv_blocks_total=1000))
    points = kv_exhaustion(samples)
    assert len(points) == 11
    assert points[-1].exhaustion_s is None


def test_a_snapshot_sample_takes_the_latest_allocator_figures_of_its_device():
    samples = [S(1, allocated_bytes=6, reserved_bytes=10),
               Sample(1.5, 1, allocated_bytes=1, reserved_bytes=100),
               Sample(2, 0, source="torch_snapshot", largest_free_block_bytes=1)]
    # device 0: cached free 4, largest block 1 -> 0.75; device 1's figures are not used
    assert fragmentation_series(samples)[-1] == FragPoint(2, 0, 4, None, 0.75, 1, None)
    assert fragmentation_summary(samples).max_external_fragmentation == 0.75
    alone = [Sample(2, 0, source="torch_snapshot", largest_free_block_bytes=1)]
    assert fragmentation_series(alone) == []
