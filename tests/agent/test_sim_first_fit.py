"""The first-fit variable-size pool: first fit, split, merge, and the OOM it fragments into."""

from __future__ import annotations

import pytest

from tools.sim.first_fit import FirstFitOOM, FirstFitPool


def test_first_fit_takes_the_lowest_hole_that_fits_and_splits_it():
    p = FirstFitPool(1000, alignment_bytes=10)
    a, b, c = p.malloc(100), p.malloc(200), p.malloc(100)
    assert (a, b, c) == (0, 100, 300)
    p.free(a)
    p.free(c)  # merges with the tail hole: holes [0,100) and [300,1000)
    assert p.num_holes == 2
    assert p.malloc(50) == 0  # first fit, not best fit: the lowest hole
    assert p.malloc(60) == 300  # 50 left at 50 is too small
    assert (p.allocated_bytes, p.high_water_bytes) == (310, 400)


def test_free_merges_with_both_neighbours():
    p = FirstFitPool(600, alignment_bytes=100)
    offsets = [p.malloc(100) for _ in range(6)]
    for i in (1, 3):
        p.free(offsets[i])
    assert (p.num_holes, p.largest_free_block_bytes) == (2, 100)
    assert p.external_fragmentation_ratio() == 0.5
    p.free(offsets[2])
    assert (p.num_holes, p.largest_free_block_bytes) == (1, 300)
    assert p.external_fragmentation_ratio() == 0.0


def test_oom_with_enough_free_in_total():
    p = FirstFitPool(400, alignment_bytes=100)
    offsets = [p.malloc(100) for _ in range(4)]
    p.free(offsets[0])
    p.free(offsets[2])
    with pytest.raises(FirstFitOOM, match="no hole of 200 bytes"):
        p.malloc(150)
    assert (p.num_ooms, p.free_bytes) == (1, 200)


def test_alignment_and_requested_bytes():
    p = FirstFitPool(4096, alignment_bytes=256)
    p.malloc(1)
    assert (p.allocated_bytes, p.requested_bytes) == (256, 1)


def test_bad_calls():
    p = FirstFitPool(100)
    with pytest.raises(KeyError, match="unknown or already freed offset 5"):
        p.free(5)
    with pytest.raises(ValueError, match="capacity_bytes: -1"):
        FirstFitPool(-1)
