"""Records, errors and the observer seam of the KV block pool (``vramscope.hooks.kvpool``).

Kept apart from the pool so the KV source and the transformers adapter can import the records
without the pool's bookkeeping, and so this file documents the data contract where it is made.
Standard library only: torch is optional everywhere in the pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from vramscope.agent.dtypes import element_bytes, known_dtypes

if TYPE_CHECKING:
    from vramscope.hooks.kvpool import KVBlockPool



class KVPoolError(Exception):
    """A bad call on the pool: unknown request, double free, out of blocks, bad argument.

    Raised before any state changes, so the pool stays consistent after it.
    """

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


def dtype_name_and_bytes(dtype: object) -> tuple[str, int]:
    """``("bfloat16", 2)`` for ``"bfloat16"``, ``"torch.bfloat16"`` or ``torch.bfloat16``."""
    if isinstance(dtype, str):  # by name, so a pool can be sized without torch
        size = element_bytes(dtype)
        if size is None:
            raise KVPoolError(f"unknown dtype {dtype!r}; known: {known_dtypes()}")
        if size != int(size):
            raise KVPoolError(f"dtype {dtype!r} packs {size} bytes per element; a KV pool "
                              f"needs whole bytes per element")
        return dtype.removeprefix("torch."), int(size)
    itemsize = getattr(dtype, "itemsize", None)
    if not isinstance(itemsize, int) or itemsize <= 0:
        raise KVPoolError(f"dtype {dtype!r} has no itemsize; pass a torch dtype or its name")
    return str(dtype).removeprefix("torch."), itemsize


def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, num_tokens: int,
                   bytes_per_element: int) -> int:
    """The standard KV size: 2 (K and V) x layers x KV heads x head dim x tokens x bytes."""
    return 2 * num_layers * num_kv_heads * head_dim * num_tokens * bytes_per_element


class Allocation(NamedTuple):
    """What ``allocate`` gave a request. ``hit_tokens`` counts prompt tokens found cached
    (on the device or restored from the CPU tier); ``restored_tokens`` is the tier's share."""

    request_id: str
    block_ids: tuple[int, ...]
    num_tokens: int
    hit_tokens: int = 0
    restored_tokens: int = 0


class KVPoolStats(NamedTuple):
    """The pool's counters at one instant. Blocks: used + free + cached == total.

    ``tokens_used`` counts tokens stored in used blocks (each physical block once, however many
    requests share it); ``token_usage_ratio`` = tokens_used / (blocks_used x block_size) is the
    token occupancy next to block occupancy (the waste in partly filled last blocks).
    The ``prefix_*``, ``evictions``, ``offloads``, ``restores`` and ``failed_allocations``
    counters are cumulative since the pool was built.
    """

    blocks_total: int
    blocks_used: int
    blocks_free: int
    blocks_cached: int
    block_size: int
    bytes_per_block: int
    size_bytes: int
    tokens_used: int
    block_usage_ratio: float
    token_usage_ratio: float | None  # None while no block is used
    requests: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
    evictions: int
    offloads: int
    restores: int
    tier_blocks: int
    tier_bytes: int
    tier_capacity_bytes: int
    failed_allocations: int
    observer_errors: int


class CheckReport(NamedTuple):
    """The bookkeeping check (run when the pool is idle, or any time with the live requests).

    ``orphaned_blocks`` are blocks still referenced although no live request owns them: the
    leak serving engines check for (SGLang's idle check). ``problems`` lists broken
    invariants (refcounts, block counts), each naming the block and the numbers.
    """

    ok: bool
    blocks_total: int
    blocks_used: int
    blocks_free: int
    blocks_cached: int
    orphaned_blocks: tuple[int, ...]
    orphan_owners: tuple[str, ...]
    problems: tuple[str, ...]


class KVPoolObserver:
    """What a pool reports, as it happens. Every method is a no-op here: override what you need.

    Called on the caller's thread after the pool's state is updated; an observer must be fast
    and must not call back into the pool's mutating methods. How methods are bound and errors
    counted: docs/kvpool.md, "Observer".
    """

    def on_allocate(self, pool: KVBlockPool, allocation: Allocation) -> None:
        """A request got its blocks (``allocation.block_ids``)."""

    def on_extend(self, pool: KVBlockPool, request_id: str, new_block_ids: tuple[int, ...],
                  num_tokens: int) -> None:
        """A request grew to ``num_tokens`` tokens and took ``new_block_ids`` (never empty:
        an extend that fits in the last block is not reported, so decode steps cost nothing)."""

    def on_free(self, pool: KVBlockPool, request_id: str, released: tuple[int, ...],
                cached: tuple[int, ...]) -> None:
        """A request ended: ``released`` blocks went free, ``cached`` ones stay for reuse."""

    def on_hit(self, pool: KVBlockPool, request_id: str, hit_tokens: int,
               query_tokens: int) -> None:
        """A prompt of ``query_tokens`` tokens found ``hit_tokens`` of them cached."""

    def on_evict(self, pool: KVBlockPool, block_id: int, offloaded: bool) -> None:
        """An unreferenced cached block was reclaimed (copied to the CPU tier if ``offloaded``)."""

    def on_offload(self, pool: KVBlockPool, block_id: int, nbytes: int) -> None:
        """A block's contents went to the CPU tier."""

    def on_restore(self, pool: KVBlockPool, block_id: int, nbytes: int) -> None:
        """A block's contents came back from the CPU tier into ``block_id``."""

    def on_allocate_failed(self, pool: KVBlockPool, request_id: str, num_tokens: int,
                           reason: str) -> None:
        """An allocate or extend could not be served (the pool is unchanged)."""

    def on_check(self, pool: KVBlockPool, report: CheckReport) -> None:
        """The bookkeeping check ran."""

def check_count(n: int | None, token_ids: Sequence[int] | None, name: str, request_id: str) -> int:
    """The token count of an allocate / extend: ``n``, or ``len(token_ids)``; both must agree."""
    if type(n) is int and n > 0 and token_ids is None:  # the hot path: one test
        return n
    if n is None:
        if token_ids is None:
            raise KVPoolError(f"give {name} or token_ids for request {request_id!r}", request_id)
        n = len(token_ids)
    elif token_ids is not None and n != len(token_ids):
        raise KVPoolError(f"{name}={n} but {len(token_ids)} token_ids were given for request "
                          f"{request_id!r}", request_id)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise KVPoolError(f"{name} must be a positive integer, got {n!r} for request "
                          f"{request_id!r}", request_id)
    return n


def require_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise KVPoolError(f"{name} must be a positive integer, got {value!r}")


def require_non_negative_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise KVPoolError(f"{name} must be a non-negative integer, got {value!r}")
