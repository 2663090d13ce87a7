"""The long suite's building blocks: traffic, requests, leaks and the simulated server.

Time ``u`` is seconds since the trace's start (``START_S``); shares are of the limit (the
device, or the per-process limit); bytes are integers. One ``random.Random(spec.seed)`` drives
everything, so a spec is one trace.

The simulated server serves jobs: a request (``per_request_kv``, ``paged_pool``: continuous
batching) or a wave of requests (``static_batch``). A job's prefill holds activations for its
prefill time, then its KV cache grows linearly from ``kv0`` to ``kv1`` while it decodes and is
freed at its end. The KV cache is allocated memory in ``per_request_kv`` and ``static_batch``;
in ``paged_pool`` it lives in a pool preallocated in SETUP (``util`` of the limit less weights,
activation budget and warm-up) and shows only as ``kv_blocks_used``. A ``per_request_kv`` server
whose hooks report it (``spec.kv_tokens``, as ``attach_transformers`` does for ``generate()``)
also puts the tokens its requests in flight hold in ``kv_tokens_used``: their KV bytes over
``KV_TOKEN_BYTES``.

The caching allocator: reserved follows allocated plus a slack; a prefill's activations must fit
the largest free block, ``(cached free - inactive split) x piece`` (``spec.piece``), else the
allocator adds a segment; past the limit it frees its whole free segments and retries
(``num_alloc_retries``); if that fails too, the prefill is an OOM. The inactive split is a share
of the cached free memory (``spec.split``). A fragmenting server's share climbs to 0.999 over
its ``develop_s`` while its reserved memory reaches the limit in the first half: retries rise
from then on until a prefill finds no room even after one.

One process at a time: a reload's successor starts after its predecessor exited, so two
processes never share the device (no restart beside a leaker). A growth failure leaks steadily
from its onset at the rate that fills the headroom left then (the limit less the peak so far) in
its ``develop_s``; the fast group (``spec.fast``) keeps its leak's history a point a sample.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from vramscope.agent.records import Event, Phase, PostMortem, Sample

from tools.bench.labelled_recordings import CONTEXT_BYTES, GIB, START_S

LEAK_HISTORY_S = 60.0  # the truth's leaked bytes, recorded this often (the slope scored)

if TYPE_CHECKING:  # the spec is defined with the suite; this module only reads it
    from tools.bench.long_suite import Spec

ENGINES = ("per_request_kv", "paged_pool", "static_batch")
TRAFFICS = ("diurnal", "bursty", "never_idle")
LEAK_SHAPES = ("per_request", "steps", "under_load", "sawtooth", "never_idle")
CAUSES = ("fragmentation", "growth", "load", "kv_exhaustion", "prefill_spike")
RAMPED = ("load", "kv_exhaustion")  # failures driven by an arrival rate ramping up
WINDOW_S = 2 * 3600.0  # a leak's truth rate is its average over this long after onset
MIN_CLEAN_S = 3600.0 + 150.0  # a leak starts after an hour of serving (setup takes <= 150 s)
MIN_AFTER_S = 3 * 3600.0  # and runs this long
MIN_DEVELOP_S = 600.0  # a gradual failure takes at least this long
FAST_MIN_DEVELOP_S = 180.0  # ...but in the fast group (``Spec.fast``), this long
MIB = 2**20
BLOCK_BYTES = 2 * MIB  # one block of the paged KV pool
KV_TOKEN_BYTES = 128 * 1024  # one token's KV in a per-request cache (an 8B model, GQA, fp16)
SLACK_BYTES = 512 * MIB  # reserved beyond allocated after a small allocation
SNAPSHOT_EVERY_S = 60.0  # an allocator snapshot (largest free block) this often
NOISE_RATIO = 0.0003  # sd of allocated memory's noise, share of the limit
FRAG_SPLIT = 0.999  # a fully fragmented server's inactive split share of cached free


def require(ok: bool, message: str) -> None:
    """Validate at construction, quoting the bad value."""
    if not ok:
        raise ValueError(message)


# --- traffic -----------------------------------------------------------------------------------
class Traffic:
    """The arrival rate (requests per second) at ``u``: a daily sine (busy at midday), Poisson
    bursts of 1-5 minutes at 4-8x every ~20 minutes, or a never-idle rate wobbling +-25 %;
    ramped up to ``factor``x over a ``load``/``kv_exhaustion`` failure's development."""

    def __init__(self, spec: Spec, rng: random.Random) -> None:
        self.kind, self.mean = spec.traffic, spec.rate_per_s
        self.amp, self.period_s = rng.uniform(0.5, 0.8), rng.uniform(1800.0, 5400.0)
        self.shift_s = spec.start_hour * 3600.0
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.mults: list[float] = []
        if self.kind == "bursty":
            self._bursts(rng, spec.duration_s)
        f = spec.failure
        self.ramp = (f.onset_s, f.develop_s, f.factor) if f and f.cause in RAMPED else None

    def _bursts(self, rng: random.Random, duration_s: float) -> None:
        u = rng.expovariate(1 / 1200.0)
        while u < duration_s:
            self.starts.append(u)
            self.ends.append(u + rng.uniform(60.0, 300.0))
            self.mults.append(rng.uniform(4.0, 8.0))
            u = self.ends[-1] + rng.expovariate(1 / 1200.0)

    def rate(self, u: float) -> float:
        r = self._base(u)
        if self.ramp is not None:
            onset, develop, k = self.ramp
            r *= 1 + (k - 1) * min(1.0, max(0.0, (u - onset) / develop))
        return r

    def _base(self, u: float) -> float:
        if self.kind == "diurnal":
            return self.mean * (1 - self.amp * math.cos(2 * math.pi * (u + self.shift_s) / 86400))
        if self.kind == "never_idle":
            return self.mean * (1 + 0.25 * math.sin(2 * math.pi * u / self.period_s))
        i = bisect_right(self.starts, u) - 1
        return self.mean * (self.mults[i] if i >= 0 and u < self.ends[i] else 1.0)

    def max_rate(self) -> float:
        peak = {"diurnal": 1 + self.amp, "never_idle": 1.25, "bursty": 8.0}[self.kind]
        return self.mean * peak * (self.ramp[2] if self.ramp else 1.0)

    def arrivals(self, rng: random.Random, start: float, end: float) -> list[float]:
        """A Poisson process at ``rate`` between ``start`` and ``end`` (thinning)."""
        out: list[float] = []
        top, u = self.max_rate(), start
        while True:
            u += rng.expovariate(top)
            if u >= end:
                return out
            if rng.random() * top < self.rate(u):
                out.append(u)


# --- jobs --------------------------------------------------------------------------------------
class Job(NamedTuple):
    """A request, or a static batch's wave of ``n`` requests, ids ``first`` to ``first+n-1``."""

    start: float
    prefill_s: float
    decode_s: float
    act: int  # activations of the prefill
    kv0: int  # KV cache after the prefill
    kv1: int  # KV cache at the end
    first: int
    n: int
    giant: float = 0.0  # > 0: a huge prompt whose activations are this share of the free memory


def _request(rng: random.Random, spec: Spec, limit: int, u: float, rid: int) -> Job:
    size = rng.uniform(0.4, 1.6) if rng.random() > 0.02 else rng.uniform(2.0, 3.0)
    kv0 = int(0.3 * spec.kv * limit * size)
    kv1 = kv0 + int(0.7 * spec.kv * limit * rng.uniform(0.3, 1.7))
    return Job(u, 0.3 + 1.2 * size * rng.uniform(0.7, 1.3), rng.uniform(*spec.decode_s),
               int(spec.act * limit * size), kv0, kv1, rid, 1)


def jobs(rng: random.Random, spec: Spec, limit: int, arrivals: list[float],
         giants: list[tuple[float, float]]) -> Iterator[Job]:
    """Requests one by one (continuous batching), or waves (static batching)."""
    if spec.engine == "static_batch":
        yield from _waves(rng, spec, limit, arrivals, giants)
        return
    ids, g = itertools.count(), 0
    for u in arrivals:
        while g < len(giants) and giants[g][0] <= u:
            yield _request(rng, spec, limit, giants[g][0], next(ids))._replace(giant=giants[g][1])
            g += 1
        yield _request(rng, spec, limit, u, next(ids))


def _waves(rng: random.Random, spec: Spec, limit: int, arrivals: list[float],
           giants: list[tuple[float, float]]) -> Iterator[Job]:
    """A wave takes what queued (up to ``max_batch``) when the last one ended, or collects for
    2-8 s after an arrival to an empty queue; all its requests end together."""
    i, g, free = 0, 0, 0.0
    while i < len(arrivals):
        t0 = free if arrivals[i] <= free else arrivals[i] + rng.uniform(2.0, 8.0)
        j = min(bisect_right(arrivals, t0, i), i + spec.max_batch)
        reqs = [_request(rng, spec, limit, t0, i + k) for k in range(j - i)]
        giant = 0.0
        if g < len(giants) and giants[g][0] <= t0:
            giant, g = giants[g][1], g + 1
        job = Job(t0, max(r.prefill_s for r in reqs), max(r.decode_s for r in reqs),
                  sum(r.act for r in reqs), sum(r.kv0 for r in reqs), sum(r.kv1 for r in reqs),
                  i, j - i, giant)
        free, i = t0 + job.prefill_s + job.decode_s, j  # the next wave may start at once
        yield job


def giants(rng: random.Random, spec: Spec) -> list[tuple[float, float]]:
    """prefill_spike: 3-6 large prompts that fit (0.55-0.8 of the free memory) between onset
    and the fatal one, which needs 1.2-1.5x the free memory at ``onset + develop``."""
    f = spec.failure
    if f is None or f.cause != "prefill_spike":
        return []
    fatal = f.onset_s + f.develop_s
    out = [(rng.uniform(f.onset_s, fatal - 300.0), rng.uniform(0.55, 0.8))
           for _ in range(rng.randint(3, 6))]
    return sorted(out) + [(fatal, rng.uniform(1.2, 1.5))]


# --- leaks -------------------------------------------------------------------------------------
@dataclass
class LeakPlan:
    """How a leak's bytes accrue; every shape averages ``rate`` over WINDOW_S after onset."""

    shape: str
    onset: float
    rate_b: float  # bytes per second, the average
    per_request_b: float = 0.0  # per_request: kept per finished request
    steps_u: list[float] = field(default_factory=list)  # steps: when it jumps...
    steps_b: list[float] = field(default_factory=list)  # ...and by how much
    median: float = 0.0  # under_load: leaks only while the arrival rate is above this...
    on_b: float = 0.0  # ...at this rate (bytes per second)


def leak_plan(rng: random.Random, spec: Spec, limit: int, traffic: Traffic,
              arrivals: list[float]) -> LeakPlan | None:
    """per_request: bytes per request = rate x WINDOW_S / requests arriving in the window (they
    finish in it, but for the last minute or two); steps: jumps at gaps of 10-30 min scaled so
    the window holds whole gaps, each jump the rate times its gap; under_load: rate / (share of
    the window's sample times whose arrival rate is above the trace's median)."""
    f, lk = spec.failure, spec.leak
    if f is not None and f.cause == "growth":
        return LeakPlan("growth", f.onset_s, 0.0)  # its rate is set at onset (_Sim._accrue)
    if lk is None:
        return None
    plan = LeakPlan(lk.shape, lk.onset_s, lk.rate * limit / 3600.0)
    if lk.shape == "per_request":
        n = bisect_left(arrivals, lk.onset_s + WINDOW_S) - bisect_left(arrivals, lk.onset_s)
        plan.per_request_b = plan.rate_b * WINDOW_S / max(1, n)
    elif lk.shape == "steps":
        plan.steps_u, plan.steps_b = _steps(rng, lk.onset_s, spec.duration_s, plan.rate_b)
    elif lk.shape == "under_load":
        _under_load(plan, spec, traffic)
    return plan


def _steps(rng: random.Random, onset: float, end: float, rate_b: float
           ) -> tuple[list[float], list[float]]:
    gaps = [rng.uniform(600.0, 1800.0)]
    while sum(gaps) < WINDOW_S:
        gaps.append(rng.uniform(600.0, 1800.0))
    if len(gaps) > 1 and sum(gaps) - WINDOW_S > WINDOW_S - sum(gaps[:-1]):
        gaps.pop()
    scale = WINDOW_S / sum(gaps)
    gaps = [x * scale for x in gaps]
    u = onset
    while u < end:
        gaps.append(rng.uniform(600.0, 1800.0))
        u += gaps[-1]
    times = list(itertools.accumulate(gaps[:-1], initial=onset))
    return times, [rate_b * x for x in gaps]


def _under_load(plan: LeakPlan, spec: Spec, traffic: Traffic) -> None:
    grid = [traffic.rate(k * 60.0) for k in range(int(spec.duration_s / 60.0))]
    plan.median = sorted(grid)[len(grid) // 2]
    k0 = math.ceil(plan.onset / spec.dt_s)
    times = [k * spec.dt_s for k in range(k0, k0 + int(WINDOW_S / spec.dt_s))]
    high = sum(traffic.rate(u) > plan.median for u in times) / len(times)
    require(high >= 0.05, f"{spec.name}: load above its median only {high:.1%} of the window")
    plan.on_b = plan.rate_b / high


# --- the simulated server process --------------------------------------------------------------
@dataclass
class _Proc:
    """One server process: its pid, its start-up and its allocator's counters."""

    pid: int
    start_u: float
    load_end_u: float  # weights loaded (UNKNOWN before), then SETUP
    serve_u: float  # serving from here
    warm_u: list[float]  # lazy warm-up: when the allocator's caches grow...
    warm_b: list[int]  # ...to how much, cumulative
    reserved: int = 0
    retries: int = 0
    ooms: int = 0

    def warm(self, u: float) -> int:
        i = bisect_right(self.warm_u, u)
        return self.warm_b[i - 1] if i else 0


@dataclass
class Run:
    """What one simulation produced, and the truth it measured."""

    samples: list[Sample]
    events: list[Event]
    postmortems: list[PostMortem]
    end_u: float
    oom_u: float | None  # the OOM, or the paged pool filling (kv_exhaustion)
    leak_onset_u: float | None
    warm_end_u: float
    reloads_u: list[float]
    peak_bytes: int  # the most allocated + context, at any instant before an OOM
    retries: int  # allocator retries, all processes
    leaked: list[tuple[float, int]] = field(default_factory=list)  # (u, bytes leaked by then),
    #                           a point a minute from onset (the fast group: one every sample)
    leak_rate_b: float = 0.0  # the leak's average rate (growth: set at its onset), bytes/s


class Sim:
    """Steps one spec's server through its trace, one sample every ``dt_s``."""

    def __init__(self, spec: Spec) -> None:
        self.spec, self.rng = spec, random.Random(spec.seed)
        self.limit = spec.limit_gib * GIB
        self.top = self.limit - CONTEXT_BYTES  # what the allocator may reserve
        self.paged = spec.engine == "paged_pool"
        self.warm_total = int(self.rng.uniform(0.05, 0.10) * self.limit) * spec.lazy_warmup
        self.budget = int(2.5 * spec.act * self.limit)  # paged: activations planned for
        self.pool = int(spec.util * self.limit) - CONTEXT_BYTES - int(spec.weights * self.limit) \
            - self.budget - self.warm_total  # paged: the KV pool, what the plan leaves
        self.blocks = self.pool // BLOCK_BYTES
        self.traffic = Traffic(spec, self.rng)
        arrivals = self.traffic.arrivals(self.rng, 0.0, spec.duration_s)
        self.leak = leak_plan(self.rng, spec, self.limit, self.traffic, arrivals)
        self.jobs = jobs(self.rng, spec, self.limit, arrivals, giants(self.rng, spec))
        self.next_job = next(self.jobs, None)
        self.heap: list[tuple[float, int, int, Job, float]] = []  # (u, seq, 0/1, job, x)
        self.seq = itertools.count()
        self.history_s = spec.dt_s if spec.fast else LEAK_HISTORY_S
        self.gap_starts = [s for s, _ in spec.agent_gaps]
        self.gap_ends = [s + n for s, n in spec.agent_gaps]
        self._reset_state()
        self.proc = self._new_proc(0.0, 1000 + self.rng.randrange(100_000))
        self.warm_end_u = self.proc.warm_u[-1] if self.proc.warm_u else self.proc.serve_u

    def _reset_state(self) -> None:
        self.samples: list[Sample] = []
        self.events: list[Event] = []
        self.postmortems: list[PostMortem] = []
        self.kv_a = self.kv_g = 0.0  # KV bytes in decode at u: kv_a + kv_g * u
        self.act = self.prefilling = self.decoding = 0
        self.leaked = 0.0
        self.peak = self.prev_alloc = self.retries_before = self.steps_seen = 0
        self.oom_u: float | None = None
        self.stop_u: float | None = None
        self.fill_u: float | None = None  # kv_exhaustion: when the pool filled
        self.draining, self.next_snap = False, 0.0
        self.reloads_u: list[float] = []
        self.leak_history: list[tuple[float, int]] = []

    def _new_proc(self, u: float, pid: int) -> _Proc:
        load_end = u + self.rng.uniform(20.0, 60.0)
        serve = load_end + self.rng.uniform(30.0, 80.0 if self.paged else 40.0)
        times: list[float] = []
        sizes: list[int] = []
        if self.warm_total:
            times = sorted(self.rng.uniform(serve, serve + self.rng.uniform(600.0, 1200.0))
                           for _ in range(self.rng.randint(8, 20)))
            weights = [self.rng.random() for _ in times]
            sizes = [int(self.warm_total * w / sum(weights)) for w in weights]
        return _Proc(pid, u, load_end, serve, times, list(itertools.accumulate(sizes)))

    def run(self) -> Run:
        for k in range(int(self.spec.duration_s / self.spec.dt_s) + 1):
            u = k * self.spec.dt_s
            self._advance(u)
            if self.oom_u is None:
                self._step(u)
            if self.oom_u is not None or (self.stop_u is not None and u >= self.stop_u):
                break
        end = self.oom_u if self.oom_u is not None and self.stop_u is None else u
        onset = self.leak.onset if self.leak else None
        return Run(self.samples, self.events, self.postmortems, end,
                   self.fill_u if self.stop_u is not None else self.oom_u, onset,
                   self.warm_end_u, self.reloads_u, self.peak + CONTEXT_BYTES,
                   self.retries_before + self.proc.retries, self.leak_history,
                   self.leak.rate_b if self.leak else 0.0)

    # --- requests ------------------------------------------------------------------------------
    def _advance(self, u: float) -> None:
        """Start, move to decode and end the jobs due by ``u``, in time order."""
        while self.oom_u is None:
            nj = self.next_job.start if self.next_job else math.inf
            nh = self.heap[0][0] if self.heap else math.inf
            if min(nj, nh) > u:
                return
            if nj <= nh and self.next_job is not None:
                job, self.next_job = self.next_job, next(self.jobs, None)
                self._start(job, nj)
            else:
                _, _, kind, job, x = heapq.heappop(self.heap)
                (self._decode if kind == 0 else self._end)(job, x, nh)

    def _start(self, job: Job, u: float) -> None:
        if self.draining or u < self.proc.serve_u:
            return  # no process serves: the request is refused
        need = self._need(job, u)
        if not self._fits(u, need):
            self._oom(u, need, Phase.PREFILL, self._alloc_now(u))
            return
        for k in range(job.first, job.first + job.n):
            self._emit(u, "request_start", f"r{k}")
        self.act += need
        self.prefilling += 1
        self.peak = max(self.peak, self._alloc_now(u))
        heapq.heappush(self.heap, (u + job.prefill_s, next(self.seq), 0, job, float(need)))

    def _need(self, job: Job, u: float) -> int:
        if job.giant:
            return int(job.giant * (self.top - self._alloc_now(u)))
        return min(job.act, max(0, self.budget - self.act)) if self.paged else job.act

    def _decode(self, job: Job, act: float, u: float) -> None:
        self.act -= int(act)
        self.prefilling -= 1
        g = (job.kv1 - job.kv0) / job.decode_s
        c = job.kv0 - g * u
        self.kv_a, self.kv_g, self.decoding = self.kv_a + c, self.kv_g + g, self.decoding + 1
        heapq.heappush(self.heap, (u + job.decode_s, next(self.seq), 1, job, c))

    def _end(self, job: Job, c: float, u: float) -> None:
        self.kv_a -= c
        self.kv_g -= (job.kv1 - job.kv0) / job.decode_s
        self.decoding -= 1
        if self.decoding == 0:
            self.kv_a = self.kv_g = 0.0  # no rounding left behind
        for k in range(job.first, job.first + job.n):
            self._emit(u, "request_end", f"r{k}")
        if self.leak and self.leak.shape == "per_request" and u >= self.leak.onset:
            self.leaked += self.leak.per_request_b * job.n

    # --- memory --------------------------------------------------------------------------------
    def _base(self, u: float) -> tuple[Phase, int]:
        """The phase, and allocated memory but for KV cache, activations and leaks."""
        pr, weights = self.proc, int(self.spec.weights * self.limit)
        if u < pr.load_end_u:
            return Phase.UNKNOWN, int(weights * (u - pr.start_u) / (pr.load_end_u - pr.start_u))
        base = weights + (self.pool if self.paged else 0)
        if u < pr.serve_u:
            return Phase.SETUP, base
        phase = Phase.PREFILL if self.prefilling else Phase.DECODE if self.decoding \
            else Phase.IDLE
        return phase, base + pr.warm(u)

    def _alloc_now(self, u: float) -> int:
        kv = 0 if self.paged else int(self.kv_a + self.kv_g * u)
        return self._base(u)[1] + int(self.leaked) + self.act + kv

    def _progress(self, u: float) -> float:
        f = self.spec.failure
        if f is None or f.cause != "fragmentation":
            return 0.0
        return min(1.0, max(0.0, (u - f.onset_s) / f.develop_s))

    def _largest(self, u: float, cached: int, split: int) -> int:
        piece = self.rng.uniform(*self.spec.piece) * (1.0 - self._progress(u)) ** 3
        return int((cached - split) * piece)

    def _split(self, u: float, cached: int) -> int:
        ratio = self.spec.split + (FRAG_SPLIT - self.spec.split) * self._progress(u)
        return int(ratio * cached)

    def _fits(self, u: float, need: int) -> bool:
        """A prefill's activations: in the largest free block, a new segment, or after the
        allocator frees its free segments and retries."""
        pr, alloc = self.proc, self._alloc_now(u)
        cached = max(0, pr.reserved - alloc)
        split = self._split(u, cached)
        if need <= self._largest(u, cached, split):
            return True
        if pr.reserved + need > self.top:
            pr.retries += 1
            pr.reserved = alloc + split
        if pr.reserved + need > self.top:
            return False
        pr.reserved += need
        return True

    def _accrue(self, u: float) -> None:
        lp = self.leak
        if lp is None or u < lp.onset:
            return
        if lp.shape == "growth" and lp.rate_b == 0.0:  # reach the limit over develop_s
            assert self.spec.failure is not None
            lp.rate_b = max(1.0, self.top - self.peak) / self.spec.failure.develop_s
        if lp.shape in ("sawtooth", "never_idle", "growth"):
            self.leaked = lp.rate_b * (u - lp.onset)
        elif lp.shape == "steps":
            while self.steps_seen < len(lp.steps_u) and lp.steps_u[self.steps_seen] <= u:
                self.leaked += lp.steps_b[self.steps_seen]
                self.steps_seen += 1
        elif lp.shape == "under_load" and self.traffic.rate(u) > lp.median:
            self.leaked += lp.on_b * self.spec.dt_s
        if not self.leak_history or u - self.leak_history[-1][0] >= self.history_s:
            self.leak_history.append((u, int(self.leaked)))

    # --- one sample ----------------------------------------------------------------------------
    def _step(self, u: float) -> None:
        if u < self.proc.start_u:
            return  # between a process's exit and its successor's start
        if self._reloading(u):
            return
        phase, base = self._base(u)
        self._accrue(u)
        kv = self.kv_a + self.kv_g * u
        noise = int(abs(self.rng.gauss(0.0, NOISE_RATIO)) * self.limit)
        alloc = base + int(self.leaked) + self.act + (0 if self.paged else int(kv)) + noise
        if alloc > self.top:
            self._oom(u, max(2 * MIB, alloc - self.prev_alloc), phase, self.prev_alloc)
            return
        pr, frag = self.proc, min(1.0, 2 * self._progress(u))  # fragmenting: reserved grows
        over = SLACK_BYTES + int(self.spec.cache_over * self.limit)
        pr.reserved = max(pr.reserved, min(self.top, alloc + over),
                          alloc + int((self.top - alloc) * frag))
        self.peak, self.prev_alloc = max(self.peak, alloc), alloc
        self._record(u, phase, alloc, self._kv_fields(u, kv, phase))

    def _reloading(self, u: float) -> bool:
        """A reload: stop admitting, drain, exit; a new process starts 45-75 s later."""
        if not self.draining and len(self.reloads_u) < len(self.spec.reloads_s):
            self.draining = u >= self.spec.reloads_s[len(self.reloads_u)]
        if not self.draining or self.prefilling + self.decoding:
            return False
        self.reloads_u.append(u)
        self.retries_before += self.proc.retries
        pid = self.proc.pid + self.rng.randint(5, 3000)
        self.proc, self.draining = self._new_proc(u + self.rng.uniform(45.0, 75.0), pid), False
        self.leaked = 0.0
        return True

    def _kv_fields(self, u: float, kv: float, phase: Phase
                   ) -> tuple[int | None, int | None, int | None, int | None]:
        """``kv_blocks_used``, ``kv_blocks_total``, ``kv_blocks_cached``, ``kv_tokens_used``."""
        if not self.paged:
            if not self.spec.kv_tokens or self.spec.engine != "per_request_kv" \
                    or phase is Phase.UNKNOWN:
                return None, None, None, None
            return None, None, None, max(0, int(kv)) // KV_TOKEN_BYTES
        if phase in (Phase.UNKNOWN, Phase.SETUP):
            return (0, self.blocks, 0, None) if phase is Phase.SETUP else (None,) * 4
        used = int(kv) // BLOCK_BYTES
        if used >= self.blocks:  # the pool is full: requests are preempted from now on
            if self.stop_u is None:
                require(self.spec.failure is not None, f"{self.spec.name}: the pool filled")
                self.fill_u, self.stop_u = u, u + self.rng.uniform(300.0, 600.0)
            used = self.blocks - self.rng.randint(0, 8)
        share = 0.12 + 0.08 * math.sin(u / 5000.0)
        return used, self.blocks, min(self.blocks - used, int(share * self.blocks)), None

    def _recording(self, u: float) -> bool:
        i = bisect_right(self.gap_starts, u) - 1
        return i < 0 or u >= self.gap_ends[i]

    def _record(self, u: float, phase: Phase, alloc: int,
                kv: tuple[int | None, int | None, int | None, int | None],
                ooms: int = 0) -> None:
        if not self._recording(u) and not ooms:
            return
        pr = self.proc
        cached = max(0, pr.reserved - alloc)
        split = self._split(u, cached)
        largest = None
        if u >= self.next_snap or ooms:
            self.next_snap, largest = u + SNAPSHOT_EVERY_S, self._largest(u, cached, split)
        self.samples.append(Sample(
            START_S + u, 0, phase, "sim", pr.pid, alloc, pr.reserved, alloc, split, alloc,
            largest, pr.retries, pr.ooms, pr.reserved + CONTEXT_BYTES, self.limit, *kv))

    def _emit(self, u: float, name: str, rid: str | None = None,
              data: dict[str, object] | None = None, phase: Phase | None = None) -> None:
        if self._recording(u) or name == "oom":
            self.events.append(Event(START_S + u, name, 0, self.proc.pid, phase, rid, data))

    def _oom(self, u: float, need: int, phase: Phase, alloc: int) -> None:
        """The allocation of ``need`` bytes failed: an OOM sample, event and post-mortem."""
        require(self.spec.failure is not None, f"{self.spec.name}: an OOM in a spec without one")
        pr, alloc = self.proc, min(alloc, self.top)
        pr.ooms, self.oom_u = pr.ooms + 1, u
        self._record(u, phase, alloc, self._kv_fields(u, self.kv_a + self.kv_g * u, phase), 1)
        last = self.samples[-1]
        free = self.limit - pr.reserved - CONTEXT_BYTES
        message = (f"CUDA out of memory. Tried to allocate {need / GIB:.2f} GiB. GPU 0 has a "
                   f"total capacity of {self.limit / GIB:.2f} GiB of which {free / GIB:.2f} GiB "
                   f"is free. Of the allocated memory {alloc / GIB:.2f} GiB is allocated by "
                   f"PyTorch, and {(pr.reserved - alloc) / GIB:.2f} GiB is reserved by PyTorch "
                   "but unallocated.")
        self._emit(u, "oom", data={"message": message, "failed_alloc_bytes": need}, phase=phase)
        cached = max(1, pr.reserved - alloc)
        largest = last.largest_free_block_bytes or 0
        self.postmortems.append(PostMortem(
            START_S + u, 0, pr.pid, phase, need, free, self.limit, alloc, pr.reserved, largest,
            max(0.0, 1 - min(largest, cached) / cached), message=message))
