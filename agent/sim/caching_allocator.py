"""A model of PyTorch's CUDA caching allocator (``c10/cuda/CUDACachingAllocator.cpp``).

It reproduces the decisions that make fragmentation emerge from a workload, with the
allocator's own constants and default configuration; each rule, and the replay that matches
all 3,000 steps of an H200 recording (``tests/agent/test_sim_vs_h200_replay.py``): docs/demo.md,
"The caching-allocator model". Counters mean what ``torch.cuda.memory_stats()``'s
``*.all.current`` counters mean, and :meth:`CachingAllocatorModel.snapshot` returns segments
shaped like ``torch.cuda.memory_snapshot()``'s. Sizes are bytes; no memory is touched.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

MIN_BLOCK_BYTES = 512  # kMinBlockSize: every request is rounded up to this
SMALL_SIZE_BYTES = 1 << 20  # kSmallSize: largest request served by the small pool
SMALL_BUFFER_BYTES = 2 << 20  # kSmallBuffer: small-pool segment size
LARGE_BUFFER_BYTES = 20 << 20  # kLargeBuffer: large-pool segment size for mid-size requests
MIN_LARGE_ALLOC_BYTES = 10 << 20  # kMinLargeAlloc: from here on a request gets its own segment
ROUND_LARGE_BYTES = 2 << 20  # kRoundLarge: rounding of those own segments
_TOP_ADDRESS = 0x7F00_0000_0000  # pretend cudaMalloc hands out addresses downwards from here


class SimulatedOOM(MemoryError):
    """The model's ``torch.OutOfMemoryError``: no cached block fits and no segment can be had."""

    def __init__(self, message: str, size_bytes: int) -> None:
        super().__init__(message)
        self.size_bytes = size_bytes


def round_size(size_bytes: int) -> int:
    """``round_size``: at least 512 bytes, a multiple of 512."""
    if size_bytes < MIN_BLOCK_BYTES:
        return MIN_BLOCK_BYTES
    return -(-size_bytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES


def segment_size(rounded_bytes: int) -> int:
    """``get_allocation_size``: how much a new segment for this request asks the driver for."""
    if rounded_bytes <= SMALL_SIZE_BYTES:
        return SMALL_BUFFER_BYTES
    if rounded_bytes < MIN_LARGE_ALLOC_BYTES:
        return LARGE_BUFFER_BYTES
    return -(-rounded_bytes // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


def is_small(rounded_bytes: int) -> bool:
    return rounded_bytes <= SMALL_SIZE_BYTES


@dataclass(eq=False)
class Block:
    """A piece of a segment, allocated or free. ``prev``/``next`` link blocks of one segment."""

    address: int
    size: int
    small: bool
    allocated: bool = False
    requested: int = 0
    prev: Block | None = None
    next: Block | None = None

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def key(self) -> tuple[int, int]:
        return (self.size, self.address)


class _Pool:
    """Free blocks of one pool, ordered by (size, address) for best fit."""

    def __init__(self) -> None:
        self._keys: list[tuple[int, int]] = []
        self._blocks: dict[tuple[int, int], Block] = {}

    def add(self, block: Block) -> None:
        key = block.key()
        bisect.insort(self._keys, key)
        self._blocks[key] = block

    def remove(self, block: Block) -> None:
        key = block.key()
        del self._keys[bisect.bisect_left(self._keys, key)]
        del self._blocks[key]

    def best_fit(self, size_bytes: int) -> Block | None:
        i = bisect.bisect_left(self._keys, (size_bytes, -1))
        return self._blocks[self._keys[i]] if i < len(self._keys) else None

    def blocks(self) -> list[Block]:
        return list(self._blocks.values())


class CachingAllocatorModel:
    """PyTorch's caching allocator for one device, as bookkeeping.

    ``limit_bytes`` plays the role of free device memory plus
    ``set_per_process_memory_fraction``: a pretend ``cudaMalloc`` fails when reserved memory
    would exceed it. ``malloc`` returns a handle (the block's address) that ``free`` takes back.
    """

    def __init__(self, limit_bytes: int, device: int = 0) -> None:
        if limit_bytes <= 0:
            raise ValueError(f"Invalid limit_bytes: {limit_bytes}. Must be > 0")
        self.limit_bytes = limit_bytes
        self.device = device
        self._pools = {True: _Pool(), False: _Pool()}
        self._live: dict[int, Block] = {}
        self._segments: dict[int, Block] = {}  # segment address -> its first block
        self._lowest_address = _TOP_ADDRESS
        self.reserved_bytes = 0
        self.allocated_bytes = 0
        self.requested_bytes = 0
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_segment_allocs = 0  # pretend cudaMalloc calls that succeeded
        self.num_segment_frees = 0  # pretend cudaFree calls
        self.peak_reserved_bytes = 0
        self.peak_allocated_bytes = 0

    # --- the allocator's two operations ----------------------------------------------------
    def malloc(self, size_bytes: int) -> int:
        """Allocate ``size_bytes``; return a handle. Raise :class:`SimulatedOOM` when it can't."""
        if size_bytes < 0:
            raise ValueError(f"Invalid size_bytes: {size_bytes}. Must be >= 0")
        size = round_size(size_bytes)
        small = is_small(size)
        block = self._pools[small].best_fit(size)
        if block is not None:
            self._pools[small].remove(block)
        else:
            block = self._new_segment(size, small)
        block = self._split(block, size)
        block.allocated, block.requested = True, size_bytes
        self._live[block.address] = block
        self.allocated_bytes += block.size
        self.requested_bytes += size_bytes
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        return block.address

    def free(self, handle: int) -> None:
        """Return the allocation ``handle`` to its pool, merging it with free neighbours."""
        block = self._live.pop(handle, None)
        if block is None:
            raise KeyError(f"unknown or already freed allocation handle {handle:#x}")
        self.allocated_bytes -= block.size
        self.requested_bytes -= block.requested
        block.allocated, block.requested = False, 0
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._pools[block.small].remove(neighbour)
                block = self._merge(block, neighbour)
        self._pools[block.small].add(block)

    def empty_cache(self) -> int:
        """``torch.cuda.empty_cache()``: release every fully free segment; return bytes freed."""
        freed = 0
        for small in (True, False):
            for block in self._pools[small].blocks():
                if not block.is_split:
                    self._pools[small].remove(block)
                    self._release_segment(block)
                    freed += block.size
        return freed

    # --- segments ----------------------------------------------------------------------------
    def _new_segment(self, size: int, small: bool) -> Block:
        want = segment_size(size)
        if self.reserved_bytes + want <= self.limit_bytes:
            return self._cuda_malloc(want, small)
        # release_cached_blocks() then alloc_block(isRetry=true), which counts the retry
        # whether or not anything was released.
        self.empty_cache()
        self.num_alloc_retries += 1
        if self.reserved_bytes + want <= self.limit_bytes:
            return self._cuda_malloc(want, small)
        self.num_ooms += 1
        raise SimulatedOOM(self._oom_message(size), size)

    def _cuda_malloc(self, size: int, small: bool) -> Block:
        # top-down, like the driver: a newer segment has a lower address, so it wins ties in
        # best fit. Released ranges are not reused (the H200 record cannot tell whether they
        # are; every top-down variant matches it).
        self._lowest_address -= size
        block = Block(self._lowest_address, size, small)
        self._segments[block.address] = block
        self.reserved_bytes += size
        self.num_segment_allocs += 1
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        return block

    def _release_segment(self, block: Block) -> None:
        del self._segments[block.address]
        self.reserved_bytes -= block.size
        self.num_segment_frees += 1

    def _oom_message(self, size: int) -> str:
        mib = 1 << 20
        free = self.limit_bytes - self.reserved_bytes
        cached = self.reserved_bytes - self.allocated_bytes
        return (f"CUDA out of memory. Tried to allocate {size / mib:.2f} MiB. GPU {self.device} "
                f"has a total capacity of {self.limit_bytes / mib:.2f} MiB of which "
                f"{free / mib:.2f} MiB is free. Of the allocated memory "
                f"{self.allocated_bytes / mib:.2f} MiB is allocated by PyTorch, and "
                f"{cached / mib:.2f} MiB is reserved by PyTorch but unallocated. If reserved but "
                "unallocated memory is large try setting "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")

    # --- splitting and merging inside one segment ------------------------------------------
    def _split(self, block: Block, size: int) -> Block:
        remaining = block.size - size
        # the small pool splits off any usable remainder; the large pool only remainders that
        # are not small-pool sized (so small requests never land in large segments)
        threshold = MIN_BLOCK_BYTES if block.small else SMALL_SIZE_BYTES + 1
        if remaining < threshold:
            return block
        rest = Block(block.address + size, remaining, block.small, prev=block, next=block.next)
        if block.next is not None:
            block.next.prev = rest
        block.next, block.size = rest, size
        self._pools[block.small].add(rest)
        return block

    def _merge(self, block: Block, neighbour: Block) -> Block:
        first, second = (block, neighbour) if block.address < neighbour.address else (neighbour,
                                                                                      block)
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        return first

    # --- what torch.cuda.memory_stats() and memory_snapshot() would say ---------------------
    def _free_blocks(self) -> Iterator[Block]:
        for small in (True, False):
            yield from self._pools[small].blocks()

    @property
    def inactive_split_bytes(self) -> int:
        """Free bytes inside segments that are split (partially used)."""
        return sum(b.size for b in self._free_blocks() if b.is_split)

    @property
    def largest_free_block_bytes(self) -> int:
        return max((b.size for b in self._free_blocks()), default=0)

    @property
    def num_segments(self) -> int:
        return len(self._segments)

    def external_fragmentation_ratio(self) -> float | None:
        """1 − largest free block / free bytes in reserved memory; None when nothing is free."""
        free = self.reserved_bytes - self.allocated_bytes
        if free <= 0:
            return None
        return 1.0 - self.largest_free_block_bytes / free

    def memory_stats(self) -> dict[str, int]:
        """The ``*.all.current`` counters of ``torch.cuda.memory_stats()`` (one stream, so
        active equals allocated)."""
        return {
            "allocated_bytes.all.current": self.allocated_bytes,
            "reserved_bytes.all.current": self.reserved_bytes,
            "active_bytes.all.current": self.allocated_bytes,
            "inactive_split_bytes.all.current": self.inactive_split_bytes,
            "requested_bytes.all.current": self.requested_bytes,
            "allocated_bytes.all.peak": self.peak_allocated_bytes,
            "reserved_bytes.all.peak": self.peak_reserved_bytes,
            "segment.all.current": self.num_segments,
            "num_alloc_retries": self.num_alloc_retries,
            "num_ooms": self.num_ooms,
        }

    def snapshot(self) -> list[dict[str, Any]]:
        """Segment dicts shaped like ``torch.cuda.memory_snapshot()``, by address."""
        return [self._segment_dict(self._segments[a]) for a in sorted(self._segments)]

    def _segment_dict(self, first: Block) -> dict[str, Any]:
        blocks = list(_chain(first))
        allocated = sum(b.size for b in blocks if b.allocated)
        return {
            "device": self.device, "address": first.address,
            "total_size": sum(b.size for b in blocks), "stream": 0,
            "segment_type": "small" if first.small else "large", "segment_pool_id": (0, 0),
            "is_expandable": False, "allocated_size": allocated, "active_size": allocated,
            "requested_size": sum(b.requested for b in blocks), "frames": [],
            "blocks": [{"address": b.address, "size": b.size, "requested_size": b.requested,
                        "state": "active_allocated" if b.allocated else "inactive",
                        "frames": []} for b in blocks],
        }


def _chain(first: Block) -> Iterator[Block]:
    block: Block | None = first
    while block is not None:
        yield block
        block = block.next

