"""vramscope's own KV pool observer: turns pool activity into records for a ``RecordSink``.

Records it makes (trace format v1, ``source="kv"``):

- ``Sample`` with ``kv_blocks_used``, ``kv_blocks_total``, ``kv_blocks_cached`` and
  ``kv_tokens_used``, at most one per ``sample_interval_s`` while the pool is active (counters
  are sampled at a rate, never per event), and on demand from ``read()``;
- ``Event`` ``kv_alloc`` (``request_id``; ``blocks``, ``tokens``, ``hit_tokens``; and, only
  with ``extend_events=True``, one with ``extend: true`` each time a growing request takes new
  blocks: one per ``block_size`` decoded tokens per request, which the rate samples already
  show as ``kv_blocks_used``; without it the pool does not call ``on_extend`` at all),
  ``kv_free`` (``request_id``;
  ``blocks_released``, ``blocks_cached``), ``kv_alloc_failed`` (``request_id``; ``tokens``,
  ``reason``) and ``kv_orphaned_blocks`` (``blocks``, ``block_ids``, ``owners``, ``problems``)
  when the bookkeeping check finds a leak or a broken invariant.

The check runs by itself when a free leaves the pool with no requests (at most once per
``check_interval_s``): the moment SGLang's idle leak check runs. ``check(live_request_ids)``
runs it on demand with the server's view of the live requests.
The sink's ``put`` never blocks or raises, so neither does this observer.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from agent.clock import SYSTEM_CLOCK, Clock, SystemClock
from agent.records import Event, Phase, Sample
from hooks.kvpool_types import Allocation, CheckReport, KVPoolObserver
from hooks.sink import RecordSink

_new_event = tuple.__new__
_MAX_IDS_IN_EVENT = 32  # bound the orphan event: a leak of 10k blocks is still one line


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
        self._next_sample_s = float("-inf")
        self._next_check_s = float("-inf")
        self.pool: Any = None

    def attach(self, pool: Any) -> KVSource:
        pool.observer = self
        self.pool = pool
        return self

    def detach(self) -> None:
        if self.pool is not None and self.pool.observer is self:
            self.pool.observer = None
        self.pool = None

    # --- the one-method seam ---------------------------------------------------------------
    def read(self) -> Sample | None:
        """A sample of the attached pool now, or None when detached."""
        return None if self.pool is None else self._sample(self.pool)

    def check(self, live_request_ids: Iterable[str] | None = ()) -> CheckReport | None:
        """Run the pool's bookkeeping check (its ``on_check`` puts the event if it fails)."""
        return None if self.pool is None else self.pool.check(live_request_ids)

    # --- observer methods ------------------------------------------------------------------
    def on_allocate(self, pool: Any, allocation: Allocation) -> None:
        # _event inlined (here and in on_free): these two run once per request each
        phase = self._phase_fn() if self._phase_fn is not None else None
        data = {"blocks": len(allocation.block_ids), "tokens": allocation.num_tokens,
                "hit_tokens": allocation.hit_tokens}
        try:
            self._sink_put(_new_event(Event, (self._time_s(), "kv_alloc", self.device,
                                              self.pid, phase, allocation.request_id, data,
                                              None)))
            if self._monotonic_s() >= self._next_sample_s:
                self._sample_now(pool)
        except Exception:  # a sink must not raise; if one does, the server still must not see it
            pass

    def on_extend(self, pool: Any, request_id: str, new_block_ids: tuple[int, ...],
                  num_tokens: int) -> None:
        phase = self._phase_fn() if self._phase_fn is not None else None
        data = {"blocks": len(new_block_ids), "tokens": num_tokens, "extend": True}
        try:  # _event inlined: with extend_events this is the most frequent event
            self._sink_put(_new_event(Event, (self._time_s(), "kv_alloc", self.device, self.pid,
                                              phase, request_id, data, None)))
            if self._monotonic_s() >= self._next_sample_s:
                self._sample_now(pool)
        except Exception:
            pass

    def on_free(self, pool: Any, request_id: str, released: tuple[int, ...],
                cached: tuple[int, ...]) -> None:
        phase = self._phase_fn() if self._phase_fn is not None else None
        data = {"blocks_released": len(released), "blocks_cached": len(cached)}
        try:
            self._sink_put(_new_event(Event, (self._time_s(), "kv_free", self.device, self.pid,
                                              phase, request_id, data, None)))
            if self._monotonic_s() >= self._next_sample_s:
                self._sample_now(pool)
        except Exception:
            pass
        if not pool._requests:
            self._maybe_check(pool)

    def on_allocate_failed(self, pool: Any, request_id: str, num_tokens: int,
                           reason: str) -> None:
        self._event(pool, "kv_alloc_failed", request_id, {"tokens": num_tokens,
                                                          "reason": reason})

    def on_check(self, pool: Any, report: CheckReport) -> None:
        if report.ok:
            return
        self._event(pool, "kv_orphaned_blocks", None, {
            "blocks": len(report.orphaned_blocks),
            "block_ids": list(report.orphaned_blocks[:_MAX_IDS_IN_EVENT]),
            "owners": list(report.orphan_owners[:_MAX_IDS_IN_EVENT]),
            "problems": list(report.problems),
        })
        self._put(self._sample(pool))

    # --- internals -------------------------------------------------------------------------
    def _event(self, pool: Any, name: str, request_id: str | None, data: dict[str, Any]) -> None:
        """Put one event, then a sample if one is due. The path the 1 us target is about:
        the Event is built as a plain tuple of its eight fields (Event(...) costs half again
        more) and the clock functions are bound once."""
        phase = self._phase_fn() if self._phase_fn is not None else None
        try:
            self._sink_put(_new_event(Event, (self._time_s(), name, self.device, self.pid,
                                              phase, request_id, data, None)))
            if self._monotonic_s() >= self._next_sample_s:
                self._sample_now(pool)
        except Exception:  # a sink must not raise; if one does, the server still must not see it
            pass

    def _sample_now(self, pool: Any) -> None:
        self._next_sample_s = self._monotonic_s() + self.sample_interval_s
        self._put(self._sample(pool))

    def _maybe_check(self, pool: Any) -> None:
        now_s = self._monotonic_s()
        if now_s >= self._next_check_s:
            self._next_check_s = now_s + self.check_interval_s
            pool.check(())

    def _sample(self, pool: Any) -> Sample:
        s = pool.stats()
        phase = self._phase_fn() if self._phase_fn is not None else None
        return Sample(self._time_s(), self.device, phase or Phase.UNKNOWN, "kv",
                      self.pid, kv_blocks_used=s.blocks_used, kv_blocks_total=s.blocks_total,
                      kv_blocks_cached=s.blocks_cached, kv_tokens_used=s.tokens_used)

    def _put(self, record: Any) -> None:
        try:
            self._sink_put(record)
        except Exception:  # a sink must not raise; if one does, the server still must not see it
            pass
