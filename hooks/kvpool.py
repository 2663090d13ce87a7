"""``KVBlockPool``: a paged KV cache allocator over one preallocated buffer, observable by design.

Every block is exactly one of used (``refcount > 0``), cached (unreferenced, full and keyed by
its token chain for prefix reuse) or free; ``used + free + cached == total`` always holds and
``check()`` verifies it. Allocation and release are O(1) a block (a free stack and an LRU dict of
cached blocks); eviction takes the least recently released cached block, only when no block is
free. Prefix keys and the observer: docs/kvpool.md. With no observer set, every hook site costs
one ``is None`` test; torch is optional (``vramscope.hooks.kvpool_tier``).
"""

from __future__ import annotations

import logging
import traceback
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, NoReturn

from vramscope.hooks.kvpool_prefix import Key, Request, leading_keys
from vramscope.hooks.kvpool_tier import (
    DeviceBuffer,
    HostTier,
    copy_block,
    load_torch,
    log_no_torch_once,
)
from vramscope.hooks.kvpool_types import (
    Allocation,
    CheckReport,
    KVPoolError,
    KVPoolObserver,
    KVPoolStats,
    check_count,
    dtype_name_and_bytes,
    kv_cache_bytes,
    require_non_negative_int,
    require_positive_int,
)

if TYPE_CHECKING:
    import torch

__all__ = ["KVBlockPool", "KVPoolObserver", "KVPoolError", "Allocation", "KVPoolStats",
           "CheckReport", "kv_cache_bytes"]

log = logging.getLogger("vramscope.kvpool")
_HOOKS = ("on_allocate", "on_extend", "on_free", "on_hit", "on_evict", "on_offload", "on_restore",
          "on_allocate_failed", "on_check")
_FINISHED_MEMORY = 4096  # finished request ids remembered, to tell a double free from a typo
_Plan = list[tuple[Key, int | None]]  # matched leading blocks: (key, device block or None)
_Hook = Callable[..., None]  # a bound observer method, called with the pool first


class KVBlockPool:
    """A paged KV block pool. See the module docstring for the states and invariants.

    ``dtype`` is a name (``"bfloat16"``) or a torch dtype. Give exactly one of ``num_blocks``
    or ``budget_bytes`` (the pool takes as many whole blocks as fit). ``buffer=False`` keeps
    bookkeeping only; so does a machine without torch. ``cpu_tier_bytes > 0`` offloads evicted
    blocks to host memory (pinned when CUDA is available) instead of dropping them.
    """

    # The observer's methods, bound by the ``observer`` setter (None: not overridden).
    _on_allocate: _Hook | None
    _on_extend: _Hook | None
    _on_free: _Hook | None
    _on_hit: _Hook | None
    _on_evict: _Hook | None
    _on_offload: _Hook | None
    _on_restore: _Hook | None
    _on_allocate_failed: _Hook | None
    _on_check: _Hook | None

    def __init__(self, *, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: str | torch.dtype = "float16", block_size: int = 16,
                 num_blocks: int | None = None, budget_bytes: int | None = None,
                 device: str | torch.device = "cpu", buffer: bool = True,
                 cpu_tier_bytes: int = 0, prefix_caching: bool = True,
                 observer: KVPoolObserver | None = None) -> None:
        for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim), ("block_size", block_size)):
            require_positive_int(name, value)
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.block_size = block_size
        self.dtype_name, self.bytes_per_element = dtype_name_and_bytes(dtype)
        self.bytes_per_block = kv_cache_bytes(num_layers, num_kv_heads, head_dim, block_size,
                                              self.bytes_per_element)
        self.num_blocks = self._resolve_num_blocks(num_blocks, budget_bytes)
        self.size_bytes = self.num_blocks * self.bytes_per_block
        self.prefix_caching = prefix_caching
        self._init_bookkeeping()
        block_shape = (num_layers, 2, block_size, num_kv_heads, head_dim)
        torch = load_torch() if buffer else None
        if buffer and torch is None:
            log_no_torch_once()
        self.buffer = (DeviceBuffer(torch, block_shape, self.num_blocks, self.dtype_name, device)
                       if torch is not None else None)
        require_non_negative_int("cpu_tier_bytes", cpu_tier_bytes)
        self.tier = (HostTier(cpu_tier_bytes, self.bytes_per_block, torch, block_shape,
                              self.dtype_name) if cpu_tier_bytes else None)
        self.observer = observer

    def _resolve_num_blocks(self, num_blocks: int | None, budget_bytes: int | None) -> int:
        if (num_blocks is None) == (budget_bytes is None):
            raise KVPoolError("give exactly one of num_blocks or budget_bytes, got "
                              f"num_blocks={num_blocks!r}, budget_bytes={budget_bytes!r}")
        if num_blocks is not None:
            require_positive_int("num_blocks", num_blocks)
            return num_blocks
        require_positive_int("budget_bytes", budget_bytes)
        assert budget_bytes is not None  # exactly one of the two was given
        fitted = budget_bytes // self.bytes_per_block
        if fitted < 1:
            raise KVPoolError(f"budget_bytes={budget_bytes} is smaller than one block "
                              f"({self.bytes_per_block} bytes)")
        return fitted

    def _init_bookkeeping(self) -> None:
        n = self.num_blocks
        self._free = list(range(n - 1, -1, -1))  # a stack: pop() hands out block 0 first
        self._ref = [0] * n
        self._fill = [0] * n  # tokens written in each block
        self._key: list[Hashable | None] = [None] * n
        self._key_to_block: dict[Hashable, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached blocks, least recent first
        self._requests: dict[str, Request] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._tokens_used = 0
        self._counters = dict.fromkeys(("prefix_query_tokens", "prefix_hit_tokens", "evictions",
                                        "offloads", "restores", "failed_allocations",
                                        "observer_errors"), 0)

    # --- observer --------------------------------------------------------------------------
    @property
    def observer(self) -> KVPoolObserver | None:
        return self._observer

    @observer.setter
    def observer(self, observer: KVPoolObserver | None) -> None:
        """Bind the observer's methods once; a method left as the base class's no-op is not
        bound, so its hook site costs one ``is None`` test, as with no observer at all."""
        self._observer = observer
        for name in _HOOKS:
            method = getattr(observer, name, None)
            if getattr(type(observer), name, None) is getattr(KVPoolObserver, name):
                method = None
            setattr(self, "_" + name, method)

    def _emit(self, method: _Hook, *args: object) -> None:
        """Call an observer method; its failure is logged once and counted, never raised."""
        try:
            method(self, *args)
        except Exception:
            self._observer_failed(method)

    def _observer_failed(self, method: _Hook) -> None:
        self._counters["observer_errors"] += 1
        if self._counters["observer_errors"] == 1:
            # The traceback as text: a kept record holding exc_info would hold this pool (and
            # its buffer) in the traceback's frames.
            log.warning("vramscope: KV pool observer %s failed in %s; further failures are only "
                        "counted\n%s", type(self._observer).__name__, method.__name__,
                        traceback.format_exc())

    # --- queries ---------------------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        """Whether ``allocate`` of ``num_tokens`` would succeed now, without counting hits."""
        return self.blocks_for(num_tokens) <= len(self._free) + len(self._lru)

    def block_table(self, request_id: str) -> tuple[int, ...]:
        return tuple(self._live(request_id).blocks)

    def num_tokens(self, request_id: str) -> int:
        return self._live(request_id).num_tokens

    @property
    def request_ids(self) -> tuple[str, ...]:
        return tuple(self._requests)

    def refcount(self, block_id: int) -> int:
        return self._ref[block_id]

    def stats(self) -> KVPoolStats:
        used = self.num_blocks - len(self._free) - len(self._lru)
        c = self._counters
        tier = self.tier
        return KVPoolStats(
            self.num_blocks, used, len(self._free), len(self._lru), self.block_size,
            self.bytes_per_block, self.size_bytes, self._tokens_used, used / self.num_blocks,
            self._tokens_used / (used * self.block_size) if used else None, len(self._requests),
            c["prefix_query_tokens"], c["prefix_hit_tokens"], c["evictions"], c["offloads"],
            c["restores"], len(tier) if tier else 0, tier.bytes_used if tier else 0,
            tier.capacity_bytes if tier else 0, c["failed_allocations"], c["observer_errors"])

    # --- allocate / extend / free ----------------------------------------------------------
    def allocate(self, request_id: str, num_tokens: int | None = None,
                 token_ids: Sequence[int] | None = None) -> Allocation:
        """Give a new request blocks for ``num_tokens`` tokens (default ``len(token_ids)``).

        With ``token_ids`` (and prefix caching on), cached leading blocks are shared instead of
        taken fresh, and their tokens are reported as ``hit_tokens``. Raises ``KVPoolError``
        (pool unchanged) for a duplicate id, a bad count or too few blocks.
        """
        num_tokens = self._check_new_request(request_id, num_tokens, token_ids)
        plan = self._match_prefix(token_ids, num_tokens) if token_ids is not None else []
        fresh = self.blocks_for(num_tokens) - len(plan)
        restores = sum(1 for _, block in plan if block is None)
        reusable = sum(1 for _, block in plan if block is not None and self._ref[block] == 0)
        if fresh + restores > len(self._free) + len(self._lru) - reusable:
            self._fail(request_id, num_tokens, "not enough free or evictable blocks")
        blocks = self._take_matched(plan)
        hit_tokens = len(blocks) * self.block_size
        blocks += self._take_fresh(fresh, num_tokens - hit_tokens)
        req = Request(blocks, num_tokens, list(token_ids) if token_ids is not None else None)
        self._requests[request_id] = req
        self._finished.pop(request_id, None)
        self._key_full_blocks(req)
        result = Allocation(request_id, tuple(blocks), num_tokens, hit_tokens,
                            restores * self.block_size)
        if token_ids is not None and self.prefix_caching:
            self._counters["prefix_query_tokens"] += num_tokens
            self._counters["prefix_hit_tokens"] += hit_tokens
        if self._on_allocate is not None:  # inlined _emit: a frame less on the hot path
            try:
                self._on_allocate(self, result)
            except Exception:
                self._observer_failed(self._on_allocate)
        if self._on_hit is not None and token_ids is not None and self.prefix_caching:
            self._emit(self._on_hit, request_id, hit_tokens, num_tokens)
        return result

    def extend(self, request_id: str, num_new_tokens: int | None = None,
               token_ids: Sequence[int] | None = None) -> tuple[int, ...]:
        """Grow a request by ``num_new_tokens`` (default ``len(token_ids)``); returns new blocks.

        Without ``token_ids`` the request's token chain ends, so its later blocks are not
        keyed for prefix reuse. Raises ``KVPoolError`` (pool unchanged) past the pool's room.
        """
        req = self._live(request_id)
        n = check_count(num_new_tokens, token_ids, "num_new_tokens", request_id)
        room = len(req.blocks) * self.block_size - req.num_tokens
        if n <= room:  # the decode step's common case: the last block has room
            new_blocks: list[int] = []
            self._fill[req.blocks[-1]] += n
            self._tokens_used += n
        else:
            needed = self.blocks_for(req.num_tokens + n) - len(req.blocks)
            if needed > len(self._free) + len(self._lru):
                self._fail(request_id, n, f"extending by {n} tokens needs {needed} more blocks")
            self._fill[req.blocks[-1]] += room
            self._tokens_used += room
            new_blocks = self._take_fresh(needed, n - room)
            req.blocks += new_blocks
        req.num_tokens += n
        if req.tokens is not None and token_ids is not None:
            req.tokens.extend(token_ids)
            self._key_full_blocks(req)
        else:
            req.tokens = None
        if not new_blocks:  # decode inside a block stays quiet
            return ()
        new = tuple(new_blocks)  # one tuple for the observer and the caller
        if self._on_extend is not None:
            try:  # inlined _emit, as for allocate and free
                self._on_extend(self, request_id, new, req.num_tokens)
            except Exception:
                self._observer_failed(self._on_extend)
        return new

    def free(self, request_id: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """End a request: returns (blocks released to free, blocks kept cached).

        Blocks are released last-first, so a request's tail is evicted before its prefix.
        """
        req = self._requests.pop(request_id, None)
        if req is None:
            self._raise_unknown(request_id, "free")
        released: list[int] = []
        cached: list[int] = []
        for block in reversed(req.blocks):
            self._ref[block] -= 1
            if self._ref[block]:
                continue
            self._tokens_used -= self._fill[block]
            if self._key[block] is not None:
                self._lru[block] = None
                cached.append(block)
            else:
                self._fill[block] = 0
                self._free.append(block)
                released.append(block)
        self._remember_finished(request_id)
        result = tuple(released), tuple(cached)  # once, for observer and caller
        if self._on_free is not None:  # inlined _emit: a frame less on the hot path
            try:
                self._on_free(self, request_id, *result)
            except Exception:
                self._observer_failed(self._on_free)
        return result

    # --- tensors ---------------------------------------------------------------------------
    def write_kv(self, request_id: str, layer: int, start: int, key: torch.Tensor,
                 value: torch.Tensor) -> None:
        """Write ``key``/``value`` ``(n, num_kv_heads, head_dim)`` at token ``start``."""
        req = self._live(request_id)
        if start < 0 or start + key.shape[0] > req.num_tokens:
            raise KVPoolError(f"tokens [{start}, {start + key.shape[0]}) are outside request "
                              f"{request_id!r}'s {req.num_tokens} tokens", request_id)
        self._require_buffer().write(req.blocks, layer, start, key, value)

    def read_kv(self, request_id: str, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """All of a request's K and V for ``layer``, each ``(num_tokens, heads, head_dim)``."""
        req = self._live(request_id)
        return self._require_buffer().read(req.blocks, layer, 0, req.num_tokens)

    def _require_buffer(self) -> DeviceBuffer:
        if self.buffer is None:
            raise KVPoolError("this pool keeps bookkeeping only (buffer=False or no torch); "
                              "it holds no KV tensors")
        return self.buffer

    # --- the bookkeeping check -------------------------------------------------------------
    def check(self, live_request_ids: Iterable[str] | None = None) -> CheckReport:
        """Verify the invariants; with ``live_request_ids``, blocks held by any other request
        are orphaned. ``check_idle()`` is ``check(())``: when idle, nothing may hold a block."""
        from vramscope.hooks.kvpool_check import run_check

        report = run_check(self, None if live_request_ids is None else set(live_request_ids))
        if self._on_check is not None:
            self._emit(self._on_check, report)
        return report

    def check_idle(self) -> CheckReport:
        return self.check(())

    # --- internals -------------------------------------------------------------------------
    def _check_new_request(self, request_id: str, num_tokens: int | None,
                           token_ids: Sequence[int] | None) -> int:
        if not isinstance(request_id, str) or not request_id:
            raise KVPoolError(f"request_id must be a non-empty string, got {request_id!r}")
        if request_id in self._requests:
            raise KVPoolError(f"request {request_id!r} already holds blocks; extend() it or "
                              "free() it first", request_id)
        return check_count(num_tokens, token_ids, "num_tokens", request_id)

    def _live(self, request_id: str) -> Request:
        req = self._requests.get(request_id)
        if req is None:
            self._raise_unknown(request_id, "use")
        return req

    def _raise_unknown(self, request_id: str, action: str) -> NoReturn:
        if request_id in self._finished:
            raise KVPoolError(f"cannot {action} request {request_id!r}: it was already freed "
                              "(double free)", request_id)
        raise KVPoolError(f"cannot {action} request {request_id!r}: the pool has no such "
                          "request", request_id)

    def _remember_finished(self, request_id: str) -> None:
        self._finished[request_id] = None
        if len(self._finished) > _FINISHED_MEMORY:
            self._finished.popitem(last=False)

    def _fail(self, request_id: str, num_tokens: int, reason: str) -> NoReturn:
        self._counters["failed_allocations"] += 1
        if self._on_allocate_failed is not None:
            self._emit(self._on_allocate_failed, request_id, num_tokens, reason)
        free, cached = len(self._free), len(self._lru)
        raise KVPoolError(f"cannot allocate for request {request_id!r}: {reason} ({free} free, "
                          f"{cached} cached of {self.num_blocks}; use can_allocate() to wait)",
                          request_id)

    def _match_prefix(self, token_ids: Sequence[int], num_tokens: int) -> _Plan:
        """Leading full blocks whose key is cached: ``(key, block)`` on the device, or
        ``(key, None)`` in the CPU tier. Stops at the first miss."""
        if not self.prefix_caching:
            return []
        plan: _Plan = []
        for key in leading_keys(token_ids, num_tokens, self.block_size):
            block = self._key_to_block.get(key)
            if block is None and (self.tier is None or key not in self.tier):
                break
            plan.append((key, block))
        return plan

    def _take_matched(self, plan: _Plan) -> list[int]:
        """Reference the device hits, then restore the tier hits; blocks in prompt order.

        Device hits first, so a restore's eviction cannot reclaim a block this prompt matched;
        tier slots are claimed first, so an offload cannot push out a slot about to be read.
        """
        slots = {key: self._tier().claim(key) for key, block in plan if block is None}
        for _, block in plan:
            if block is not None:
                self._reference(block)
        return [block if block is not None else self._restore(key, slots[key])
                for key, block in plan]

    def _reference(self, block: int) -> None:
        if self._ref[block] == 0:
            del self._lru[block]
            self._tokens_used += self._fill[block]
        self._ref[block] += 1

    def _tier(self) -> HostTier:
        """The CPU tier, where only a pool with one gets (a key found in it, an eviction)."""
        assert self.tier is not None
        return self.tier

    def _restore(self, key: Hashable, slot: int) -> int:
        block = self._take_block()
        tier = self._tier()
        if self.buffer is not None and tier.host is not None:
            copy_block(self.buffer.tensor, block, tier.host, slot)
        tier.release(slot)
        self._key[block], self._key_to_block[key] = key, block
        self._ref[block], self._fill[block] = 1, self.block_size
        self._tokens_used += self.block_size
        self._counters["restores"] += 1
        if self._on_restore is not None:
            self._emit(self._on_restore, block, self.bytes_per_block)
        return block

    def _take_fresh(self, count: int, num_tokens: int) -> list[int]:
        """``count`` fresh blocks holding ``num_tokens`` tokens, the last one possibly partial."""
        blocks: list[int] = []
        for _ in range(count):
            block = self._take_block()
            fill = min(self.block_size, num_tokens)
            num_tokens -= fill
            self._ref[block], self._fill[block] = 1, fill
            self._tokens_used += fill
            blocks.append(block)
        return blocks

    def _take_block(self) -> int:
        """A free block; only when none is left, the least recently used cached one."""
        if self._free:
            return self._free.pop()
        block, _ = self._lru.popitem(last=False)
        self._evict(block)
        return block

    def _evict(self, block: int) -> None:
        key = self._key[block]
        del self._key_to_block[key]
        self._key[block], self._fill[block] = None, 0
        self._counters["evictions"] += 1
        offloaded = self.tier is not None and self._offload(key, block)
        if self._on_evict is not None:
            self._emit(self._on_evict, block, offloaded)

    def _offload(self, key: Hashable, block: int) -> bool:
        tier = self._tier()
        slot = tier.put(key)
        if slot is None:
            return False
        if self.buffer is not None and tier.host is not None:
            copy_block(tier.host, slot, self.buffer.tensor, block)
        self._counters["offloads"] += 1
        if self._on_offload is not None:
            self._emit(self._on_offload, block, self.bytes_per_block)
        return True

    def _key_full_blocks(self, req: Request) -> None:
        """Key the request's newly full blocks by their token chain, for later prompts."""
        if req.tokens is None or not self.prefix_caching:
            return
        for i, key in req.newly_full_keys(self.block_size):
            block = req.blocks[i]
            if self._key[block] is None and key not in self._key_to_block:
                self._key[block], self._key_to_block[key] = key, block

