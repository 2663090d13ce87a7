"""A simulated LLM inference server whose memory behaviour emerges from its workload.

One ``SimServer`` is one server process on one simulated GPU; every ``step()`` is one scheduler
tick of ``tick_s`` simulated seconds of continuous batching: arrivals, admission (with a paged
pool, only while it can hold the prompt), prefill, ``decode_steps_per_tick`` decode steps, and
finished requests freeing their KV, all allocated through the caching-allocator model. The
designs, the OOM and restart after ``restart_s``, and the records it makes: docs/demo.md.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vramscope.agent.records import Event, Phase, PostMortem, Sample
from vramscope.agent.sim.caching_allocator import CachingAllocatorModel, SimulatedOOM
from vramscope.agent.sim.model import SimModel
from vramscope.agent.sim.workload import Request, WorkloadSpec, requests

if TYPE_CHECKING:
    from vramscope.hooks.kvpool import KVBlockPool
    from vramscope.hooks.sink import Record, RecordSink

MiB = 1 << 20
GiB = 1 << 30
SCENARIOS = ("healthy", "leak", "fragmentation", "pool")


@dataclass(frozen=True)
class ServerSpec:
    scenario: str = "healthy"
    device: int = 0
    pid: int | None = None
    model: SimModel = field(default_factory=SimModel)
    device_total_bytes: int = 23034 * MiB  # a 24 GB card (L4 class) as NVML reports it
    context_bytes: int = 420 * MiB  # CUDA context and libraries: on the device, not in torch
    kv_pool_bytes: int = 4 * GiB  # the paged pool's preallocated size
    block_size: int = 16
    max_batch: int = 32
    max_prefill_tokens: int = 8192  # per tick, whole prompts (at least one)
    prefill_chunk_tokens: int | None = None  # chunked prefill: at most this per tick
    kv_growth_tokens: int = 256  # per-request buffers grow by this many tokens
    leak_bytes_per_request: int = 0
    tick_s: float = 0.5
    decode_steps_per_tick: int = 12
    prefill_tokens_per_s: float = 12000.0  # how long prefill takes, for the phase of a sample
    sample_interval_s: float = 2.0
    snapshot_every: int = 15
    restart_s: float = 60.0
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {self.scenario!r}; known: {', '.join(SCENARIOS)}")

    @property
    def paged(self) -> bool:
        return self.scenario != "fragmentation"

    @property
    def limit_bytes(self) -> int:
        return self.device_total_bytes - self.context_bytes


@dataclass
class _Running:
    req: Request
    prefilled: int = 0
    generated: int = 0
    kv_handle: int | None = None  # per-request buffer (fragmentation design)
    in_pool: bool = False  # holds blocks in the paged pool
    kv_capacity_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.prefilled + self.generated


class SimServer:
    """One simulated server. ``step()`` advances one tick; records go to ``sink.put``."""

    def __init__(self, spec: ServerSpec, sink: RecordSink | None, start_ts_s: float,
                 arrivals: Iterator[Request] | None = None) -> None:
        self.spec = spec
        self.sink = sink
        self.now_s = start_ts_s
        self.alloc = CachingAllocatorModel(spec.limit_bytes, device=spec.device)
        self._rng = random.Random(spec.seed)
        self._arrivals = (arrivals if arrivals is not None
                          else requests(spec.workload, id_prefix=f"{spec.scenario}-"))
        self._next: Request | None = next(self._arrivals, None)
        self._t0_s = start_ts_s
        self.waiting: deque[Request] = deque()
        self.running: list[_Running] = []
        self._temporaries: list[int] = []
        self._leaked: list[int] = []
        self._down_until_s = 0.0
        self._next_sample_s = start_ts_s
        self._samples_taken = 0
        self._history: deque[Sample] = deque(maxlen=1800)
        self._sampled_this_tick = False
        self._activity = Phase.IDLE
        self.counts = {"served": 0, "aborted": 0, "preempted": 0, "ooms": 0}
        self.pool = self._make_pool() if spec.paged else None
        self._load_weights()

    # --- startup ---------------------------------------------------------------------------
    def _make_pool(self) -> KVBlockPool:
        from vramscope.hooks.kvpool import KVBlockPool

        m = self.spec.model
        return KVBlockPool(num_layers=m.num_layers, num_kv_heads=m.num_kv_heads,
                           head_dim=m.head_dim, dtype=m.dtype, block_size=self.spec.block_size,
                           budget_bytes=self.spec.kv_pool_bytes, buffer=False,
                           prefix_caching=False)

    def _load_weights(self) -> None:
        for size in self.spec.model.weight_tensors():
            self.alloc.malloc(size)
        if self.pool is not None:  # the pool's one preallocated tensor
            self.alloc.malloc(self.pool.size_bytes)

    # --- the tick --------------------------------------------------------------------------
    def step(self) -> None:
        self._sampled_this_tick = False
        self._activity = Phase.IDLE
        self._take_arrivals()
        if self.now_s < self._down_until_s:  # restarting: connections are refused
            self.counts["aborted"] += len(self.waiting)
            self.waiting.clear()
        else:
            try:
                self._admit()
                self._prefill()
                self._decode()
            except SimulatedOOM as exc:
                self._on_oom(exc)
        if not self._sampled_this_tick:
            self._maybe_sample(Phase.DECODE if self.running else Phase.IDLE)
        self.now_s += self.spec.tick_s

    def run_until(self, ts_s: float) -> None:
        while self.now_s < ts_s:
            self.step()

    def _take_arrivals(self) -> None:
        while self._next is not None and self._t0_s + self._next.arrival_s <= self.now_s:
            self.waiting.append(self._next)
            self._next = next(self._arrivals, None)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.spec.max_batch:
            req = self.waiting[0]
            if self.pool is not None and not self.pool.can_allocate(req.prompt_tokens + 1):
                return  # the paged scheduler waits for blocks instead of failing
            self.waiting.popleft()
            r = _Running(req)
            self.running.append(r)
            self._event("request_start", req.request_id)
            if self.pool is not None:  # blocks for the whole prompt, reserved at admission
                self._grow_kv(r, req.prompt_tokens)

    # --- prefill -----------------------------------------------------------------------------
    def _prefill(self) -> None:
        chunks = self._prefill_plan()
        if not chunks:
            return
        self._activity = Phase.PREFILL
        for r, n in chunks:
            self._grow_kv(r, r.prefilled + n)
            r.prefilled += n
        tokens = sum(n for _, n in chunks)
        self._alloc_temporaries(self.spec.model.prefill_temporaries(tokens, len(chunks)))
        busy = min(1.0, tokens / self.spec.prefill_tokens_per_s / self.spec.tick_s)
        if self._rng.random() < busy:  # the sampler caught the server inside the prefill
            self._maybe_sample(Phase.PREFILL)
        self._free_temporaries()

    def _prefill_plan(self) -> list[tuple[_Running, int]]:
        chunk = self.spec.prefill_chunk_tokens
        budget = chunk or self.spec.max_prefill_tokens
        plan: list[tuple[_Running, int]] = []
        for r in self.running:
            left = r.req.prompt_tokens - r.prefilled
            if left <= 0:
                continue
            n = min(left, budget) if chunk else left
            if n > budget and plan:
                break
            plan.append((r, n))
            budget -= n
            if budget <= 0:
                break
        return plan

    # --- decode ------------------------------------------------------------------------------
    def _decode(self) -> None:
        batch = [r for r in self.running if r.prefilled >= r.req.prompt_tokens]
        if not batch:
            return
        self._activity = Phase.DECODE
        self._alloc_temporaries(self.spec.model.decode_temporaries(len(batch)))
        self._free_temporaries()
        for r in batch:
            n = min(self.spec.decode_steps_per_tick, r.req.output_tokens - r.generated)
            if not self._grow_kv(r, r.tokens + n):
                continue
            r.generated += n
            if r.generated >= r.req.output_tokens:
                self._finish(r)

    def _finish(self, r: _Running) -> None:
        self.running.remove(r)
        self._release_kv(r)
        if self.spec.leak_bytes_per_request:  # the bug: a per-request tensor kept in a list
            self._leaked.append(self.alloc.malloc(self.spec.leak_bytes_per_request))
        self.counts["served"] += 1
        self._event("request_end", r.req.request_id)

    # --- KV: paged pool or per-request buffers -----------------------------------------------
    def _grow_kv(self, r: _Running, tokens: int) -> bool:
        """Make room for ``tokens`` KV tokens; False when the pool preempted the request."""
        if self.pool is not None:
            return self._grow_paged(r, tokens)
        if tokens > r.kv_capacity_tokens:
            step = self.spec.kv_growth_tokens
            capacity = -(-tokens // step) * step
            new = self.alloc.malloc(capacity * self.spec.model.kv_bytes_per_token)
            if r.kv_handle is not None:  # copy, then free the old buffer (torch.cat does this)
                self.alloc.free(r.kv_handle)
            r.kv_handle, r.kv_capacity_tokens = new, capacity
        return True

    def _grow_paged(self, r: _Running, tokens: int) -> bool:
        from vramscope.hooks.kvpool import KVPoolError

        rid = r.req.request_id
        pool = self.pool
        assert pool is not None  # a paged server
        try:
            if not r.in_pool:
                pool.allocate(rid, tokens)
                r.in_pool = True
            elif tokens > pool.num_tokens(rid):
                pool.extend(rid, tokens - pool.num_tokens(rid))
            return True
        except KVPoolError:  # out of blocks: preempt (recompute later), as vLLM does
            self._preempt(r)
            return False

    def _preempt(self, r: _Running) -> None:
        self.running.remove(r)
        self._release_kv(r)
        self.waiting.appendleft(r.req)
        self.counts["preempted"] += 1

    def _release_kv(self, r: _Running) -> None:
        if self.pool is not None:
            if r.in_pool:
                self.pool.free(r.req.request_id)
                r.in_pool = False
        elif r.kv_handle is not None:
            self.alloc.free(r.kv_handle)
            r.kv_handle = None

    def _alloc_temporaries(self, sizes: list[int]) -> None:
        for size in sizes:  # one by one: after an OOM, the ones that were made get freed
            self._temporaries.append(self.alloc.malloc(size))

    def _free_temporaries(self) -> None:
        for handle in self._temporaries:
            self.alloc.free(handle)
        self._temporaries = []

    # --- OOM: post-mortem, abort, empty the cache, pause ----------------------------------
    def _on_oom(self, exc: SimulatedOOM) -> None:
        from vramscope.hooks.oom import build_postmortem

        self.counts["ooms"] += 1
        phase = self._activity
        pm = build_postmortem(
            self.alloc.snapshot(), ts_s=self.now_s, device=self.spec.device, pid=self.spec.pid,
            phase=phase, failed_alloc_bytes=exc.size_bytes,
            driver_free_bytes=self.spec.limit_bytes - self.alloc.reserved_bytes,
            device_total_bytes=self.spec.limit_bytes, allocated_bytes=self.alloc.allocated_bytes,
            reserved_bytes=self.alloc.reserved_bytes,
            requests_in_flight=[r.req.request_id for r in self.running])
        self._maybe_sample(phase, force=True)
        self._put(pm._replace(message=str(exc), cause=_diagnose(pm, self._history)))
        self._event("oom", None, {"message": str(exc), "failed_alloc_bytes": exc.size_bytes})
        self._abort_all()

    def _abort_all(self) -> None:
        """The process dies with the OOM; its supervisor restarts it after ``restart_s``."""
        self._temporaries = []
        for r in self.running:
            self.counts["aborted"] += 1
            self._event("request_end", r.req.request_id, {"aborted": True})
        self.running = []
        self.counts["aborted"] += len(self.waiting)  # their clients got errors too
        self.waiting.clear()
        self._restart()
        self._down_until_s = self.now_s + self.spec.restart_s

    def _restart(self) -> None:
        """A new process: a fresh allocator (counters from zero), weights, pool; no leak."""
        self.alloc = CachingAllocatorModel(self.spec.limit_bytes, device=self.spec.device)
        self.pool = self._make_pool() if self.spec.paged else None
        self._leaked = []
        self._load_weights()

    # --- records ---------------------------------------------------------------------------
    def _put(self, record: Record) -> None:
        if self.sink is None:
            raise RuntimeError("SimServer.sink is not set: pass one, or set it before running")
        self.sink.put(record)

    def _event(self, name: str, request_id: str | None,
               data: dict[str, Any] | None = None) -> None:
        phase = Phase.DECODE if self.running else Phase.IDLE
        self._put(Event(self.now_s, name, self.spec.device, self.spec.pid, phase, request_id,
                        data))

    def _maybe_sample(self, phase: Phase, force: bool = False) -> None:
        if self.now_s < self._next_sample_s and not force:
            return
        self._sampled_this_tick = True
        self._next_sample_s = self.now_s + self.spec.sample_interval_s
        self._samples_taken += 1
        records = self.read(phase)
        for record in records:
            self._put(record)
        self._history.append(records[0])  # torch samples, for the post-mortem's diagnosis

    def read(self, phase: Phase) -> list[Sample]:
        """The torch, kv and nvml samples of this instant."""
        a, spec, ts = self.alloc, self.spec, self.now_s
        # the figure hooks.snapshot.summarize(a.snapshot()) gives, without building the dicts
        largest = (a.largest_free_block_bytes if self._samples_taken % spec.snapshot_every == 1
                   else None)
        out = [Sample(ts, spec.device, phase, "torch", spec.pid, a.allocated_bytes,
                      a.reserved_bytes, a.allocated_bytes, a.inactive_split_bytes,
                      a.requested_bytes, largest, a.num_alloc_retries, a.num_ooms,
                      device_total_bytes=spec.device_total_bytes),
               Sample(ts, spec.device, phase, "nvml", None,
                      device_used_bytes=a.reserved_bytes + spec.context_bytes,
                      device_total_bytes=spec.device_total_bytes)]
        if self.pool is not None:
            s = self.pool.stats()
            out.append(Sample(ts, spec.device, phase, "kv", spec.pid, kv_blocks_used=s.blocks_used,
                              kv_blocks_total=s.blocks_total, kv_blocks_cached=s.blocks_cached,
                              kv_tokens_used=s.tokens_used))
        else:  # per-request buffers: the tokens they hold (no blocks, no pool)
            out.append(Sample(ts, spec.device, phase, "kv", spec.pid,
                              kv_tokens_used=sum(r.tokens for r in self.running)))
        return out


def _diagnose(pm: PostMortem, samples: Iterable[Sample]) -> str | None:
    from vramscope.agent.analysis.diagnosis import diagnose

    return diagnose(pm, list(samples))[0]
