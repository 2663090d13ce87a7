"""The KV view of transformers' continuous batching: observe a ``PagedAttentionCache``.

transformers preallocates one pool for the KV cache, so torch's counters stay flat while it
fills: ``observe_paged_attention_cache(cache, sink)`` wraps a few methods of that cache instance
(the block manager of 5.17 or the cache allocators of 5.24: docs/kvpool.md, "transformers") and
puts the records vramscope's own pool does. Anything unexpected turns the view off with one log
line and leaves the cache untouched.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Callable
from typing import Any

from vramscope.agent.clock import SYSTEM_CLOCK, Clock, SystemClock
from vramscope.agent.records import Event, Phase, Sample
from vramscope.hooks.sink import Record, RecordSink

# ``cache: Any`` throughout: transformers' PagedAttentionCache and its internals, read by duck
# typing because they differ between versions (the layouts below); nothing here relies on a type.
log = logging.getLogger("vramscope.hooks")
_WATCH_ATTR = "_vramscope_kv_watch"
UNREFERENCED_EVERY_S = 1.0  # the unreferenced-blocks check runs at most this often (a set of
# every block id in the tables: bounded work per second, however fast requests end)


class BlockManagerLayout:
    """transformers ~5.17: one ``BlockManager`` behind ``PagedAttentionCache``."""

    name = "block_manager"
    requires = ("num_blocks", "get_num_free_blocks", "allocate_blocks", "free_blocks",
                "group_cache_managers")

    def used_cached(self, cache: Any) -> tuple[int, int | None]:
        initialized = getattr(getattr(cache, "_block_manager", None), "_init_block_ids", None)
        cached = len(initialized) if initialized is not None else None
        return cache.num_blocks - cache.get_num_free_blocks(), cached

    def tables(self, cache: Any) -> list[dict[str, list[int]]]:
        return [cm.block_table for cm in cache.group_cache_managers]

    def unreferenced(self, cache: Any, used: int) -> int | None:
        """Blocks used that no request's block table holds (the groups share one block
        manager, so its block ids are the pool's)."""
        held: set[int] = set()
        for table in self.tables(cache):
            for blocks in table.values():
                held.update(blocks)
        return used - len(held)


class AllocatorLayout:
    """transformers ~5.24: sectors handed to per-attention-type cache allocators."""

    name = "cache_allocators"
    requires = ("num_blocks", "cache_allocators", "compute_free_capacity",
                "can_store_request_tokens", "free_blocks", "num_sectors", "bytes_per_sector")

    def used_cached(self, cache: Any) -> tuple[int, int | None]:
        """In whole-model blocks (``cache.num_blocks`` units), from bytes: allocators of
        different attention types have blocks of different sizes."""
        total_bytes = cache.num_sectors * cache.bytes_per_sector
        per_block = total_bytes / cache.num_blocks
        free_bytes = cache.compute_free_capacity(relative=False)
        cached_bytes = sum(len(ca.ledger.cached_blocks) * ca.bytes_per_block
                           for ca in cache.cache_allocators.values())
        used = round((total_bytes - free_bytes - cached_bytes) / per_block)
        return used, round(cached_bytes / per_block)

    def tables(self, cache: Any) -> list[dict[str, list[int]]]:
        return [ca.block_table for ca in cache.cache_allocators.values()]

    def unreferenced(self, cache: Any, used: int) -> int | None:
        """None: each allocator's tables count its own blocks, not the pool's (the idle
        check alone applies)."""
        return None


Layout = AllocatorLayout | BlockManagerLayout
LAYOUTS: tuple[Layout, ...] = (AllocatorLayout(), BlockManagerLayout())


def pick_layout(cache: Any) -> tuple[Layout | None, str]:
    """The layout ``cache`` has, or None and what the closest one lacks."""
    best: tuple[Layout, list[str]] | None = None
    for layout in LAYOUTS:
        missing = [name for name in layout.requires if not hasattr(cache, name)]
        if not missing:
            return layout, ""
        if best is None or len(missing) < len(best[1]):
            best = (layout, missing)
    assert best is not None  # LAYOUTS is not empty
    return None, f"no {', '.join(best[1])} (closest layout: {best[0].name})"


def observe_paged_attention_cache(cache: Any, sink: RecordSink | None, device: int = 0, *,
                                  clock: Clock = SYSTEM_CLOCK, sample_interval_s: float = 0.5,
                                  extend_events: bool = False,
                                  phase_fn: Callable[[], Phase] | None = None) -> bool:
    """Observe ``cache`` (a transformers ``PagedAttentionCache``); False when it cannot be.

    Idempotent: a cache already observed stays observed by its first watcher.
    """
    if getattr(cache, _WATCH_ATTR, None) is not None:
        return True
    if sink is None:
        log.info("vramscope: KV view of transformers' cache not observed: no sink to put "
                 "records to (pass sink= to attach_transformers)")
        return False
    layout, missing = pick_layout(cache)
    if layout is None:
        log.info("vramscope: KV view of transformers' %s not observed: %s. This transformers "
                 "version's internals differ from 5.17 and 5.24; the cache is untouched.",
                 type(cache).__name__, missing)
        return False
    watch = PagedCacheWatch(cache, layout, sink, device, clock, sample_interval_s,
                            extend_events, phase_fn or _default_phase_fn())
    watch.install()
    setattr(cache, _WATCH_ATTR, watch)
    return True


def unobserve_paged_attention_cache(cache: Any) -> None:
    watch = getattr(cache, _WATCH_ATTR, None)
    if watch is not None:
        watch.uninstall()
        delattr(cache, _WATCH_ATTR)


def install_paged_cache_hook(sink: RecordSink | None, device: int = 0,
                             **kwargs: Any) -> Callable[[], None]:
    """Observe every ``PagedAttentionCache`` built from now on; returns the undo function.

    For code that builds caches without ``attach_transformers``: wraps the class's
    ``__init__``. Returns a no-op undo (and logs once) when transformers has no such class.
    """
    try:
        from transformers.generation.continuous_batching.cache import PagedAttentionCache
    except ImportError as exc:
        log.info("vramscope: transformers' PagedAttentionCache not found (%s); KV view off", exc)
        return lambda: None
    original = PagedAttentionCache.__init__

    def __init__(self: Any, *args: Any, **kw: Any) -> None:
        original(self, *args, **kw)
        try:
            observe_paged_attention_cache(self, sink, device, **kwargs)
        except Exception as exc:  # never into the model's set-up
            log.warning("vramscope: observing a PagedAttentionCache failed: %s", repr(exc))

    PagedAttentionCache.__init__ = __init__  # type: ignore[method-assign]  # the class patch

    def undo() -> None:
        PagedAttentionCache.__init__ = original  # type: ignore[method-assign]
    return undo


def weak_method(obj: Any, name: str) -> Callable[..., Any]:
    """``obj.name`` as a callable that does not keep ``obj`` alive: the class's function called
    through a weak reference. A wrapper stored on the object itself must call the original this
    way, or object -> wrapper -> bound method -> object is a cycle that only the cyclic GC
    frees, holding (for a KV cache) the whole pool until then.

    A method already set on the instance (another library's wrapper) is kept as it is."""
    if name in vars(obj):
        return vars(obj)[name]  # type: ignore[no-any-return]
    function = getattr(type(obj), name)
    ref = weakref.ref(obj)

    def call(*args: Any, **kwargs: Any) -> Any:
        return function(ref(), *args, **kwargs)
    return call


def _default_phase_fn() -> Callable[[], Phase] | None:
    try:
        from vramscope.hooks.phase import current_phase
    except ImportError:
        return None
    return current_phase


class PagedCacheWatch:
    """The wrappers around one cache and the records they make. Counters are attributes."""

    def __init__(self, cache: Any, layout: Layout, sink: RecordSink, device: int, clock: Clock,
                 sample_interval_s: float, extend_events: bool,
                 phase_fn: Callable[[], Phase] | None) -> None:
        # Weakly: the watch hangs on the cache (``_WATCH_ATTR``) and its wrappers sit in the
        # cache's __dict__, so a strong reference back would make a cycle that keeps the whole
        # KV pool alive until the cyclic GC runs.
        self._cache_ref = weakref.ref(cache)
        self.layout, self.sink, self.device = layout, sink, device
        system = type(clock) is SystemClock
        self._time_s = time.time if system else clock.time_s
        self._monotonic_s = time.monotonic if system else clock.monotonic_s
        self.sample_interval_s = sample_interval_s
        self.extend_events = extend_events
        self.phase_fn = phase_fn
        self.pid = os.getpid()
        self.enabled = True
        self.live: set[str] = set()  # requests that got blocks and were not freed yet
        self.tokens: dict[str, int] = {}  # request -> tokens it holds (past + query)
        self.hits: dict[str, int] = {}  # request -> prefix hit tokens, until its kv_alloc
        self.waiting: set[str] = set()  # requests refused once (kv_alloc_failed already put)
        self.prefix_query_tokens = self.prefix_hit_tokens = self.failed_allocations = 0
        self._next_sample_s = float("-inf")
        self._next_unreferenced_s = float("-inf")
        self._unreferenced_reported = 0  # the count the last unreferenced check reported
        self._originals: dict[str, bool] = {}

    @property
    def cache(self) -> Any:
        return self._cache_ref()

    # --- wrapping ----------------------------------------------------------------------------
    def install(self) -> None:
        wrappers = {"free_blocks": self._wrap_free, "search_prefix_match": self._wrap_prefix,
                    "extend_read_and_write_indices": self._wrap_tokens,
                    "fill_block_table": self._wrap_tokens}
        if self.layout.name == "block_manager":
            wrappers["allocate_blocks"] = self._wrap_allocate_blocks
        else:
            wrappers["can_store_request_tokens"] = self._wrap_can_store
        cache = self.cache
        for name, make in wrappers.items():
            if getattr(cache, name, None) is not None:
                self._originals[name] = True
                setattr(cache, name, make(weak_method(cache, name)))

    def uninstall(self) -> None:
        cache = self.cache
        for name in self._originals:
            if cache is not None and name in vars(cache):
                delattr(cache, name)
        self._originals.clear()

    def _guard(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run an observation (or a read before the wrapped call): its result, None when the
        view is (or turns) off; the first failure turns the view off with one log line."""
        if not self.enabled:
            return None
        try:
            return fn(*args)
        except Exception as exc:
            self.enabled = False
            # as text: a kept record holding exc would hold its frames, the cache among them
            log.warning("vramscope: KV view of transformers' cache turned off: %s while "
                        "reading its %s layout (internals differ from this version's)",
                        repr(exc), self.layout.name)
            return None

    def _wrap_allocate_blocks(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def allocate_blocks(n_blocks: int, request_id: str, *args: Any, **kw: Any) -> Any:
            result = original(n_blocks, request_id, *args, **kw)
            self._guard(self._allocated, str(request_id), result is not None,
                        n_blocks if result is not None else 0, None)
            return result
        return allocate_blocks

    def _wrap_can_store(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def can_store_request_tokens(state: Any, request_len: int, dry_run: bool = False,
                                     *args: Any, **kw: Any) -> Any:
            if dry_run:
                return original(state, request_len, dry_run, *args, **kw)
            rid = str(getattr(state, "request_id", ""))
            before = self._guard(self._blocks_of, rid)
            result = original(state, request_len, dry_run, *args, **kw)
            if self.enabled and before is not None:
                self._guard(self._stored, state, rid, request_len, bool(result), before)
            return result
        return can_store_request_tokens

    def _wrap_free(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def free_blocks(request_id: str, *args: Any, **kw: Any) -> Any:
            before = self._guard(self.layout.used_cached, self.cache)
            result = original(request_id, *args, **kw)
            if before is not None:
                self._guard(self._freed, str(request_id), before)
            return result
        return free_blocks

    def _wrap_prefix(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def search_prefix_match(request_id: str, prompt_ids: Any, *args: Any, **kw: Any) -> Any:
            result = original(request_id, prompt_ids, *args, **kw)
            self._guard(self._prefix, str(request_id), len(prompt_ids), result)
            return result
        return search_prefix_match

    def _wrap_tokens(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def with_tokens(request_id: str, past_length: int, query_length: int, *args: Any,
                        **kw: Any) -> Any:
            if request_id in self.live:
                self.tokens[request_id] = int(past_length) + int(query_length)
            return original(request_id, past_length, query_length, *args, **kw)
        return with_tokens

    # --- observations ------------------------------------------------------------------------
    def _blocks_of(self, request_id: str) -> int:
        return sum(len(table.get(request_id, ())) for table in self.layout.tables(self.cache))

    def _stored(self, state: Any, rid: str, request_len: int, ok: bool, before: int) -> None:
        tokens = state.current_len() + request_len if ok else None
        self._allocated(rid, ok, self._blocks_of(rid) - before, tokens)

    def _allocated(self, rid: str, ok: bool, new_blocks: int, tokens: int | None) -> None:
        if not ok:
            self.failed_allocations += 1
            if rid not in self.waiting:
                self.waiting.add(rid)
                self._event("kv_alloc_failed", rid, {"reason": "not enough free blocks"})
            return
        self.waiting.discard(rid)
        if tokens is not None:
            self.tokens[rid] = tokens
        if rid not in self.live:
            self.live.add(rid)
            data = {"blocks": self._blocks_of(rid), "hit_tokens": self.hits.pop(rid, 0)}
            if tokens is not None:
                data["tokens"] = tokens
            self._event("kv_alloc", rid, data)
        elif new_blocks > 0 and self.extend_events:
            self._event("kv_alloc", rid, {"blocks": new_blocks, "extend": True})
        self._maybe_sample()

    def _freed(self, rid: str, before: tuple[int, int | None]) -> None:
        used, cached = self.layout.used_cached(self.cache)
        if rid in self.live or used != before[0]:
            data = {"blocks_released": before[0] - used}
            if cached is not None and before[1] is not None:
                data["blocks_cached"] = cached - before[1]
                data["blocks_released"] -= data["blocks_cached"]
            self._event("kv_free", rid, data)
        self.live.discard(rid)
        self.tokens.pop(rid, None)
        self.hits.pop(rid, None)
        self.waiting.discard(rid)
        if not any(self.layout.tables(self.cache)):
            self._idle_check(used)
        else:
            self._unreferenced_check(used)
        self._maybe_sample()

    def _unreferenced_check(self, used: int) -> None:
        """While requests run: blocks used that no block table holds, at most once every
        ``UNREFERENCED_EVERY_S``, reported when their count changed. Where frees lag (5.17 on
        a GPU frees a finished request's blocks steps later, so the pool is never empty while
        traffic lasts) the idle check alone would speak only when the server stops."""
        now = self._monotonic_s()
        if now < self._next_unreferenced_s:
            return
        self._next_unreferenced_s = now + UNREFERENCED_EVERY_S
        lost = self.layout.unreferenced(self.cache, used)
        if lost is None or lost == self._unreferenced_reported or (
                lost <= 0 and not self._unreferenced_reported):
            return
        self._unreferenced_reported = max(0, lost)
        if lost > 0:
            self._event("kv_orphaned_blocks", None,
                        {"blocks": lost, "block_ids": [], "owners": [],
                         "problems": [f"{lost} blocks used that no request's block table "
                                      "holds"]})

    def _idle_check(self, used: int) -> None:
        """No request holds a block table, so no block may be used (SGLang's idle check)."""
        if used > 0:
            self._event("kv_orphaned_blocks", None,
                        {"blocks": used, "block_ids": [], "owners": [],
                         "problems": [f"{used} blocks used while no request holds any"]})
            self._put(self._sample())

    def _prefix(self, rid: str, query_tokens: int, hit_tokens: Any) -> None:
        hit = int(hit_tokens or 0)
        self.prefix_query_tokens += query_tokens
        self.prefix_hit_tokens += hit
        if hit:
            self.hits[rid] = hit

    # --- records -----------------------------------------------------------------------------
    def read(self) -> Sample:
        return self._sample()

    def _sample(self) -> Sample:
        used, cached = self.layout.used_cached(self.cache)
        tokens = sum(self.tokens.values()) if self.tokens or not self.live else None
        return Sample(self._time_s(), self.device, self._phase() or Phase.UNKNOWN, "kv",
                      self.pid, kv_blocks_used=used, kv_blocks_total=int(self.cache.num_blocks),
                      kv_blocks_cached=cached, kv_tokens_used=tokens)

    def _maybe_sample(self) -> None:
        now_s = self._monotonic_s()
        if now_s >= self._next_sample_s:
            self._next_sample_s = now_s + self.sample_interval_s
            self._put(self._sample())

    def _phase(self) -> Phase | None:
        return self.phase_fn() if self.phase_fn is not None else None

    def _event(self, name: str, request_id: str | None, data: dict[str, Any]) -> None:
        self._put(Event(self._time_s(), name, self.device, self.pid, self._phase(), request_id,
                        data))

    def _put(self, record: Record) -> None:
        try:
            self.sink.put(record)
        except Exception:  # a sink must not raise; if one does, the server still must not see it
            pass
