"""OOM triage: the likely cause of an OOM (or of a warning) and the remedies for that cause.

The order of the checks is the order an experienced engineer goes through them:

1. ``startup`` — it failed before the server served anything: weights plus runtime overhead
   leave no room for the KV budget (no prefill/decode sample before it, no request in flight).
2. ``fragmentation`` — enough free memory in total (cached free plus what may still be
   reserved: driver free, capped by the limit) for the failed allocation *and* ``FULL_RATIO`` of
   the limit to spare, but no block large enough (largest free block smaller than the request,
   or external fragmentation at least ``FRAGMENTED_RATIO``). A device with less free than that
   is full: its free memory is in pieces, but compacting them would not have kept it serving.
3. ``growth`` — the memory outside requests grew: the baseline (non-prefill allocated) rose by at
   least ``GROWTH_RATIO`` of the limit over the samples before the OOM (KV cache or a leak); or,
   on a full device, by at least ``FULL_RATIO`` of the limit and by more than the failed
   allocation lacked (without the rise it would have fit with ``FULL_RATIO`` to spare).
4. ``prefill_spike`` — it failed in prefill with at most one request in flight, or the failed
   allocation alone is at least ``SPIKE_RATIO`` of the limit (one long prompt).
5. ``batch`` — it failed with several requests in flight (a few long requests in one batch).
6. ``unknown`` otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vramscope.agent.records import Phase, PostMortem, Sample

CAUSES = ("startup", "growth", "fragmentation", "prefill_spike", "batch", "unknown")
FRAGMENTED_RATIO = 0.5
GROWTH_RATIO = 0.05
FULL_RATIO = 0.02  # free in total below failed + this share of the limit: a full device
SPIKE_RATIO = 0.10
SNAPSHOT_MAX_AGE_S = 120.0  # an older largest free block says nothing of the OOM's moment

REMEDIES: dict[str, tuple[str, ...]] = {
    "startup": (
        "lower the memory fraction given to the KV cache (e.g. vLLM --gpu-memory-utilization)",
        "lower the maximum context length (max_model_len) so the KV budget fits",
        "quantize the weights or the KV cache, or shard the model over more GPUs",
    ),
    "growth": (
        "look for a leak: compare the idle floor before and after requests (vramscope leaks page)",
        "cap concurrency (max_num_seqs) or the maximum context so the KV cache stops growing",
        "use a paged KV pool with a fixed budget instead of a growing cache",
        "quantize the KV cache (fp8) to halve its growth",
    ),
    "fragmentation": (
        "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        "preallocate a paged KV pool so KV blocks do not fragment the caching allocator",
        "call torch.cuda.empty_cache() between phases with very different allocation sizes",
    ),
    "prefill_spike": (
        "enable chunked prefill (bound the tokens prefilled per step)",
        "lower the maximum prompt length (max_model_len / max_num_batched_tokens)",
        "leave more headroom: a smaller memory fraction for the KV cache",
    ),
    "batch": (
        "lower the maximum concurrency (max_num_seqs) or the batched tokens per step",
        "enable chunked prefill so long requests do not land in one step",
        "quantize the KV cache or lower the maximum context length",
    ),
    "unknown": (
        "record allocation history (hooks.history = \"python\") to see who held the memory",
        "leave more headroom: a smaller memory fraction for the KV cache",
    ),
}


def diagnose(postmortem: PostMortem | None = None, samples: Sequence[Sample] = (),
             *, ts_s: float | None = None, requests_in_flight: int | None = None,
             failed_alloc_bytes: int | None = None, phase: Phase | None = None,
             ) -> tuple[str, tuple[str, ...]]:
    """``(cause, remedies)`` of the OOM in ``postmortem`` (or at ``ts_s`` from samples alone).

    ``samples`` are the device's samples up to the OOM (later ones are ignored); either source
    may be missing, and each check uses what is known. Without a post-mortem,
    ``failed_alloc_bytes`` and ``phase`` (an ``oom`` event's) stand in for its own.
    """
    at = postmortem.ts_s if postmortem is not None else ts_s
    before = [s for s in samples if at is None or s.ts_s <= at]
    last = before[-1] if before else None
    facts = _Facts(postmortem, last, before, requests_in_flight)
    if postmortem is None:
        facts.failed = failed_alloc_bytes
        if phase is not None:
            facts.phase = phase
    cause = next((name for name, check in _CHECKS if check(facts)), "unknown")
    return cause, REMEDIES[cause]


class _Facts:
    """What is known at the OOM, from the post-mortem first and the last sample second."""

    def __init__(self, pm: PostMortem | None, last: Sample | None, before: Sequence[Sample],
                 in_flight: int | None) -> None:
        def pick(pm_field: str, sample_field: str) -> Any:  # a record's field, by name
            value = getattr(pm, pm_field, None) if pm is not None else None
            if value is None and last is not None:
                value = getattr(last, sample_field)
            return value

        self.phase = pm.phase if pm is not None else (last.phase if last else Phase.UNKNOWN)
        self.failed = pm.failed_alloc_bytes if pm is not None else None
        self.driver_free = pm.driver_free_bytes if pm is not None else None
        self.total = pick("device_total_bytes", "device_total_bytes") or next(
            (s.device_total_bytes for s in reversed(before) if s.device_total_bytes), None)
        self.allocated = pick("allocated_bytes", "allocated_bytes")
        self.reserved = pick("reserved_bytes", "reserved_bytes")
        self.largest_free = pick("largest_free_block_bytes", "largest_free_block_bytes")
        if self.largest_free is None and last is not None:  # the latest snapshot's, if recent
            self.largest_free = next(
                (s.largest_free_block_bytes for s in reversed(before)
                 if s.largest_free_block_bytes is not None
                 and last.ts_s - s.ts_s <= SNAPSHOT_MAX_AGE_S), None)
        self.ext_frag = pm.external_fragmentation_ratio if pm is not None else None
        if in_flight is None and pm is not None:
            in_flight = len(pm.requests_in_flight)
        self.in_flight = in_flight
        self.served = any(s.phase in (Phase.PREFILL, Phase.DECODE) for s in before)
        self.before = before


def _is_startup(f: _Facts) -> bool:
    busy = f.phase in (Phase.PREFILL, Phase.DECODE) or (f.in_flight or 0) > 0
    return not busy and not f.served


def _is_fragmentation(f: _Facts) -> bool:
    if f.reserved is None or f.allocated is None:
        return False
    cached_free = max(0, f.reserved - f.allocated)
    if f.failed is not None:
        no_block = f.largest_free is not None and f.largest_free < f.failed
        return not _is_full(f) and (no_block or (f.ext_frag or 0) >= FRAGMENTED_RATIO)
    return (f.ext_frag or 0) >= FRAGMENTED_RATIO and f.total is not None and f.total != 0 \
        and cached_free >= SPIKE_RATIO * f.total


def _free_total(f: _Facts) -> int:
    """Free under the limit in total: cached free plus what the allocator could still reserve."""
    free: int = max(0, f.reserved - f.allocated) + _room_to_grow(f)
    return free


def _shortfall(f: _Facts) -> float | None:
    """How much more free memory the failed allocation needed to fit with ``FULL_RATIO`` of the
    limit to spare (> 0: the device was full); None when the figures are unknown."""
    if f.reserved is None or f.allocated is None or not f.total:
        return None
    return (f.failed or 0) + FULL_RATIO * f.total - _free_total(f)


def _is_full(f: _Facts) -> bool:
    short = _shortfall(f)
    return short is not None and short > 0


def _room_to_grow(f: _Facts) -> int:
    """What the allocator could still reserve: the driver's free memory, but no more than the
    limit (a per-process cap) leaves above what is reserved."""
    under_limit = max(0, f.total - f.reserved) if f.total else None
    if f.driver_free is None:
        return under_limit or 0
    return f.driver_free if under_limit is None else min(f.driver_free, under_limit)


def _is_growth(f: _Facts) -> bool:
    if not f.total:
        return False
    rise = _baseline_rise(f.before)
    if rise is None:
        return False
    if rise >= GROWTH_RATIO * f.total:
        return True
    short = _shortfall(f)  # a full device: did the rise take the room the allocation needed?
    return short is not None and short > 0 and rise >= max(short, FULL_RATIO * f.total)


def _baseline_rise(before: Sequence[Sample]) -> int | None:
    """Median non-prefill allocated of the last quarter minus that of the first quarter."""
    baselines = [s.allocated_bytes for s in before
                 if s.allocated_bytes is not None and s.phase is not Phase.PREFILL]
    if len(baselines) < 4:
        return None
    quarter = max(1, len(baselines) // 4)
    early = sorted(baselines[:quarter])[quarter // 2]
    late = sorted(baselines[-quarter:])[quarter // 2]
    return late - early


def _is_prefill_spike(f: _Facts) -> bool:
    if f.failed is not None and f.total and f.failed >= SPIKE_RATIO * f.total:
        return True
    return f.phase is Phase.PREFILL and (f.in_flight is None or f.in_flight <= 1)


def _is_batch(f: _Facts) -> bool:
    return (f.in_flight or 0) >= 2


_CHECKS = (
    ("startup", _is_startup),
    ("fragmentation", _is_fragmentation),
    ("growth", _is_growth),
    ("prefill_spike", _is_prefill_spike),
    ("batch", _is_batch),
)


def complete_postmortem(pm: PostMortem, samples: Sequence[Sample] = ()) -> PostMortem:
    """``pm`` with ``cause`` and ``remedies`` filled in where the producer left them empty."""
    if pm.cause and pm.remedies:
        return pm
    cause, remedies = diagnose(pm, samples)
    cause = pm.cause if pm.cause in REMEDIES else cause
    return pm._replace(cause=cause, remedies=pm.remedies or REMEDIES[cause])


def diagnose_warning(reasons: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """The likely cause behind a risk warning, from the risk model's reasons."""
    if "fragmentation" in reasons or "alloc_retries" in reasons:
        cause = "fragmentation"
    elif "trend" in reasons:
        cause = "growth"
    elif "headroom" in reasons:
        cause = "prefill_spike"
    else:
        cause = "unknown"
    return cause, REMEDIES[cause]
