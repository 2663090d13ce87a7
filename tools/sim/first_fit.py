"""A first-fit variable-size pool with split and merge: the pre-paging KV design.

The articles this project grew from describe it: one preallocated arena, each request's KV
buffer carved from the first hole (lowest address) that is large enough, the hole split, and
a freed buffer merged with free neighbours. Because buffers of every size come and go in
random order, the arena ends up as a comb of holes none of which fits the next large buffer.

Bookkeeping only; sizes are bytes rounded up to ``alignment_bytes``.
"""

from __future__ import annotations

import bisect


class FirstFitOOM(MemoryError):
    def __init__(self, message: str, size_bytes: int) -> None:
        super().__init__(message)
        self.size_bytes = size_bytes


class FirstFitPool:
    """An arena of ``capacity_bytes`` with a free list ordered by address."""

    def __init__(self, capacity_bytes: int, alignment_bytes: int = 256) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"Invalid capacity_bytes: {capacity_bytes}. Must be > 0")
        if alignment_bytes <= 0:
            raise ValueError(f"Invalid alignment_bytes: {alignment_bytes}. Must be > 0")
        self.capacity_bytes = capacity_bytes
        self.alignment_bytes = alignment_bytes
        self._hole_starts: list[int] = [0]
        self._holes: dict[int, int] = {0: capacity_bytes}  # start -> size
        self._live: dict[int, tuple[int, int]] = {}  # offset -> (size, requested)
        self.allocated_bytes = 0
        self.requested_bytes = 0
        self.high_water_bytes = 0  # the highest offset ever used: what the arena really needed
        self.peak_allocated_bytes = 0
        self.num_ooms = 0

    def malloc(self, size_bytes: int) -> int:
        """Carve ``size_bytes`` from the first hole that fits; return its offset."""
        size = max(1, -(-size_bytes // self.alignment_bytes)) * self.alignment_bytes
        for start in self._hole_starts:
            if self._holes[start] >= size:
                return self._take(start, size, size_bytes)
        self.num_ooms += 1
        raise FirstFitOOM(f"first-fit pool: no hole of {size} bytes "
                          f"(largest {self.largest_free_block_bytes}, free {self.free_bytes})",
                          size)

    def free(self, offset: int) -> None:
        """Return a buffer; merge it with the holes just before and after it."""
        if offset not in self._live:
            raise KeyError(f"unknown or already freed offset {offset}")
        size, requested = self._live.pop(offset)
        self.allocated_bytes -= size
        self.requested_bytes -= requested
        i = bisect.bisect_left(self._hole_starts, offset)
        if i < len(self._hole_starts) and self._hole_starts[i] == offset + size:
            size += self._holes.pop(self._hole_starts.pop(i))
        if i > 0 and self._hole_starts[i - 1] + self._holes[self._hole_starts[i - 1]] == offset:
            self._holes[self._hole_starts[i - 1]] += size
            return
        self._hole_starts.insert(i, offset)
        self._holes[offset] = size

    def _take(self, start: int, size: int, requested: int) -> int:
        hole = self._holes.pop(start)
        i = bisect.bisect_left(self._hole_starts, start)
        if hole > size:  # split: the rest stays a hole at the same place in the list
            self._hole_starts[i] = start + size
            self._holes[start + size] = hole - size
        else:
            del self._hole_starts[i]
        self._live[start] = (size, requested)
        self.allocated_bytes += size
        self.requested_bytes += requested
        self.high_water_bytes = max(self.high_water_bytes, start + size)
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        return start

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.allocated_bytes

    @property
    def largest_free_block_bytes(self) -> int:
        return max(self._holes.values(), default=0)

    @property
    def num_holes(self) -> int:
        return len(self._holes)

    def external_fragmentation_ratio(self) -> float | None:
        """1 − largest hole / free bytes; None when the arena is full."""
        if self.free_bytes <= 0:
            return None
        return 1.0 - self.largest_free_block_bytes / self.free_bytes
