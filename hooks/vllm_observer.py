"""The vLLM observer: the class patches ``hooks/vllm_plugin.py`` lists and the records they make.

KV samples (``source="kv"``) at step boundaries, whenever the pool's used or cached block count
changed, at least every ``sampling.kv_interval_s`` while busy and never two closer than
``sampling.kv_min_interval_s``; ``server_load``, ``tokens`` and ``kv_evicted`` beside them. The
rules and why: docs/vllm.md, "When the plugin looks, and how that relates to /metrics".

Nothing per step is kept: the wrappers hold no reference to a ``SchedulerOutput``, a request or a
block; the per-request state is request-id strings, dropped at ``kv_free`` / ``request_end``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from vramscope.agent.clock import SYSTEM_CLOCK, Clock
from vramscope.agent.records import TOKENS_EVENT, TOKENS_EVERY_S, Event, Phase
from vramscope.hooks.sink import Record, RecordSink
from vramscope.hooks.vllm_reads import (
    CACHED_BLOCKS,
    EVICTED_BLOCKS,
    blocks_of,
    count_cached_freed,
    count_cached_touched,
    kv_sample,
    lookup_counted,
    model_name,
    phase_now,
    split_tokens,
    with_port,
)

# A child of vLLM's logger: vLLM configures "vllm" with its handler, so these lines appear in
# the server's own log, prefixed like its other lines.
log = logging.getLogger("vllm.plugins.vramscope")
_MARK = "_vramscope_wrapped"
LOAD_INTERVAL_S = 1.0  # server_load events at most this often (the Prometheus source's rate)


class VllmObserver:
    """The class patches and the records they make. ``parts`` says what is observed and why not."""

    def __init__(self, install: Callable[..., Any] | None = None,
                 sink: RecordSink | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        self.parts: dict[str, str] = {}  # part -> "observed" or why not
        self._install = install  # tests and benchmarks hand their own install() and sink
        self._given_sink = sink
        self._patched: list[tuple[type, str, Any]] = []
        self._lock = threading.Lock()
        self.device = 0
        self.sink: RecordSink | None = None
        self.installed = False
        self.steps = 0
        self.seen: set[str] = set()  # requests started, not ended
        self.live: set[str] = set()  # requests holding blocks
        self.waiting: set[str] = set()  # requests refused blocks once
        self.prefix_query_tokens = self.prefix_hit_tokens = self.preemptions = 0
        self.preempted_hit_tokens = 0  # a preempted request's re-use of its own blocks
        self._clock = clock  # the sample spacing's (monotonic); records carry time.time()
        self._interval_s = 0.1
        self._min_interval_s = 0.001
        self._next_sample_s = float("-inf")  # a sample due even if the pool is unchanged
        self._not_before_s = float("-inf")  # kv_min_interval_s after the last sample
        self._sampled: tuple[int, int] | None = None  # (used, cached) of the last sample
        self._evicted_seen = 0
        self._load: tuple[int, int] | None = None  # (running, waiting) last recorded
        self._next_load_s = float("-inf")
        self._tokens = [0, 0]  # prompt and generated tokens of requests finished, not yet sent
        self._tokens_since: float | None = None  # when the first of them finished (wall clock)
        self._peak: tuple[float, int, int, Phase] | None = None  # (ts, used, cached, phase)

    # --- patching ---------------------------------------------------------------------------
    def patch_all(self) -> None:
        with self._lock:
            if self._patched:
                return
            self._patch_module("worker", "vllm.v1.worker.worker_base", "WorkerWrapperBase",
                               {"init_device": self._wrap_init_device})
            self._patch_module("scheduler", "vllm.v1.core.sched.scheduler", "Scheduler", {
                "__init__": self._wrap_scheduler_init, "schedule": self._wrap_schedule,
                "add_request": self._after_request(self._started),
                "_free_request": self._after_request(self._ended),
                "_preempt_request": self._after_request(self._preempted)})
            self._patch_module("step_boundary", "vllm.v1.core.sched.scheduler", "Scheduler",
                               {"update_from_output": self._wrap_update})
            self._patch_module("kv_cache_manager", "vllm.v1.core.kv_cache_manager",
                               "KVCacheManager", {
                                   "allocate_slots": self._wrap_allocate,
                                   "free": self._wrap_free, "pop_blocks_for_free":
                                   self._wrap_pop_for_free})
            self._patch_module("block_pool", "vllm.v1.core.block_pool", "BlockPool", {
                "free_blocks": self._wrap_pool_free, "touch": self._wrap_touch,
                "_maybe_evict_cached_block": self._wrap_evict,
                "reset_prefix_cache": self._wrap_reset})

    def unpatch_all(self) -> None:
        """Put vLLM's own functions back (tests and ``bench vllm``'s baseline rounds)."""
        with self._lock:
            while self._patched:
                cls, name, original = self._patched.pop()
                setattr(cls, name, original)

    def _patch_module(self, part: str, module: str, cls_name: str,
                      wrappers: dict[str, Callable[[Any], Any]]) -> None:
        try:
            cls = getattr(__import__(module, fromlist=[cls_name]), cls_name)
        except Exception as exc:
            return self._off(part, f"{module}.{cls_name} not importable ({exc!r})")
        missing = [name for name in wrappers if not callable(getattr(cls, name, None))]
        if missing:
            return self._off(part, f"{cls_name} has no {', '.join(missing)}")
        for name, make in wrappers.items():
            original = cls.__dict__.get(name, getattr(cls, name))
            if getattr(original, _MARK, False):
                continue
            wrapper = make(original)
            setattr(wrapper, _MARK, True)
            wrapper.__wrapped__ = original
            setattr(cls, name, wrapper)
            self._patched.append((cls, name, original))
        self.parts[part] = "observed"
        return None

    def _off(self, part: str, why: str) -> None:
        """One log line per part that vLLM's internals keep us from observing."""
        if self.parts.get(part) != why:
            self.parts[part] = why
            log.info("vramscope: vLLM %s not observed: %s (vLLM's internals differ from 0.32's; "
                     "the rest still works)", part, why)

    def _guard(self, part: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run an observation; a failure turns nothing off in vLLM, it logs once per part."""
        try:
            return fn(*args)
        except Exception as exc:
            self._off(part, f"observation failed: {exc!r}")
            return None

    # --- install in the process that owns a device or the scheduler ---------------------------
    def _wrap_init_device(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def init_device(wrapper: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(wrapper, *args, **kwargs)
            self._guard("worker", self._install_for_worker, wrapper)
            return result
        return init_device

    def _install_for_worker(self, wrapper: Any) -> None:
        worker = getattr(wrapper, "worker", wrapper)
        device = getattr(worker, "device", None)
        rank = getattr(worker, "rank", getattr(wrapper, "global_rank", 0))
        index = getattr(device, "index", None) if getattr(device, "type", None) == "cuda" else None
        self.ensure_installed(f"vllm worker rank {rank}", index,
                              model_name(getattr(worker, "vllm_config", None)))

    def ensure_installed(self, process: str, device_index: int | None,
                         model: str | None) -> None:
        """``vramscope.install()`` once in this process, with a sink named after the rank."""
        if self.installed:
            return
        self.installed = True
        self.device = device_index or 0
        from vramscope.agent.config import load_config, parse_config
        from vramscope.hooks import phase as phase_mod

        try:
            config = load_config()
        except Exception as exc:
            log.warning("vramscope: config unreadable (%s); using defaults", exc)
            config = parse_config({}, None, {})
        self._interval_s = float(config["sampling.kv_interval_s"])
        self._min_interval_s = float(config["sampling.kv_min_interval_s"])
        devices = [device_index] if device_index is not None else []
        process = with_port(process, sys.argv)
        sink = self._make_sink(config, process, devices, model)
        report = self._install_fn()(config, sink=sink, devices=devices)
        self.sink = phase_mod.active_sink() or sink
        for line in str(report).splitlines():
            log.info("%s (%s)", line, process)

    def _install_fn(self) -> Callable[..., Any]:
        if self._install is not None:
            return self._install
        from vramscope.hooks.install import install

        return install

    def _make_sink(self, config: Mapping[str, Any], process: str, devices: list[int],
                   model: str | None) -> RecordSink | None:
        if self._install is not None or self._given_sink is not None:
            return self._given_sink
        import atexit

        from vramscope.hooks.client import make_default_sink

        sink = make_default_sink(config, process=process, devices=tuple(devices), model=model)
        atexit.register(sink.close)  # flush what is buffered when the engine exits
        return sink

    def _wrap_scheduler_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def __init__(sched: Any, *args: Any, **kwargs: Any) -> None:
            original(sched, *args, **kwargs)
            if not self.installed:  # tensor parallel: the workers are other processes
                self._guard("scheduler", self.ensure_installed, "vllm engine core", None,
                            model_name(getattr(sched, "vllm_config", None)))
        return __init__

    # --- steps and requests -----------------------------------------------------------------
    def _wrap_schedule(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def schedule(sched: Any, *args: Any, **kwargs: Any) -> Any:
            output = original(sched, *args, **kwargs)
            self._guard("scheduler", self._step, sched, output)
            return output
        return schedule

    def _step(self, sched: Any, output: Any) -> None:
        from vramscope.hooks import phase as phase_mod

        prefill, decode = split_tokens(sched.requests, output.num_scheduled_tokens)
        self.steps += 1
        if prefill or decode:  # an empty step (nothing runnable) changes nothing
            phase = Phase.PREFILL if prefill else Phase.DECODE
            phase_mod.set_phase(phase, prefill_tokens=prefill, decode_tokens=decode)
            if self.parts.get("step_boundary") == "observed":
                self._note_peak(sched.kv_cache_manager.block_pool)  # sampled at the step's end
            else:
                self._kv_after(sched.kv_cache_manager, force=False, sched=sched)

    def _wrap_update(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def update_from_output(sched: Any, *args: Any, **kwargs: Any) -> Any:
            outputs = original(sched, *args, **kwargs)
            if sched.requests:  # else the idle sample was taken as the last request ended
                self._guard("step_boundary", self._kv_after, sched.kv_cache_manager, False,
                            sched)
            return outputs
        return update_from_output

    def _note_peak(self, pool: Any) -> None:
        """The step's peak: right after ``schedule()`` took its blocks, before the step's
        finished requests free theirs. Kept (the highest since the last sample, O(1)) so a
        sample at the step boundary loses no peak between samples."""
        used = pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()
        if self._peak is None or used > self._peak[1]:
            self._peak = (time.time(), used, max(0, getattr(pool, CACHED_BLOCKS, 0)), phase_now())

    def _after_request(self, handler: Callable[[Any, Any], None]
                       ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """The wrapper maker of the scheduler's calls on one request (``add_request``,
        ``_free_request``, ``_preempt_request``): vLLM's own call first, then
        ``handler(scheduler, request)``, guarded."""
        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def after(sched: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
                result = original(sched, request, *args, **kwargs)
                self._guard("scheduler", handler, sched, request)
                return result
            return after
        return make

    def _started(self, sched: Any, request: Any) -> None:
        rid = str(request.request_id)
        if rid not in self.seen:
            from vramscope.hooks import phase as phase_mod

            self.seen.add(rid)
            phase_mod.request_started(rid)

    def _ended(self, sched: Any, request: Any) -> None:
        from vramscope.hooks import phase as phase_mod

        rid = str(request.request_id)
        # its tokens, sent with a later load (``tokens``)
        if self._tokens_since is None:
            self._tokens_since = time.time()
        self._tokens[0] += int(getattr(request, "num_prompt_tokens", 0) or 0)
        self._tokens[1] += int(getattr(request, "num_output_tokens", 0) or 0)
        if rid in self.seen:
            self.seen.discard(rid)
            phase_mod.request_finished(rid)
        if not sched.requests:  # _free_request dropped it from there: none is left
            phase_mod.set_phase(Phase.IDLE)
            # no request left: nothing runs or waits (sched.running still lists the finished
            # ones until update_from_output filters them)
            self._kv_after(sched.kv_cache_manager, force=True, sched=sched, idle=True)

    def _preempted(self, sched: Any, request: Any) -> None:
        rid = str(request.request_id)
        self.preemptions += 1
        self._put(Event(time.time(), "kv_preempted", self.device, os.getpid(), phase_now(), rid,
                        {"count": 1}))

    # --- KV cache manager -----------------------------------------------------------------
    def _wrap_allocate(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def allocate_slots(manager: Any, request: Any, num_new_tokens: int,
                           num_new_computed_tokens: int = 0, *args: Any, **kwargs: Any) -> Any:
            blocks = original(manager, request, num_new_tokens, num_new_computed_tokens, *args,
                              **kwargs)
            rid = request.request_id
            if blocks is None or rid not in self.live:  # decode steps of live requests: nothing
                self._guard("kv_cache_manager", self._allocated, manager, request,
                            blocks is not None, num_new_tokens, num_new_computed_tokens)
            return blocks
        return allocate_slots

    def _allocated(self, manager: Any, request: Any, ok: bool, new_tokens: int,
                   hit_tokens: int) -> None:
        rid = str(request.request_id)
        if not ok:
            if rid not in self.waiting:
                self.waiting.add(rid)
                self._event("kv_alloc_failed", rid, {"tokens": request.num_tokens,
                                                     "reason": "not enough free blocks"})
            return
        self.waiting.discard(rid)
        self.live.add(rid)
        # vLLM's definition (KVCacheManager.record_prefix_cache_stats): a request that was
        # preempted finds its own blocks again; that re-use is not a prefix-cache hit there,
        # so it is kept apart here (``preempted_hit_tokens``), and ``hit_tokens`` adds up to
        # vllm:prefix_cache_hits_total
        # vllm:prefix_cache_queries_total likewise counts the tokens of the lookups of requests
        # never preempted (``query_tokens``): hit_tokens / query_tokens is vLLM's hit rate
        preempted = getattr(request, "num_preemptions", 0) > 0
        queried = 0
        if preempted:
            self.preempted_hit_tokens += hit_tokens
        elif lookup_counted(manager, request):
            queried = int(request.num_tokens)
            self.prefix_query_tokens += queried
            self.prefix_hit_tokens += hit_tokens
        blocks = sum(len(ids) for ids in manager.get_block_ids(rid))
        self._event("kv_alloc", rid, {"blocks": blocks, "query_tokens": queried,
                                      "hit_tokens": 0 if preempted else int(hit_tokens),
                                      "preempted_hit_tokens": int(hit_tokens) if preempted
                                      else 0,
                                      "tokens": request.num_computed_tokens + hit_tokens
                                      + new_tokens})

    def _wrap_free(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def free(manager: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            rid = request.request_id
            self.waiting.discard(rid)  # refused and then finished: forget it here too
            held = self._guard("kv_cache_manager", blocks_of, manager, rid) if (
                rid in self.live) else None
            result = original(manager, request, *args, **kwargs)
            if held is not None:
                self._guard("kv_cache_manager", self._freed, manager, str(rid), held)
            return result
        return free

    def _freed(self, manager: Any, rid: str, held: list[Any]) -> None:
        self.live.discard(rid)
        cached = sum(1 for b in held if b.ref_cnt == 0 and b.block_hash is not None)
        released = sum(1 for b in held if b.ref_cnt == 0)
        self._event("kv_free", rid, {"blocks_released": released, "blocks_cached": cached})

    def _wrap_pop_for_free(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def pop_blocks_for_free(manager: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            blocks = original(manager, request, *args, **kwargs)
            rid = str(request.request_id)
            if rid in self.live:  # freed later, when the in-flight step is done
                self.live.discard(rid)
                self._guard("kv_cache_manager", self._event, "kv_free", rid,
                            {"blocks_released": 0, "blocks_deferred": len(blocks)})
            return blocks
        return pop_blocks_for_free

    # --- block pool counters --------------------------------------------------------------
    def _wrap_pool_free(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def free_blocks(pool: Any, ordered_blocks: Any, *args: Any, **kwargs: Any) -> Any:
            blocks = ordered_blocks if isinstance(ordered_blocks, list) else list(ordered_blocks)
            result = original(pool, blocks, *args, **kwargs)
            self._guard("block_pool", count_cached_freed, pool, blocks)
            return result
        return free_blocks

    def _wrap_touch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def touch(pool: Any, blocks: Any, *args: Any, **kwargs: Any) -> Any:
            self._guard("block_pool", count_cached_touched, pool, blocks)
            return original(pool, blocks, *args, **kwargs)
        return touch

    def _wrap_evict(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def _maybe_evict_cached_block(pool: Any, block: Any, *args: Any, **kwargs: Any) -> Any:
            was_cached = block.ref_cnt == 0 and block.block_hash is not None
            evicted = original(pool, block, *args, **kwargs)
            if evicted:
                setattr(pool, EVICTED_BLOCKS, getattr(pool, EVICTED_BLOCKS, 0) + 1)
                if was_cached:
                    setattr(pool, CACHED_BLOCKS, getattr(pool, CACHED_BLOCKS, 0) - 1)
            return evicted
        return _maybe_evict_cached_block

    def _wrap_reset(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def reset_prefix_cache(pool: Any, *args: Any, **kwargs: Any) -> Any:
            done = original(pool, *args, **kwargs)
            if done:
                setattr(pool, CACHED_BLOCKS, 0)
            return done
        return reset_prefix_cache

    # --- records --------------------------------------------------------------------------
    def _kv_after(self, manager: Any, force: bool, sched: Any = None,
                  idle: bool = False) -> None:
        """A KV sample when due (or forced), the scheduler's running and waiting counts with
        it when they changed (``server_load``, as the Prometheus source records them), and
        the step's evictions as one event."""
        pool = manager.block_pool
        evicted = getattr(pool, EVICTED_BLOCKS, 0)
        if evicted > self._evicted_seen:
            self._event("kv_evicted", None, {"blocks": evicted - self._evicted_seen})
            self._evicted_seen = evicted
        now_s = self._clock.monotonic_s()
        if not force:
            if now_s < self._not_before_s:  # the flood bound; a change waits for a later step
                return
            used = pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()
            if (used, max(0, getattr(pool, CACHED_BLOCKS, 0))) == self._sampled and (
                    now_s < self._next_sample_s):
                return  # unchanged since the last sample, and not yet due to say so again
        self._next_sample_s = now_s + self._interval_s
        self._not_before_s = now_s + self._min_interval_s
        sample = kv_sample(pool, self.device)
        self._sampled = (sample.kv_blocks_used or 0, sample.kv_blocks_cached or 0)
        peak, self._peak = self._peak, None
        if peak is not None and peak[1] > (sample.kv_blocks_used or 0):  # a step went higher
            self._put(sample._replace(ts_s=peak[0], kv_blocks_used=peak[1],
                                      kv_blocks_cached=peak[2], phase=peak[3]))
        self._put(sample)
        if sched is not None:
            load = (0, 0) if idle else (len(sched.running), len(sched.waiting))
            # when changed, at most once a LOAD_INTERVAL_S (they are kept as long as rare
            # events), and always the step to idle
            if load != self._load and (idle or now_s >= self._next_load_s):
                self._load, self._next_load_s = load, now_s + LOAD_INTERVAL_S
                self._event("server_load", None, {"running": load[0], "waiting": load[1]})
            since = self._tokens_since
            if since is not None and (idle or time.time() - since >= TOKENS_EVERY_S):
                prompt, generated = self._tokens
                self._tokens, self._tokens_since = [0, 0], None
                self._event(TOKENS_EVENT, None, {"prompt_tokens": prompt,
                                                 "generation_tokens": generated,
                                                 "since_s": since})

    def _event(self, name: str, rid: str | None, data: dict[str, Any]) -> None:
        self._put(Event(time.time(), name, self.device, os.getpid(), phase_now(), rid, data))

    def _put(self, record: Record) -> None:
        sink = self.sink
        if sink is not None:
            try:
                sink.put(record)
            except Exception:  # a sink must not raise; if one does, vLLM still must not see it
                pass

