"""OOM triage: the likely cause of an OOM (or of a warning) and the remedies for that cause.

The checks run in the order an experienced engineer goes through them: ``startup``,
``fragmentation``, ``kv_exhaustion``, ``growth`` (the load-aware floor of :func:`floor_rise`
rose), ``load``, ``prefill_spike``, ``batch``, else ``unknown``; each one's evidence and
thresholds (the constants below) are tabled in docs/analysis.md, "OOM diagnosis". A device
with less free than ``FULL_RATIO`` of the limit beyond the failed allocation is full, not
fragmented: compacting its free pieces would not have kept it serving.

``CAUSES`` is a public contract (docs/analysis.md): names are added, never renamed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vramscope.agent.event_kinds import Role, names_with
from vramscope.agent.records import Phase, PostMortem, Sample

CAUSES = ("startup", "growth", "fragmentation", "prefill_spike", "batch", "unknown", "load",
          "kv_exhaustion")
FRAGMENTED_RATIO = 0.5
GROWTH_RATIO = 0.05
FULL_RATIO = 0.02  # free in total below failed + this share of the limit: a full device
SPIKE_RATIO = 0.10
SNAPSHOT_MAX_AGE_S = 120.0  # an older largest free block says nothing of the OOM's moment
KV_FULL_RATIO = 0.99  # a pool with this share of its blocks used has none to give
KV_REFUSAL_WINDOW_S = 60.0  # a pool refusal this recent is part of the OOM's story
LOAD_RATIO = 1.5  # in flight at the OOM over the early median: the load grew
LOAD_FIT_MIN_SPREAD = 1e-3  # the load must move apart from time by this much (1 − r²) to fit
KV_REFUSAL_EVENTS = frozenset(names_with(Role.KV_REFUSAL))  # agent/event_kinds.py

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
    "load": (
        "cap concurrency (max_num_seqs) or the batched tokens per step to what fits",
        "shed or queue load at the router before the GPU runs out (admission control)",
        "size the KV budget for the peak load, or scale out to more replicas",
    ),
    "kv_exhaustion": (
        "give the KV pool more blocks (a larger memory fraction, e.g. --gpu-memory-utilization)",
        "lower max_num_seqs or the maximum context so the admitted requests fit the pool",
        "quantize the KV cache (fp8) to double the blocks in the same memory",
    ),
    "unknown": (
        "record allocation history (hooks.history = \"python\") to see who held the memory",
        "leave more headroom: a smaller memory fraction for the KV cache",
    ),
}


def cause_words(cause: str | None, at_risk_from_pid: int | None = None) -> str | None:
    """A risk cause as every surface says it (the alert, the pages, ``status``): the cause's
    name, and for a process at risk from another's growth (``RiskModel.at_risk_from``, the
    verdict's ``risk.at_risk_from_pid``) whose growth it is. None without a cause."""
    if cause == "growth" and at_risk_from_pid is not None:
        return f"growth (at risk from pid {at_risk_from_pid}'s growth)"
    return cause


def diagnose(postmortem: PostMortem | None = None, samples: Sequence[Sample] = (),
             *, ts_s: float | None = None, requests_in_flight: int | None = None,
             failed_alloc_bytes: int | None = None, phase: Phase | None = None,
             in_flight_series: Sequence[tuple[float, int]] = (),
             kv_refusals_ts: Sequence[float] = (),
             ) -> tuple[str, tuple[str, ...]]:
    """``(cause, remedies)`` of the OOM in ``postmortem`` (or at ``ts_s`` from samples alone).

    ``samples`` are the device's samples up to the OOM (later ones are ignored); either source
    may be missing, and each check uses what is known. Without a post-mortem,
    ``failed_alloc_bytes`` and ``phase`` (an ``oom`` event's) stand in for its own.
    ``in_flight_series``: ``(ts_s, requests in flight from then on)`` in time order (from the
    request events), which the load check and the load-aware floor read; ``kv_refusals_ts``:
    when a KV pool refused blocks (``kv_alloc_failed`` or preemption events).
    """
    at = postmortem.ts_s if postmortem is not None else ts_s
    before = [s for s in samples if at is None or s.ts_s <= at]
    last = before[-1] if before else None
    if requests_in_flight is None and postmortem is None and in_flight_series and at is not None:
        requests_in_flight = _in_flight_at(in_flight_series, at)
    facts = _Facts(postmortem, last, before, requests_in_flight)
    if postmortem is None:
        facts.failed = failed_alloc_bytes
        if phase is not None:
            facts.phase = phase
    facts.loads = _loads(in_flight_series, before)
    facts.kv_refused = at is not None and any(
        at - KV_REFUSAL_WINDOW_S <= t <= at for t in kv_refusals_ts)
    cause = next((name for name, check in _CHECKS if check(facts)), "unknown")
    return cause, REMEDIES[cause]


def _in_flight_at(series: Sequence[tuple[float, int]], ts_s: float) -> int:
    """Requests in flight at ``ts_s`` from the step series (0 before its first step)."""
    n = 0
    for t, count in series:
        if t > ts_s:
            break
        n = count
    return n


def _loads(series: Sequence[tuple[float, int]], before: Sequence[Sample]) -> list[int] | None:
    """The requests in flight at each sample of ``before``; None without a series."""
    if not series:
        return None
    out, i, n = [], 0, 0
    for s in before:
        while i < len(series) and series[i][0] <= s.ts_s:
            n = series[i][1]
            i += 1
        out.append(n)
    return out


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
        self.loads: list[int] | None = None  # requests in flight at each sample of ``before``
        self.kv_refused = False
        self.kv_usage = _kv_usage(before)


def _kv_usage(before: Sequence[Sample]) -> float | None:
    """Used / total blocks of the latest KV reading, when recent enough to speak of the OOM."""
    if not before:
        return None
    end = before[-1].ts_s
    for s in reversed(before):
        if end - s.ts_s > SNAPSHOT_MAX_AGE_S:
            return None
        if s.kv_blocks_used is not None and s.kv_blocks_total:
            return s.kv_blocks_used / s.kv_blocks_total
    return None


def _is_startup(f: _Facts) -> bool:
    busy = f.phase in (Phase.PREFILL, Phase.DECODE) or (f.in_flight or 0) > 0
    return not busy and not f.served


def _is_fragmentation(f: _Facts) -> bool:
    if f.reserved is None or f.allocated is None:
        return False
    cached_free = max(0, f.reserved - f.allocated)
    if f.failed is not None:
        if _is_full(f):
            return False  # its free memory is in pieces, but too little of it
        no_block = f.largest_free is not None and f.largest_free < f.failed
        # no snapshot: the allocator failed with the free memory under the limit, and was
        # retrying (flushing its cache for a block it could not find) before it gave up
        unseen = f.largest_free is None and f.ext_frag is None and _retried(f.before)
        return no_block or unseen or (f.ext_frag or 0) >= FRAGMENTED_RATIO
    return (f.ext_frag or 0) >= FRAGMENTED_RATIO and f.total is not None and f.total != 0 \
        and cached_free >= SPIKE_RATIO * f.total


def _retried(before: Sequence[Sample]) -> bool:
    """``num_alloc_retries`` rose over the samples before the OOM (its own sample aside: an OOM
    counts a retry of its own)."""
    counts = [s.num_alloc_retries for s in before[:-1] if s.num_alloc_retries is not None]
    return len(counts) >= 2 and counts[-1] > counts[0]


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


def _is_kv_exhaustion(f: _Facts) -> bool:
    return f.kv_refused or (f.kv_usage is not None and f.kv_usage >= KV_FULL_RATIO)


def _is_growth(f: _Facts) -> bool:
    if not f.total:
        return False
    rise, fitted = _floor_rise(f.before, f.loads)
    if rise is None:
        return False
    if rise >= GROWTH_RATIO * f.total:
        return True
    if fitted:
        return False  # a fit's time term within GROWTH_RATIO is within its own error
    short = _shortfall(f)  # a full device: did the rise take the room the allocation needed?
    return short is not None and short > 0 and rise >= max(short, FULL_RATIO * f.total)


def _is_load(f: _Facts) -> bool:
    """More requests in flight at the OOM than early on, by ``LOAD_RATIO`` (the floor was
    flat: the growth check comes first)."""
    if f.loads is None or f.in_flight is None or f.in_flight < 2 or len(f.loads) < 4:
        return False
    if f.failed is not None and f.total and f.failed >= SPIKE_RATIO * f.total:
        return False  # one allocation of a tenth of the limit: a spike, not work piling up
    early = _median(f.loads[:max(1, len(f.loads) // 4)])
    return f.in_flight >= LOAD_RATIO * max(1.0, early)


def floor_rise(before: Sequence[Sample], loads: Sequence[int] | None = None) -> float | None:
    """How much the floor rose over ``before``: the memory held outside the server's work.

    The idle samples' allocated memory when the server idled early and late (the first and last
    quarter of the samples' span each hold idle samples: median of the last quarter of them
    minus median of the first); else, with ``loads`` (requests in flight per sample), the time
    term of a least-squares fit of allocated memory on the requests in flight and time
    (:func:`_load_fit`: the load's share taken out, so a load ramp is not a rising floor); else
    the non-prefill allocated memory (which a load ramp's KV cache inflates), by quarters. None
    with fewer than four readings.
    """
    return _floor_rise(before, loads)[0]


def _floor_rise(before: Sequence[Sample], loads: Sequence[int] | None
                ) -> tuple[float | None, bool]:
    """:func:`floor_rise` and whether it came from the load fit."""
    idle = _idle_floor(before)
    if idle is not None:
        return _quarter_rise(idle), False
    if loads is not None:
        points = [(s.ts_s, n, s.allocated_bytes) for s, n in zip(before, loads, strict=False)
                  if s.allocated_bytes is not None and s.phase is not Phase.PREFILL]
        rise = _load_fit(points) if len(points) >= 8 else None
        if rise is not None:
            return rise, True
    baselines = [s.allocated_bytes for s in before
                 if s.allocated_bytes is not None and s.phase is not Phase.PREFILL]
    return _quarter_rise([float(b) for b in baselines]), False


def _idle_floor(before: Sequence[Sample]) -> list[float] | None:
    """The idle samples' allocated bytes, when idle samples lie in the first and the last
    quarter of the span (a server that stopped idling has no late floor to compare)."""
    idle = [s for s in before if s.phase is Phase.IDLE and s.allocated_bytes is not None]
    if len(idle) < 4:
        return None
    start, end = before[0].ts_s, before[-1].ts_s
    quarter = (end - start) / 4
    if idle[0].ts_s > start + quarter or idle[-1].ts_s < end - quarter:
        return None
    return [float(s.allocated_bytes) for s in idle if s.allocated_bytes is not None]


def _load_fit(points: Sequence[tuple[float, int, int]]) -> float | None:
    """``allocated = a + b × in flight + c × t`` by least squares over ``(t, in flight,
    allocated)``: ``c`` over the span is the floor's rise, ``b`` the memory per request. The
    requests starting and ending around a ramp tell ``b`` from ``c`` even when the load and the
    time rise together. None when the load never moves apart from time (no ``b`` to fit)."""
    n = len(points)
    mt = sum(p[0] for p in points) / n
    mx = sum(p[1] for p in points) / n
    my = sum(p[2] for p in points) / n
    sxx = stt = sxt = sxy = sty = 0.0
    for t, x, y in points:
        dt, dx, dy = t - mt, x - mx, y - my
        sxx += dx * dx
        stt += dt * dt
        sxt += dx * dt
        sxy += dx * dy
        sty += dt * dy
    det = sxx * stt - sxt * sxt
    if sxx == 0 or stt == 0 or det <= LOAD_FIT_MIN_SPREAD * sxx * stt:
        return None
    c = (sxx * sty - sxt * sxy) / det
    return c * (points[-1][0] - points[0][0])


def _quarter_rise(values: Sequence[float]) -> float | None:
    if len(values) < 4:
        return None
    quarter = max(1, len(values) // 4)
    return _median(values[-quarter:]) - _median(values[:quarter])


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return float(ordered[len(ordered) // 2])


def _is_prefill_spike(f: _Facts) -> bool:
    if f.failed is not None and f.total and f.failed >= SPIKE_RATIO * f.total:
        return True
    return f.phase is Phase.PREFILL and (f.in_flight is None or f.in_flight <= 1)


def _is_batch(f: _Facts) -> bool:
    return (f.in_flight or 0) >= 2


_CHECKS = (
    ("startup", _is_startup),
    ("fragmentation", _is_fragmentation),
    ("kv_exhaustion", _is_kv_exhaustion),
    ("growth", _is_growth),
    ("load", _is_load),
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



def with_cause(pm: PostMortem, cause: str | None) -> PostMortem:
    """``pm`` with the engine's ``cause`` where its producer named none: the cause the alerts
    and the stored verdicts gave (growth where the process's leak verdict held a leak at the
    OOM, else the cause of the risk episode it ended), stored with the post-mortem so every
    page and command that reads it says the same. None or an unknown name: ``pm`` as it is."""
    if pm.cause in REMEDIES or cause not in REMEDIES:
        return pm
    return pm._replace(cause=cause, remedies=pm.remedies or REMEDIES[cause])
