"""vramscope inside vLLM: a ``vllm.general_plugins`` entry point (read in vLLM 0.32's source).

The switch (``VRAMSCOPE_VLLM``, ``VLLM_PLUGINS``) and what each hook point records:
docs/vllm.md. vLLM calls ``register()`` in every process it starts, possibly more than once: it
patches these classes once per process (a missing one turns that part off with one log line; a
wrapper never raises into the engine), and the first process-local object that owns a device or
the scheduler runs ``vramscope.install()`` there:

- ``WorkerWrapperBase.init_device`` (``vllm/v1/worker/worker_base.py``);
- ``Scheduler.__init__`` / ``schedule`` / ``add_request`` / ``_free_request`` /
  ``_preempt_request`` (``vllm/v1/core/sched/scheduler.py``);
- ``KVCacheManager.allocate_slots`` / ``free`` / ``pop_blocks_for_free``
  (``vllm/v1/core/kv_cache_manager.py``);
- ``BlockPool.free_blocks`` / ``touch`` / ``_maybe_evict_cached_block`` /
  ``reset_prefix_cache`` (``vllm/v1/core/block_pool.py``).

The records they make: ``hooks/vllm_observer.py``; what the wrappers read of vLLM's objects:
``hooks/vllm_reads.py``.
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

