"""vramscope inside vLLM: a ``vllm.general_plugins`` entry point (read in vLLM 0.32's source).

Enable it with ``VRAMSCOPE_VLLM=1`` or by naming it in ``VLLM_PLUGINS`` (comma-separated:
``VLLM_PLUGINS=vramscope``); ``VRAMSCOPE_VLLM=0`` turns it off even when listed. vLLM calls
``register()`` in every process it starts (the front end, the engine core, each worker;
``vllm/plugins/__init__.py``), possibly more
than once: it patches a few vLLM classes once per process, and the first process-local object
that owns a device or the scheduler runs ``vramscope.install()`` there.

Hook points (each a class-level patch made once; a missing one turns that part off with one log
line, and a wrapper never raises into the engine):

``WorkerWrapperBase.init_device`` (``vllm/v1/worker/worker_base.py``)
    after it, ``install()`` in the worker process with that worker's device (``cuda:<i>``: the
    allocator sampler and OOM observer for it; a CPU worker has no CUDA allocator, and the report
    says so) and a sink named ``vllm rank <rank>`` with the model's name.
``Scheduler.__init__`` / ``schedule`` / ``add_request`` / ``_free_request`` / ``_preempt_request``
    (``vllm/v1/core/sched/scheduler.py``, engine-core process): ``install()`` there when no worker
    did (tensor parallel: workers are other processes); per step, the prefill and decode tokens
    of ``SchedulerOutput.num_scheduled_tokens`` (a scheduled token is prefill when its position
    is below ``max(num_prompt_tokens, num_tokens - 1)``: prompt chunks and recomputation after a
    preemption; the rest is decode) go to ``set_phase`` exactly as for transformers' continuous
    batching (a step with any prefill is ``prefill``); ``request_start`` / ``request_end`` per
    request; ``kv_preempted`` per preemption; ``idle`` when no request is left.
``KVCacheManager.allocate_slots`` / ``free`` / ``pop_blocks_for_free``
    (``vllm/v1/core/kv_cache_manager.py``): ``kv_alloc`` on a request's first blocks (``blocks``,
    ``tokens``, ``hit_tokens`` = its prefix-cache hit as vLLM counts it, ``query_tokens`` =
    the tokens of its lookup as vLLM counts them (0 where vLLM counts none), and
    ``preempted_hit_tokens`` = a preempted request's re-use of its own blocks, which vLLM does
    not count as a hit), ``kv_alloc_failed`` once while a request
    waits for blocks, ``kv_free`` (``blocks_released``, ``blocks_cached``).
``BlockPool.free_blocks`` / ``touch`` / ``_maybe_evict_cached_block`` / ``reset_prefix_cache``
    (``vllm/v1/core/block_pool.py``): a running count of cached blocks (free, but holding a prefix
    hash: vLLM counts them as free) and of evictions, so a sample costs O(1), never a walk of the
    free queue.

How the records are made and when KV samples are taken: ``hooks/vllm_observer.py``; what the
wrappers read of vLLM's objects: ``hooks/vllm_reads.py``. This module is what vLLM loads: the
switch, the entry point and the one observer per process.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from vramscope.hooks.vllm_observer import VllmObserver

# A child of vLLM's logger: vLLM configures "vllm" with its handler, so these lines appear in
# the server's own log, prefixed like its other lines.
log = logging.getLogger("vllm.plugins.vramscope")


def enabled(environ: Any = None) -> bool:
    """On when ``VRAMSCOPE_VLLM`` is true, or unset and ``VLLM_PLUGINS`` names ``vramscope``."""
    env = os.environ if environ is None else environ
    flag = (env.get("VRAMSCOPE_VLLM") or "").strip().lower()
    if flag:
        return flag in ("1", "true", "yes", "on")
    listed = env.get("VLLM_PLUGINS")
    return listed is not None and "vramscope" in [p.strip() for p in listed.split(",")]


def register() -> None:
    """vLLM's entry point (``vllm.general_plugins``). Never raises into vLLM."""
    if not enabled():
        return
    try:
        observer().patch_all()
    except Exception as exc:  # a bug of ours must not stop vLLM from starting
        log.warning("vramscope: vLLM plugin failed to load (%r); vLLM runs unobserved", exc)


_OBSERVER: list[VllmObserver] = []


def observer() -> VllmObserver:
    """This process's observer (one per process: vLLM's classes are patched once)."""
    if not _OBSERVER:
        _OBSERVER.append(VllmObserver())
    return _OBSERVER[0]

