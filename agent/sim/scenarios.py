"""The demo's simulated servers: one spec per scenario (``healthy``, ``leak``, ``fragmentation``,
``pool``), each on its own simulated GPU: a Llama-3-8B-shaped model on a 24 GB card, as tight as
real single-GPU serving. What each does and shows: docs/demo.md.
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
