"""The demo's simulated servers: one spec per scenario, each on its own simulated GPU.

All run a Llama-3-8B-shaped model (15 GiB of bf16 weights, 128 KiB of KV per token) on a
24 GB card, so memory is as tight as it is in real single-GPU serving:

- ``healthy``: a paged KV pool of 4 GiB, chunked prefill (2,048 tokens), moderate bursty
  traffic; reserved climbs to its high water mark and stays; no leak, no OOM, no alert.
- ``leak``: the same server with a bug that keeps 512 KiB per finished request (a logits copy
  kept in a list): the idle floor rises by about 1 GiB per simulated hour.
- ``fragmentation``: no pool; each request's KV is its own buffer, grown in 256-token steps
  by allocate-copy-free and freed when the request ends (the pre-paging design). The caching
  allocator's segments split and cannot be returned; about 20 simulated minutes in, a KV
  buffer finds no block and no segment although gigabytes are free in total: an OOM.
- ``pool``: the fragmentation server's exact traffic on a paged pool of what that server has
  for KV less 2.5 GiB kept for temporaries (4.6 GiB);
  the scheduler waits for blocks instead of failing.
"""

from __future__ import annotations

from typing import Any

from vramscope.agent.sim.model import SimModel
from vramscope.agent.sim.server import SCENARIOS, GiB, MiB, ServerSpec
from vramscope.agent.sim.workload import WorkloadSpec

ACTIVATION_RESERVE_BYTES = 2560 * MiB  # what the pool design leaves for temporaries

_STEADY = WorkloadSpec(rate_per_s=0.4, burst_rate_per_s=0.8, mean_calm_s=300.0,
                       mean_burst_s=30.0, seed=1)
_HEAVY = WorkloadSpec(rate_per_s=0.6, burst_rate_per_s=2.0, mean_calm_s=300.0,
                      mean_burst_s=30.0, seed=0)


def scenario_spec(name: str, device: int = 0, pid: int | None = None,
                  prefill_chunk_tokens: int | None = None) -> ServerSpec:
    """The spec of scenario ``name`` on simulated device ``device``."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    common: dict[str, Any] = {"device": device, "pid": pid}
    if name == "healthy":  # chunked prefill keeps its temporaries small and few in size
        return ServerSpec("healthy", workload=_STEADY, **common,
                          prefill_chunk_tokens=prefill_chunk_tokens or 2048)
    if name == "leak":
        return ServerSpec("leak", workload=_STEADY, leak_bytes_per_request=512 * 1024, seed=1,
                          prefill_chunk_tokens=prefill_chunk_tokens or 2048, **common)
    common["prefill_chunk_tokens"] = prefill_chunk_tokens
    if name == "fragmentation":
        return ServerSpec("fragmentation", workload=_HEAVY, max_batch=48, **common)
    base = ServerSpec("pool", workload=_HEAVY, max_batch=48, **common)
    pool_bytes = base.limit_bytes - SimModel().weights_bytes - ACTIVATION_RESERVE_BYTES
    return ServerSpec("pool", workload=_HEAVY, max_batch=48, kv_pool_bytes=pool_bytes, **common)


__all__ = ["scenario_spec", "SCENARIOS", "GiB"]
