"""The scenario suite: simulated serving recordings with known truth, generated with fixed seeds.

Each scenario is a list of samples and events (trace v1 records) from a simulated inference
server on one 80 GiB device, with the truth the detectors are scored against (when a leak
starts and how fast it grows, when the OOM happens). ``vramscope bench detection`` runs the
alert engine over every scenario; the tests check a few scenarios exactly.

The simulated server serves in cycles (a batch of requests): an idle gap (0–10 s), a prefill
(1–3 s, a spike of 2–4 % of the device), then decode while the KV cache fills (a sawtooth of
6–12 % of the device over 60–120 s), then the batch ends and its KV blocks are freed. Kinds:

- ``steady``: just that, with the KV cache inside allocated memory (a sawtooth);
- ``warmup``: allocated memory grows by 10 % of the device over the first 15 minutes (graph
  capture, allocator caches), then plateaus;
- ``leak``: from ``leak_start_s`` the floor rises by ``rate`` of the device per hour;
- ``growth_oom``: the floor rises by 1.5 % of the device per minute until a prefill no longer fits;
- ``frag_oom``: allocated stays steady but reserved memory fragments (inactive split grows, the
  largest free block shrinks, the allocator starts retrying) until a prefill finds no block;
- ``prealloc``: a KV pool preallocated at 90 % of the device, steady; the sawtooth is in the
  pool's block counters only;
- ``diurnal`` (in ``hard_cases``, with ``diurnal_leak``: the same plus a leak that starts 6 or
  18 hours into the day): never idle, with a daily load cycle — more requests in
  flight at midday hold more KV cache (up to +8 % of the device, +20 % of the pool's blocks), so
  the memory between requests follows the day; no leak. The load shows where a server shows
  it: in ``kv_blocks_used`` and in the requests per batch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from vramscope.agent.records import Event, Phase, PostMortem, Sample

GIB = 2**30
LIMIT_BYTES = 80 * GIB
CONTEXT_BYTES = GIB  # CUDA context and other non-allocator memory
KV_BLOCKS = 2000
START_S = 1_700_000_000.0


@dataclass
class Scenario:
    name: str
    kind: str
    seed: int
    samples: list[Sample]
    events: list[Event]
    duration_s: float
    postmortems: list[PostMortem] = field(default_factory=list)
    leak_start_ts: float | None = None
    leak_rate_ratio_per_h: float = 0.0
    oom_ts: float | None = None

    @property
    def days(self) -> float:
        return self.duration_s / 86400.0


@dataclass
class Cycle:
    """One serving cycle: idle, prefill (a spike), decode while the KV cache fills."""

    start: float
    idle_s: float
    prefill_s: float
    length_s: float
    spike: int
    kv_amp: float
    requests: int = 0  # the batch's requests (0: a scenario without request events)


class _Server:
    """One simulated server; ``run`` yields its samples and events."""

    def __init__(self, rng: random.Random, dt_s: float, floor: Callable[[float], float],
                 prealloc_ratio: float | None = None, never_idle: bool = False,
                 noise_ratio: float = 0.0005,
                 load: Callable[[float], float] = lambda t: 0.0) -> None:
        self.rng, self.dt_s, self.floor = rng, dt_s, floor
        # KV cache held by the extra requests in flight under the day's load, a share of the
        # device as a function of time (the diurnal server): in the KV blocks in use too
        self.load = load
        self.noise_ratio = noise_ratio  # sd of the allocated memory's noise, share of the device
        self.prealloc = prealloc_ratio
        self.weights = int(0.30 * LIMIT_BYTES)
        self.reserved = 0
        self.samples: list[Sample] = []
        self.events: list[Event] = []
        self._req = 0
        self.never_idle = never_idle  # continuous batching under load: no gap between batches
        self.frag_duration_s = 0.0  # frag_oom: how long reserved memory takes to fragment
        self.retries = 0  # frag_oom: num_alloc_retries so far

    def _cycle(self, start: float) -> Cycle:
        r = self.rng
        kv_amp = r.uniform(0.06, 0.12) if self.prealloc is None else r.uniform(0.30, 0.40)
        spike_ratio = r.uniform(0.02, 0.04) if self.prealloc is None else r.uniform(0.01, 0.015)
        idle_s = 0.0 if self.never_idle else r.uniform(0, 10)
        # the load's extra KV is held by extra requests: one per 0.5 % of the device
        extra = int(self.load(start - START_S) / 0.005)
        return Cycle(start, idle_s, r.uniform(1, 3), r.uniform(60, 120),
                      int(spike_ratio * LIMIT_BYTES), kv_amp, r.randint(4, 16) + extra)

    def state(self, c: Cycle, t: float) -> tuple[Phase, float, int]:
        """(phase, KV fill fraction of its amplitude, activation bytes) at time ``t``."""
        p = t - c.start
        if p < c.idle_s:
            return Phase.IDLE, 0.0, 0
        if p < c.idle_s + c.prefill_s:
            return Phase.PREFILL, 0.0, c.spike
        fill = (p - c.idle_s - c.prefill_s) / (c.length_s - c.idle_s - c.prefill_s)
        return Phase.DECODE, min(1.0, fill), int(0.005 * LIMIT_BYTES)

    def allocated(self, t: float, kv_fill: float, c: Cycle, activation: int) -> int:
        noise = int(self.rng.gauss(0, self.noise_ratio) * LIMIT_BYTES)
        extra = int(self.floor(t - START_S) * LIMIT_BYTES)
        if self.prealloc is not None:
            return int(self.prealloc * LIMIT_BYTES) + activation + extra + abs(noise)
        kv = int(self._kv_ratio(t, c, kv_fill) * LIMIT_BYTES)
        return self.weights + kv + activation + extra + abs(noise)

    def _kv_ratio(self, t: float, c: Cycle, kv_fill: float) -> float:
        """KV cache held (share of the device): the batch's fill, plus the day's load."""
        return 0.02 + self.load(t - START_S) + c.kv_amp * kv_fill

    def kv_blocks(self, c: Cycle, kv_fill: float, t: float = START_S) -> tuple[int, int]:
        if self.prealloc is not None:
            used = 0.10 + c.kv_amp * kv_fill
        else:  # the pool's blocks are 0.40 of the device: the KV bytes above, in blocks
            used = self._kv_ratio(t, c, kv_fill) / 0.40
        used_blocks = int(used * KV_BLOCKS)
        return used_blocks, min(KV_BLOCKS - used_blocks, int(0.05 * KV_BLOCKS))

    def request_events(self, c: Cycle) -> None:
        t0 = c.start + c.idle_s
        ids = [f"r{self._req + i}" for i in range(c.requests)]
        self._req += c.requests
        self.events += [Event(t0, "request_start", 0, request_id=i) for i in ids]
        self.events += [Event(c.start + c.length_s - 1e-3, "request_end", 0, request_id=i)
                        for i in ids]


def _sample(t: float, phase: Phase, allocated: int, reserved: int, used_blocks: int,
            cached_blocks: int, *, split: int = 0, largest: int | None = None,
            retries: int = 0, ooms: int = 0) -> Sample:
    return Sample(t, 0, phase, "sim", allocated_bytes=allocated, reserved_bytes=reserved,
                  active_bytes=allocated, inactive_split_bytes=split, requested_bytes=allocated,
                  largest_free_block_bytes=largest, num_alloc_retries=retries, num_ooms=ooms,
                  device_used_bytes=reserved + CONTEXT_BYTES, device_total_bytes=LIMIT_BYTES,
                  kv_blocks_used=used_blocks, kv_blocks_total=KV_BLOCKS,
                  kv_blocks_cached=cached_blocks)


def simulate(name: str, kind: str, seed: int, duration_s: float, dt_s: float,
             floor: Callable[[float], float] = lambda t: 0.0,
             prealloc_ratio: float | None = None, never_idle: bool = False,
             noise_ratio: float = 0.0005,
             load: Callable[[float], float] = lambda t: 0.0) -> Scenario:
    """A server that never runs out of memory (steady, warmup, leak, prealloc, diurnal)."""
    rng = random.Random(seed)
    srv = _Server(rng, dt_s, floor, prealloc_ratio, never_idle, noise_ratio, load)
    c = srv._cycle(START_S)
    srv.request_events(c)
    t = START_S
    while t < START_S + duration_s:
        if t >= c.start + c.length_s:
            c = srv._cycle(c.start + c.length_s)
            srv.request_events(c)
        phase, fill, act = srv.state(c, t)
        alloc = srv.allocated(t, fill, c, act)
        srv.reserved = max(srv.reserved, alloc + GIB)
        used, cached = srv.kv_blocks(c, fill, t)
        split = int(rng.uniform(0.005, 0.02) * srv.reserved)
        srv.samples.append(_sample(t, phase, alloc, srv.reserved, used, cached, split=split))
        t += dt_s
    events = [e for e in srv.events if e.ts_s < START_S + duration_s]
    return Scenario(name, kind, seed, srv.samples, events, duration_s)


def growth_oom(seed: int, dt_s: float = 1.0, rate_per_min: float = 0.015) -> Scenario:
    """The floor rises until a prefill spike no longer fits under the limit: OOM."""
    rng = random.Random(seed)
    srv = _Server(rng, dt_s, lambda t: rate_per_min * t / 60.0)
    return _run_to_oom(f"growth_oom/{seed}", "growth_oom", seed, srv, rng, _growth_step)


def frag_oom(seed: int, dt_s: float = 1.0, duration_s: float = 1500.0) -> Scenario:
    """Reserved memory fragments until no block holds a prefill: OOM with memory free."""
    rng = random.Random(seed)
    srv = _Server(rng, dt_s, lambda t: 0.0)
    srv.frag_duration_s = duration_s
    return _run_to_oom(f"frag_oom/{seed}", "frag_oom", seed, srv, rng, _frag_step)


def _run_to_oom(name: str, kind: str, seed: int, srv: _Server, rng: random.Random,
                step: Callable[[_Server, random.Random, Cycle, float], PostMortem | None]
                ) -> Scenario:
    c = srv._cycle(START_S)
    srv.request_events(c)
    t = START_S
    while t < START_S + 6 * 3600:
        if t >= c.start + c.length_s:
            c = srv._cycle(c.start + c.length_s)
            srv.request_events(c)
        pm = step(srv, rng, c, t)
        if pm is not None:
            srv.events.append(Event(t, "oom", 0, phase=pm.phase, data={"message": pm.message}))
            events = [e for e in srv.events if e.ts_s <= t]
            return Scenario(name, kind, seed, srv.samples, events, t - START_S, [pm],
                            oom_ts=t)
        t += srv.dt_s
    raise AssertionError(f"{name}: the simulated server never ran out of memory")


def _growth_step(srv: _Server, rng: random.Random, c: Cycle, t: float) -> PostMortem | None:
    phase, fill, act = srv.state(c, t)
    alloc = srv.allocated(t, fill, c, act)
    used, cached = srv.kv_blocks(c, fill, t)
    room = LIMIT_BYTES - CONTEXT_BYTES
    oom = alloc > room
    srv.reserved = min(room, max(srv.reserved, alloc + GIB))
    shown = min(alloc, srv.reserved)
    srv.samples.append(_sample(t, phase, shown, srv.reserved, used, cached,
                               split=int(0.01 * srv.reserved), ooms=int(oom)))
    if not oom:
        return None
    return _postmortem(t, phase, max(act, alloc - shown), shown, srv.reserved,
                       srv.reserved - shown, c.requests)


def _frag_step(srv: _Server, rng: random.Random, c: Cycle, t: float) -> PostMortem | None:
    phase, fill, act = srv.state(c, t)
    alloc = srv.allocated(t, fill, c, act)
    used, cached = srv.kv_blocks(c, fill, t)
    progress = min(1.0, (t - START_S) / srv.frag_duration_s)
    top = LIMIT_BYTES - CONTEXT_BYTES
    srv.reserved = max(srv.reserved, alloc + GIB, int(0.60 * top + 0.40 * top * progress))
    srv.reserved = min(srv.reserved, top)
    cached_free = srv.reserved - alloc
    frag = 0.2 + 0.78 * progress
    largest = int(cached_free * (1 - frag))
    room = (top - srv.reserved) + largest
    need = c.spike
    if phase is Phase.PREFILL and room < 1.5 * need:
        srv.retries += 1
    oom = phase is Phase.PREFILL and room < need
    srv.samples.append(_sample(t, phase, alloc, srv.reserved, used, cached,
                               split=int(cached_free * frag), largest=largest,
                               retries=srv.retries, ooms=int(oom)))
    if not oom:
        return None
    return _postmortem(t, phase, need, alloc, srv.reserved, largest, 1)


def _postmortem(t: float, phase: Phase, failed: int, allocated: int, reserved: int,
                largest: int, in_flight: int) -> PostMortem:
    driver_free = LIMIT_BYTES - CONTEXT_BYTES - reserved
    cached_free = max(1, reserved - allocated)
    return PostMortem(t, 0, None, phase, failed, driver_free, LIMIT_BYTES, allocated, reserved,
                      largest, max(0.0, 1 - min(largest, cached_free) / cached_free),
                      tuple(f"r{i}" for i in range(in_flight)),
                      message=f"CUDA out of memory. Tried to allocate {failed / GIB:.2f} GiB")


# --- the suite ---------------------------------------------------------------------------------
LEAK_RATES = (0.0025, 0.005, 0.01, 0.02)  # share of the device per hour
LEAK_START_S = 1800.0


def warmup_floor(t: float) -> float:
    return 0.10 * min(1.0, t / 900.0)


def leak(rate_per_h: float, seed: int, dt_s: float = 2.0, after_s: float = 3 * 3600,
         never_idle: bool = False, noise_ratio: float = 0.0005) -> Scenario:
    def floor(t: float) -> float:
        return warmup_floor(t) + rate_per_h * max(0.0, t - LEAK_START_S) / 3600.0

    prefix = "never_idle_leak" if never_idle else "leak"
    sc = simulate(f"{prefix}/{rate_per_h:.2%}/{seed}", "leak", seed, LEAK_START_S + after_s,
                  dt_s, floor, never_idle=never_idle, noise_ratio=noise_ratio)
    sc.leak_start_ts = START_S + LEAK_START_S
    sc.leak_rate_ratio_per_h = rate_per_h
    return sc


def steady(seed: int, days: float = 7.0, dt_s: float = 10.0) -> Scenario:
    return simulate(f"steady/{seed}", "steady", seed, days * 86400, dt_s)


def warmup(seed: int, days: float = 1.0, dt_s: float = 5.0) -> Scenario:
    return simulate(f"warmup/{seed}", "warmup", seed, days * 86400, dt_s, warmup_floor)


def prealloc(seed: int, days: float = 7.0, dt_s: float = 10.0) -> Scenario:
    return simulate(f"prealloc/{seed}", "prealloc", seed, days * 86400, dt_s,
                    prealloc_ratio=0.90)


def diurnal_load(t: float) -> float:
    """KV held by the day's extra requests: +8 % of the device from night to midday and back."""
    return 0.08 * (1 - math.cos(2 * math.pi * t / 86400.0)) / 2


def diurnal(seed: int, days: float = 2.0, dt_s: float = 10.0) -> Scenario:
    """Never idle, and the memory between requests follows a daily load cycle held as KV cache
    by more requests in flight at midday: no leak, and no idle floor either."""
    return simulate(f"diurnal/{seed}", "diurnal", seed, days * 86400, dt_s, never_idle=True,
                    load=diurnal_load)


def diurnal_leak(rate_per_h: float, seed: int, start_h: float, dt_s: float = 10.0,
                 after_s: float = 3 * 3600) -> Scenario:
    """The diurnal server with a leak from ``start_h`` hours into its day (while the load
    rises, or falls): the leak must be told from the day's swing."""
    start = start_h * 3600.0

    def floor(t: float) -> float:
        return rate_per_h * max(0.0, t - start) / 3600.0

    sc = simulate(f"diurnal_leak/{rate_per_h:.2%}/{start_h:g}h/{seed}", "leak", seed,
                  start + after_s, dt_s, floor, never_idle=True, load=diurnal_load)
    sc.leak_start_ts = START_S + start
    sc.leak_rate_ratio_per_h = rate_per_h
    return sc


def suite(quick: bool = False) -> list[Scenario]:
    """Every scenario of the benchmark; ``quick`` shortens the long ones and uses fewer seeds."""
    seeds = (1, 2) if quick else (1, 2, 3, 4, 5)
    days = 0.25 if quick else 7.0
    out = [steady(11, days), prealloc(12, days), warmup(13, min(days, 1.0))]
    out += [leak(rate, seed) for rate in LEAK_RATES for seed in seeds]
    out += [growth_oom(seed) for seed in seeds] + [frag_oom(seed) for seed in seeds]
    return out


def hard_cases(quick: bool = False) -> list[Scenario]:
    """Never-idle serving: leaks under a large KV sawtooth, a daily load cycle that moves
    the memory between requests (no leak), and leaks that start while that load rises (6 h
    into the day) or falls (18 h)."""
    seeds = (1,) if quick else (1, 2, 3)
    out = [leak(rate, seed, never_idle=True) for rate in LEAK_RATES[1:] for seed in seeds]
    out += [diurnal(seed, days=0.5 if quick else 2.0) for seed in seeds[:2]]
    return out + [diurnal_leak(0.005, seed, start_h) for seed in seeds[:1]
                  for start_h in (6.0, 18.0)]
