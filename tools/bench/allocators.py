"""``vramscope bench allocators``: one KV request trace through three allocator designs.

The trace (fixed seed, :mod:`vramscope.agent.sim.workload`) gives each request a KV buffer that
holds its
prompt at arrival and grows every ``growth_tokens`` decoded tokens until the request ends and
frees it: requests end in an order set by their lengths, not their arrival. The designs, each
with the same memory budget:

- ``first_fit``: the pre-paging design of the articles: one arena, per-request buffers carved
  first-fit, split and merged (:mod:`tools.sim.first_fit`); growing a buffer allocates the
  larger one and frees the old (a copy, as ``torch.cat`` does);
- ``caching``: the same buffers through the PyTorch caching-allocator model
  (:mod:`vramscope.agent.sim.caching_allocator`), the limit as budget;
- ``paged``: vramscope's ``KVBlockPool`` (bookkeeping only) with blocks of 16 tokens.

A request whose allocation fails is an OOM: it is dropped and its memory freed, as a server
that catches the error would do. Reported per design: peak reserved (segments for the caching
allocator; the highest byte used for first fit; the most blocks in use for the pool), external
fragmentation (1 − largest free block / free bytes, averaged over the seconds when at least
half the budget is allocated, and at each OOM), internal waste (allocated − requested, same
seconds), OOMs and requests served. The paged pool's external fragmentation is 0 by
construction: a request takes any free blocks, so every free block is usable.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vramscope.agent.sim.caching_allocator import CachingAllocatorModel, SimulatedOOM
from vramscope.agent.sim.workload import WorkloadSpec, requests, take_until

from tools.bench import BenchOptions, Figure
from tools.sim.first_fit import FirstFitOOM, FirstFitPool

MiB = 1 << 20
KV_BYTES_PER_TOKEN = 2 * 16 * 4 * 128 * 2  # 32 KiB: 16 layers, 4 KV heads, head dim 128, bf16
BUDGET_BYTES = 2048 * MiB
GROWTH_TOKENS = 64
DECODE_TOKENS_PER_S = 25.0
PREFILL_TOKENS_PER_S = 8000.0
CLAIM = "pooling brings fragmentation from 35 % to 5 %"


@dataclass(frozen=True, order=True)
class Op:
    t_s: float
    order: int  # frees before allocations at the same instant
    kind: str  # "alloc", "grow", "free"
    request_id: str = field(compare=False)
    tokens: int = field(compare=False)  # the buffer's size in tokens after the op


def kv_ops(spec: WorkloadSpec, duration_s: float) -> list[Op]:
    """The allocation ops of every request arriving within ``duration_s``, in time order."""
    ops = []
    for req in take_until(requests(spec), duration_s):
        t_s = req.arrival_s
        ops.append(Op(t_s, 1, "alloc", req.request_id, req.prompt_tokens))
        t_s += req.prompt_tokens / PREFILL_TOKENS_PER_S
        total = req.prompt_tokens + req.output_tokens
        tokens = _round_up(req.prompt_tokens, GROWTH_TOKENS)
        while tokens < total:
            t_s += GROWTH_TOKENS / DECODE_TOKENS_PER_S
            tokens = min(total, tokens + GROWTH_TOKENS)
            ops.append(Op(t_s, 2, "grow", req.request_id, tokens))
        ops.append(Op(t_s + 1 / DECODE_TOKENS_PER_S, 0, "free", req.request_id, 0))
    return sorted(ops)


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


class _VariableDesign:
    """Per-request buffers in a variable-size allocator (first fit or caching model)."""

    def __init__(self, name: str, allocator: FirstFitPool | CachingAllocatorModel) -> None:
        self.name, self.a = name, allocator
        self.handles: dict[str, int] = {}

    def alloc(self, rid: str, tokens: int) -> bool:
        try:
            self.handles[rid] = self.a.malloc(tokens * KV_BYTES_PER_TOKEN)
            return True
        except (SimulatedOOM, FirstFitOOM):
            return False

    def grow(self, rid: str, tokens: int) -> bool:
        old = self.handles.pop(rid)
        ok = self.alloc(rid, _round_up(tokens, GROWTH_TOKENS))  # old and new live during copy
        self.a.free(old)
        return ok

    def release(self, rid: str) -> None:
        self.a.free(self.handles.pop(rid))

    def live(self, rid: str) -> bool:
        return rid in self.handles

    def state(self) -> tuple[int, int, int, int]:
        """(reserved-or-budget, allocated, requested, largest free block)."""
        a = self.a
        if isinstance(a, CachingAllocatorModel):
            # what one allocation can still get: a free block, or a new segment from the
            # unreserved rest plus the fully free segments a retry would release
            whole_free = a.reserved_bytes - a.allocated_bytes - a.inactive_split_bytes
            obtainable = a.limit_bytes - a.reserved_bytes + whole_free
            largest = max(a.largest_free_block_bytes, obtainable)
            return a.limit_bytes, a.allocated_bytes, a.requested_bytes, largest
        return a.capacity_bytes, a.allocated_bytes, a.requested_bytes, a.largest_free_block_bytes

    def peak_reserved(self) -> int:
        a = self.a
        return a.peak_reserved_bytes if isinstance(a, CachingAllocatorModel) else a.high_water_bytes


class _PagedDesign:
    """Block tables in vramscope's KVBlockPool: any free block serves any request."""

    def __init__(self, budget_bytes: int = BUDGET_BYTES) -> None:
        from vramscope.hooks.kvpool import KVBlockPool, KVPoolError

        self.name, self._error = "paged", KVPoolError
        self.pool = KVBlockPool(num_layers=16, num_kv_heads=4, head_dim=128, dtype="bfloat16",
                                block_size=16, budget_bytes=budget_bytes, buffer=False,
                                prefix_caching=False)
        self.peak_blocks = 0

    def alloc(self, rid: str, tokens: int) -> bool:
        return self._try(self.pool.allocate, rid, tokens)

    def grow(self, rid: str, tokens: int) -> bool:
        ok = self._try(self.pool.extend, rid, tokens - self.pool.num_tokens(rid))
        if not ok:
            self.pool.free(rid)
        return ok

    def _try(self, fn: Callable[[str, int], object], rid: str, n: int) -> bool:
        try:
            fn(rid, n)
        except self._error:
            return False
        self.peak_blocks = max(self.peak_blocks, self.pool.stats().blocks_used)
        return True

    def release(self, rid: str) -> None:
        self.pool.free(rid)

    def live(self, rid: str) -> bool:
        return rid in self.pool.request_ids

    def state(self) -> tuple[int, int, int, int]:
        s = self.pool.stats()
        free_blocks = s.blocks_free + s.blocks_cached
        return (s.size_bytes, s.blocks_used * s.bytes_per_block,
                s.tokens_used * KV_BYTES_PER_TOKEN, free_blocks * s.bytes_per_block)

    def peak_reserved(self) -> int:
        return self.peak_blocks * self.pool.bytes_per_block


_Design = _VariableDesign | _PagedDesign


@dataclass
class Result:
    design: str
    requests: int
    served: int = 0
    ooms: int = 0
    peak_reserved_bytes: int = 0
    ext_frag_under_load: list[float] = field(default_factory=list)
    ext_frag_at_oom: list[float] = field(default_factory=list)
    waste_under_load: list[float] = field(default_factory=list)

    def mean(self, values: list[float]) -> float | None:
        return statistics.fmean(values) if values else None


def replay(design: _Design, ops: list[Op], sample_every_s: float = 1.0) -> Result:
    result = Result(design.name, sum(1 for op in ops if op.kind == "alloc"))
    next_sample_s = 0.0
    for op in ops:
        if op.t_s >= next_sample_s:
            _sample(design, result, at_oom=False)
            next_sample_s = op.t_s + sample_every_s
        _apply(design, op, result)
    result.peak_reserved_bytes = design.peak_reserved()
    return result


def _apply(design: _Design, op: Op, result: Result) -> None:
    if op.kind == "alloc":
        ok = design.alloc(op.request_id, op.tokens)
    elif not design.live(op.request_id):
        return  # dropped earlier by an OOM
    elif op.kind == "grow":
        ok = design.grow(op.request_id, op.tokens)
    else:
        design.release(op.request_id)
        result.served += 1
        return
    if not ok:
        result.ooms += 1
        _sample(design, result, at_oom=True)


def _sample(design: _Design, result: Result, at_oom: bool) -> None:
    budget, allocated, requested, largest = design.state()
    free = budget - allocated
    frag = 1.0 - largest / free if free > 0 else 0.0
    if at_oom:
        result.ext_frag_at_oom.append(frag)
    elif allocated >= budget / 2:
        result.ext_frag_under_load.append(frag)
        result.waste_under_load.append((allocated - requested) / allocated)


def workload(quick: bool) -> tuple[WorkloadSpec, float]:
    spec = WorkloadSpec(rate_per_s=0.5, burst_rate_per_s=1.5, mean_calm_s=120.0,
                        mean_burst_s=30.0, prompt_median_tokens=900, output_median_tokens=300,
                        max_context_tokens=8192, seed=11)
    return spec, (900.0 if quick else 3 * 3600.0)


def designs(budget_bytes: int = BUDGET_BYTES) -> list[Any]:
    return [_VariableDesign("first_fit", FirstFitPool(budget_bytes)),
            _VariableDesign("caching", CachingAllocatorModel(budget_bytes)),
            _PagedDesign(budget_bytes)]


def compare(quick: bool = False) -> list[Result]:
    spec, duration_s = workload(quick)
    ops = kv_ops(spec, duration_s)
    return [replay(d, ops) for d in designs()]


def run(options: BenchOptions) -> list[Figure]:
    results = compare(options.quick)
    figures = []
    for r in results:
        figures += _figures(r)
    figures.append(_verdict(results))
    return figures


def _figures(r: Result) -> list[Figure]:
    def fig(metric: str, value: float | None, unit: str, spread: str = "") -> Figure:
        return Figure("allocators", f"{r.design}.{metric}", -1.0 if value is None else value,
                      unit, spread=spread, baseline="same trace, same budget")

    n = len(r.ext_frag_under_load)
    return [
        fig("peak_reserved", r.peak_reserved_bytes / MiB, "MiB"),
        fig("ext_frag_under_load", r.mean(r.ext_frag_under_load), "ratio",
            f"mean over {n} loaded seconds"),
        fig("ext_frag_at_oom", r.mean(r.ext_frag_at_oom), "ratio",
            f"mean over {len(r.ext_frag_at_oom)} OOMs"),
        fig("internal_waste_under_load", r.mean(r.waste_under_load), "ratio"),
        fig("ooms", r.ooms, "count"),
        fig("served", r.served, "requests", f"of {r.requests}"),
    ]


def _verdict(results: list[Result]) -> Figure:
    by = {r.design: r for r in results}
    before = by["first_fit"].mean(by["first_fit"].ext_frag_under_load) or 0.0
    after = by["paged"].mean(by["paged"].ext_frag_under_load) or 0.0
    return Figure("allocators", "claim.first_fit_minus_paged_ext_frag", before - after, "ratio",
                  spread=f"first fit {before:.1%} vs paged {after:.1%}",
                  baseline=CLAIM, target=">= 0.30", met=(before >= 0.30 and after <= 0.05))
