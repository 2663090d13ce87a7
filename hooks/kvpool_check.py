"""The KV pool's bookkeeping check: the leak check serving engines run when idle, and more.

SGLang's idle check asserts ``available + evictable == total`` and reports a leak otherwise.
This one checks that and also each block's refcount against the block tables, that no block is
in two states at once, and, given the live request ids, which blocks are held by requests the
server no longer knows (orphaned: a finished request that was never freed). O(blocks): meant for
idle moments and tests, never the per-token path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vramscope.hooks.kvpool_types import CheckReport

if TYPE_CHECKING:
    from vramscope.hooks.kvpool import KVBlockPool

_MAX_PROBLEMS = 20  # a corrupt pool could list every block; the first few say enough


def run_check(pool: KVBlockPool, live: set[str] | None) -> CheckReport:
    n = pool.num_blocks
    counts = _table_references(pool, n)
    problems = _refcount_problems(pool, counts)
    used = sum(1 for r in pool._ref if r > 0)
    free, cached = len(pool._free), len(pool._lru)
    if used + free + cached != n:
        problems.append(f"used {used} + free {free} + cached {cached} != total {n}")
    problems += _state_overlaps(pool)
    owners = sorted(rid for rid in pool._requests if live is not None and rid not in live)
    orphaned = _orphaned_blocks(pool, owners, counts)
    return CheckReport(not problems and not orphaned, n, used, free, cached, tuple(orphaned),
                       tuple(owners), tuple(problems[:_MAX_PROBLEMS]))


def _table_references(pool: KVBlockPool, n: int) -> list[int]:
    counts = [0] * n
    for req in pool._requests.values():
        for block in req.blocks:
            counts[block] += 1
    return counts


def _refcount_problems(pool: KVBlockPool, counts: list[int]) -> list[str]:
    return [f"block {b}: refcount {ref} but {counts[b]} block-table references"
            for b, ref in enumerate(pool._ref) if ref != counts[b]]


def _state_overlaps(pool: KVBlockPool) -> list[str]:
    free, cached = set(pool._free), set(pool._lru)
    problems: list[str] = []
    if len(free) != len(pool._free):
        problems.append("a block is on the free list twice")
    for block in sorted(free & cached):
        problems.append(f"block {block} is both free and cached")
    for block in sorted((free | cached) & {b for b, r in enumerate(pool._ref) if r > 0}):
        problems.append(f"block {block} is referenced but also free or cached")
    return problems


def _orphaned_blocks(pool: KVBlockPool, owners: list[str], counts: list[int]) -> list[int]:
    """Blocks held only by dead owners, plus referenced blocks no table mentions."""
    dead_refs: dict[int, int] = {}
    for rid in owners:
        for block in pool._requests[rid].blocks:
            dead_refs[block] = dead_refs.get(block, 0) + 1
    orphaned = {b for b, refs in dead_refs.items() if refs == counts[b]}
    orphaned |= {b for b, ref in enumerate(pool._ref) if ref > 0 and counts[b] == 0}
    return sorted(orphaned)
