"""What the vLLM observer reads of vLLM's objects, as plain functions of them.

The token split of a scheduled step, a KV sample of the block pool, the running counts of cached
and evicted blocks kept on a ``BlockPool`` (two attributes of ours, so a sample costs O(1)), a
request's blocks, the model's name and the server's port. Apart from the wrappers in
``hooks/vllm_observer.py`` so each reading can be tested on a scripted object without patching.
"""

from __future__ import annotations

import os
import time
from typing import Any

from vramscope.agent.records import Phase, Sample

CACHED_BLOCKS = "_vramscope_cached_blocks"  # on a BlockPool: cached (free, hashed) blocks
EVICTED_BLOCKS = "_vramscope_evicted_blocks"  # on a BlockPool: evictions so far


DEFAULT_PORT = 8000  # vLLM's OpenAI server's --port default


def with_port(process: str, argv: list[str]) -> str:
    """``"vllm engine core (port 8000)"``: the API port a server was started with, so two
    servers on one host are told apart by name. vLLM's engine core and workers are
    multiprocessing children, which keep the server's ``sys.argv`` (spawn sends it along);
    ``--port N`` / ``--port=N``, else vLLM's default where the command is its server."""
    port = None
    for i, arg in enumerate(argv):
        if arg == "--port" and i + 1 < len(argv):
            port = argv[i + 1]
        elif arg.startswith("--port="):
            port = arg.split("=", 1)[1]
    if port is None and any(a.endswith("api_server.py") or a == "serve" for a in argv):
        port = str(DEFAULT_PORT)
    return f"{process} (port {port})" if port is not None and port.isdigit() else process


def split_tokens(requests: Any, num_scheduled_tokens: dict[str, int]) -> tuple[int, int]:
    """(prefill, decode) tokens of one scheduled step, read after ``schedule()`` returned.

    ``schedule()`` has already advanced each scheduled request's ``num_computed_tokens`` by its
    scheduled count, so the step started at ``num_computed_tokens - n``. Positions below
    ``max(num_prompt_tokens, num_tokens - 1)`` were known before the step (prompt chunks, and
    a preempted request's recomputed output): prefill. The rest, the token sampled last step
    (and speculative ones), is decode.
    """
    prefill = decode = 0
    for rid, n in num_scheduled_tokens.items():
        request = requests[rid]
        start = request.num_computed_tokens - n
        known = max(request.num_prompt_tokens, request.num_tokens - 1)
        part = max(0, min(start + n, known) - start)
        prefill += part
        decode += n - part
    return prefill, decode


def kv_sample(pool: Any, device: int) -> Sample:
    """The pool now, in vLLM's own terms: total excludes the null block, used = total - free."""
    total = pool.num_gpu_blocks - 1
    return Sample(time.time(), device, phase_now(), "kv", os.getpid(),
                  kv_blocks_used=total - pool.get_num_free_blocks(), kv_blocks_total=total,
                  kv_blocks_cached=max(0, getattr(pool, CACHED_BLOCKS, 0)))


def lookup_counted(manager: Any, request: Any) -> bool:
    """Whether vLLM counts this request's lookup in its prefix-cache queries (it skips those
    that did not read the cache: caching off, prompt logprobs, pooling)."""
    check = getattr(manager, "prefix_cache_lookup_enabled", None)
    return bool(check(request)) if callable(check) else True


def blocks_of(manager: Any, rid: str) -> list[Any]:
    return [b for group in manager.get_blocks(rid).blocks for b in group if not b.is_null]


def count_cached_freed(pool: Any, blocks: list[Any]) -> None:
    """Blocks this free left unreferenced with a hash joined the cached (evictable) set."""
    n = sum(1 for b in blocks if b.ref_cnt == 0 and b.block_hash is not None and not b.is_null
            and (b.pool is None or b.pool is pool))
    if n:
        setattr(pool, CACHED_BLOCKS, getattr(pool, CACHED_BLOCKS, 0) + n)


def count_cached_touched(pool: Any, blocks: Any) -> None:
    """A prefix hit takes cached blocks back (their ref_cnt goes 0 -> 1)."""
    n = sum(1 for b in blocks if b.ref_cnt == 0 and b.block_hash is not None and not b.is_null)
    if n:
        setattr(pool, CACHED_BLOCKS, getattr(pool, CACHED_BLOCKS, 0) - n)


def phase_now() -> Phase:
    """The process's current phase (imported on first use, as the observer imports the hooks)."""
    from vramscope.hooks.phase import current_phase

    return current_phase()


def model_name(vllm_config: Any) -> str | None:
    model = getattr(getattr(vllm_config, "model_config", None), "model", None)
    return str(model) if model is not None else None
