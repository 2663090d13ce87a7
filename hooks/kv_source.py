"""vramscope's own KV pool observer: turns pool activity into records for a ``RecordSink``.

Rate-limited ``Sample``s of the pool's counters (``source="kv"``, at most one per
``sample_interval_s`` on the events' clock) and ``kv_alloc`` / ``kv_free`` / ``kv_alloc_failed``
/ ``kv_orphaned_blocks`` events: docs/kvpool.md, "Observer". Events with equal data share one
read-only ``data`` dict (a bounded memo). The bookkeeping check runs when a free leaves the pool
with no requests (at most once per ``check_interval_s``) and on demand; nothing here blocks or
raises.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from vramscope.agent.clock import SYSTEM_CLOCK, Clock, SystemClock
from vramscope.agent.records import Event, Phase, Sample
from vramscope.hooks.kvpool_types import Allocation, CheckReport, KVPoolObserver
from vramscope.hooks.sink import Record, RecordSink

if TYPE_CHECKING:
    from vramscope.hooks.kvpool import KVBlockPool

_new_event = tuple.__new__
_MAX_IDS_IN_EVENT = 32  # bound the orphan event: a leak of 10k blocks is still one line
_SHARED_DATA_MAX = 1024  # data dicts kept per event kind; a full memo starts over


class KVSource(KVPoolObserver):
    """Observe a pool: ``KVSource(sink).attach(pool)``; ``detach()`` restores the free path."""

    def __init__(self, sink: RecordSink, *, device: int = 0, clock: Clock = SYSTEM_CLOCK,
                 sample_interval_s: float = 0.5, check_interval_s: float = 10.0,
                 pid: int | None = None, phase_fn: Callable[[], Phase] | None = None,
                 extend_events: bool = False) -> None:
        if not sample_interval_s >= 0:
            raise ValueError(f"sample_interval_s must be >= 0, got {sample_interval_s!r}")
        self.sink = sink
        self.device = device
        self.clock = clock
        self.sample_interval_s = sample_interval_s
        self.check_interval_s = check_interval_s
        self.extend_events = extend_events
        if not extend_events:
            # Not even called, then: a block crossing costs the pool one ``is None`` test.
            self.on_extend = None  # type: ignore[assignment]
        self.pid = os.getpid() if pid is None else pid
        self._phase_fn = phase_fn
        # The system clock's functions themselves, not its methods: a call less per event.
        system = type(clock) is SystemClock
        self._time_s = time.time if system else clock.time_s
        self._monotonic_s = time.monotonic if system else clock.monotonic_s
        self._sink_put = sink.put
        self._sampled_s = float("inf")  # with the next: the first event samples
        self._next_sample_s = float("-inf")
        self._next_check_s = float("-inf")
        # Events with equal data share one dict (read-only, as every record's data): extend
        # and free events repeat a few values (a decoding request takes a block every
        # block_size tokens), and a buffered record that holds no dict of its own is smaller.
        self._extend_data: dict[tuple[int, int], dict[str, Any]] = {}
        self._free_data: dict[tuple[int, int], dict[str, Any]] = {}
        self._pool_ref: Callable[[], KVBlockPool | None] = _no_pool

    @property
    def pool(self) -> KVBlockPool | None:
        """The attached pool, or None (detached, or the pool died)."""
        return self._pool_ref()

    def attach(self, pool: KVBlockPool) -> KVSource:
        # Weakly: the pool holds this observer (its bound methods), so a strong reference back
        # would make a cycle that keeps the pool, and its preallocated buffer, alive until the
        # cyclic GC runs, or for as long as the server keeps this source (issue 13).
        pool.observer = self
        self._pool_ref = weakref.ref(pool)
        return self

    def detach(self) -> None:
        pool = self.pool
        if pool is not None and pool.observer is self:
            pool.observer = None
        self._pool_ref = _no_pool

    # --- the one-method seam ---------------------------------------------------------------
    def read(self) -> Sample | None:
        """A sample of the attached pool now, or None when detached (or the pool is gone)."""
        pool = self.pool
        return None if pool is None else self._sample(pool)

    def check(self, live_request_ids: Iterable[str] | None = ()) -> CheckReport | None:
        """Run the pool's bookkeeping check (its ``on_check`` puts the event if it fails)."""
        pool = self.pool
        return None if pool is None else pool.check(live_request_ids)

    # --- observer methods ------------------------------------------------------------------
    # The three per-request methods inline ``_event`` (a call less each): they are the path
    # the 1 us per event target is about. One clock read serves the event's timestamp and the
    # sample rate; the Event is built positionally as a plain tuple (``Event(...)`` runs a
    # Python ``__new__``: half again the cost), so it must list every field of Event (host and
    # device_uuid last: the install sink stamps the UUID).
    def on_allocate(self, pool: KVBlockPool, allocation: Allocation) -> None:
        request_id, block_ids, num_tokens, hit_tokens, _ = allocation
        phase = self._phase_fn() if self._phase_fn is not None else None
        now_s = self._time_s()
        try:
            self._sink_put(_new_event(Event, (
                now_s, "kv_alloc", self.device, self.pid, phase, request_id,
                {"blocks": len(block_ids), "tokens": num_tokens, "hit_tokens": hit_tokens},
                None, None)))
            if not self._sampled_s <= now_s < self._next_sample_s:
                self._sample_at(pool, now_s)
        except Exception:  # a sink must not raise; if one does, the server still must not see it
            pass

    def on_extend(self, pool: KVBlockPool, request_id: str, new_block_ids: tuple[int, ...],
                  num_tokens: int) -> None:
        phase = self._phase_fn() if self._phase_fn is not None else None
        now_s = self._time_s()
        try:
            key = (len(new_block_ids), num_tokens)
            data = self._extend_data.get(key) or _share(
                self._extend_data, key, {"blocks": key[0], "tokens": num_tokens, "extend": True})
            self._sink_put(_new_event(Event, (now_s, "kv_alloc", self.device, self.pid, phase,
                                              request_id, data, None, None)))
            if not self._sampled_s <= now_s < self._next_sample_s:
                self._sample_at(pool, now_s)
        except Exception:
            pass

    def on_free(self, pool: KVBlockPool, request_id: str, released: tuple[int, ...],
                cached: tuple[int, ...]) -> None:
        phase = self._phase_fn() if self._phase_fn is not None else None
        now_s = self._time_s()
        try:
            key = (len(released), len(cached))
            data = self._free_data.get(key) or _share(
                self._free_data, key, {"blocks_released": key[0], "blocks_cached": key[1]})
            self._sink_put(_new_event(Event, (now_s, "kv_free", self.device, self.pid, phase,
                                              request_id, data, None, None)))
            if not self._sampled_s <= now_s < self._next_sample_s:
                self._sample_at(pool, now_s)
        except Exception:
            pass
        if not pool._requests:
            self._maybe_check(pool)

    def on_allocate_failed(self, pool: KVBlockPool, request_id: str, num_tokens: int,
                           reason: str) -> None:
        self._event(pool, "kv_alloc_failed", request_id, {"tokens": num_tokens,
                                                          "reason": reason})

    def on_check(self, pool: KVBlockPool, report: CheckReport) -> None:
        if report.ok:
            return
        self._event(pool, "kv_orphaned_blocks", None, {
            "blocks": len(report.orphaned_blocks),
            "block_ids": list(report.orphaned_blocks[:_MAX_IDS_IN_EVENT]),
            "owners": list(report.orphan_owners[:_MAX_IDS_IN_EVENT]),
            "problems": list(report.problems),
            # what each orphaned block holds: the agent reads the leak's rate in bytes too
            "bytes_per_block": pool.bytes_per_block,
        })
        self._put(self._sample(pool))

    # --- internals -------------------------------------------------------------------------
    def _event(self, pool: KVBlockPool, name: str, request_id: str | None,
               data: dict[str, Any]) -> None:
        """Put one event, then a sample if one is due (the rare events; see on_allocate)."""
        phase = self._phase_fn() if self._phase_fn is not None else None
        now_s = self._time_s()
        try:
            self._sink_put(_new_event(Event, (now_s, name, self.device, self.pid, phase,
                                              request_id, data, None, None)))
            if not self._sampled_s <= now_s < self._next_sample_s:
                self._sample_at(pool, now_s)
        except Exception:  # a sink must not raise; if one does, the server still must not see it
            pass

    def _sample_at(self, pool: KVBlockPool, now_s: float) -> None:
        """Sample at ``now_s`` (the event's time). Due again ``sample_interval_s`` later on the
        same wall clock, or at once if that clock is set back before this sample."""
        self._sampled_s, self._next_sample_s = now_s, now_s + self.sample_interval_s
        self._put(self._sample(pool, now_s))

    def _maybe_check(self, pool: KVBlockPool) -> None:
        now_s = self._monotonic_s()
        if now_s >= self._next_check_s:
            self._next_check_s = now_s + self.check_interval_s
            pool.check(())

    def _sample(self, pool: KVBlockPool, now_s: float | None = None) -> Sample:
        s = pool.stats()
        phase = self._phase_fn() if self._phase_fn is not None else None
        ts_s = self._time_s() if now_s is None else now_s
        return Sample(ts_s, self.device, phase or Phase.UNKNOWN, "kv", self.pid,
                      kv_blocks_used=s.blocks_used, kv_blocks_total=s.blocks_total,
                      kv_blocks_cached=s.blocks_cached, kv_tokens_used=s.tokens_used)

    def _put(self, record: Record) -> None:
        try:
            self._sink_put(record)
        except Exception:  # a sink must not raise; if one does, the server still must not see it
            pass


def _no_pool() -> None:
    return None


def _share(memo: dict[tuple[int, int], dict[str, Any]], key: tuple[int, int],
           data: dict[str, Any]) -> dict[str, Any]:
    """Keep ``data`` as the dict every later event with this ``key`` shares (memo bounded)."""
    if len(memo) >= _SHARED_DATA_MAX:
        memo.clear()
    memo[key] = data
    return data
