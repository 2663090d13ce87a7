"""Fragmentation of the caching allocator's reserved memory, sample by sample.

Vocabulary (docs/architecture.md, "Words"): *cached free* = reserved − allocated is reusable memory,
not fragmentation. Fragmentation is free memory that a large request cannot use:

- ``inactive_split_ratio`` = inactive split bytes / reserved bytes — free bytes stranded inside
  partially used segments; the cheap signal available on every allocator read.
- ``external_fragmentation_ratio`` = 1 − largest free block / cached free — only where an
  allocator snapshot gave the largest free block (0 means one hole holds all the free memory).
- ``internal_waste_bytes`` = allocated − requested (rounding inside blocks).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

from vramscope.agent.records import Sample


class FragPoint(NamedTuple):
    ts_s: float
    device: int
    cached_free_bytes: int
    inactive_split_ratio: float | None
    external_fragmentation_ratio: float | None
    largest_free_block_bytes: int | None
    internal_waste_bytes: int | None


def fragmentation_point(s: Sample) -> FragPoint | None:
    """The fragmentation figures of one sample; ``None`` without allocated and reserved."""
    if s.allocated_bytes is None or s.reserved_bytes is None:
        return None
    cached_free = max(0, s.reserved_bytes - s.allocated_bytes)
    return FragPoint(s.ts_s, s.device, cached_free, inactive_split_ratio(s),
                     external_fragmentation(s), s.largest_free_block_bytes,
                     None if s.requested_bytes is None
                     else max(0, s.allocated_bytes - s.requested_bytes))


def inactive_split_ratio(s: Sample) -> float | None:
    return split_ratio(s.inactive_split_bytes, s.reserved_bytes)


def external_fragmentation(s: Sample) -> float | None:
    """1 − largest free block / cached free; ``None`` without a snapshot or without free memory."""
    return external_ratio(s.largest_free_block_bytes, s.reserved_bytes, s.allocated_bytes)


# The two ratios of plain counters, for readers that hold columns rather than samples (the
# timeline's buckets: a Sample built per bucket only to be read was most of their cost).

def split_ratio(inactive_split_bytes: int | None, reserved_bytes: int | None) -> float | None:
    """Inactive split bytes / reserved bytes, at most 1; None without both."""
    if inactive_split_bytes is None or not reserved_bytes:
        return None
    return min(1.0, inactive_split_bytes / reserved_bytes)


def external_ratio(largest_free_block_bytes: int | None, reserved_bytes: int | None,
                   allocated_bytes: int | None) -> float | None:
    """1 − largest free block / cached free; None without all three or without free memory."""
    if largest_free_block_bytes is None or reserved_bytes is None or allocated_bytes is None:
        return None
    cached_free = reserved_bytes - allocated_bytes
    if cached_free <= 0:
        return None
    return max(0.0, 1.0 - min(largest_free_block_bytes, cached_free) / cached_free)


def with_allocator_context(samples: Iterable[Sample]) -> Iterator[Sample]:
    """Samples in order; a snapshot sample that carries only the largest free block (source
    ``torch_snapshot``) gets the allocated and reserved bytes of the latest allocator sample of
    its device, so its external fragmentation can be computed."""
    latest: dict[int, Sample] = {}
    for s in samples:
        if s.allocated_bytes is not None and s.reserved_bytes is not None:
            latest[s.device] = s
        elif s.largest_free_block_bytes is not None and s.device in latest:
            ctx = latest[s.device]
            s = s._replace(allocated_bytes=ctx.allocated_bytes, reserved_bytes=ctx.reserved_bytes)
        yield s


def fragmentation_series(samples: Iterable[Sample]) -> list[FragPoint]:
    """One point per sample that carries allocator counters (or a snapshot), in input order."""
    points = map(fragmentation_point, with_allocator_context(samples))
    return [p for p in points if p is not None]


class FragSummary(NamedTuple):
    max_inactive_split_ratio: float
    max_external_fragmentation: float | None


def fragmentation_summary(samples: Iterable[Sample]) -> FragSummary:
    acc = FragAccumulator()
    for s in samples:
        acc.add(s)
    return acc.summary()


class FragAccumulator:
    """:func:`fragmentation_summary` one sample at a time (streaming analysis: nothing kept but
    the maxima and each device's latest allocator sample)."""

    def __init__(self) -> None:
        self.split = 0.0
        self.external: float | None = None
        self._latest: dict[int, Sample] = {}  # as with_allocator_context keeps it

    def add(self, s: Sample) -> None:
        if s.allocated_bytes is not None and s.reserved_bytes is not None:
            self._latest[s.device] = s
        elif s.largest_free_block_bytes is not None and s.device in self._latest:
            ctx = self._latest[s.device]
            s = s._replace(allocated_bytes=ctx.allocated_bytes, reserved_bytes=ctx.reserved_bytes)
        r = split_ratio(s.inactive_split_bytes, s.reserved_bytes)  # inactive_split_ratio(s)
        if r is not None and r > self.split:
            self.split = r
        if s.largest_free_block_bytes is None:
            return  # no snapshot, no external fragmentation: most samples, read per sample
        e = external_fragmentation(s)
        if e is not None and (self.external is None or e > self.external):
            self.external = e

    def summary(self) -> FragSummary:
        return FragSummary(self.split, self.external)
