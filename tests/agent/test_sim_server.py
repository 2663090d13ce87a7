"""The simulated inference server: scripted requests with exact memory, and the scenarios."""

from __future__ import annotations

from vramscope.agent.records import Phase
from vramscope.agent.sim.model import SimModel
from vramscope.agent.sim.scenarios import scenario_spec
from vramscope.agent.sim.server import GiB, ServerSpec, SimServer
from vramscope.agent.sim.workload import Request
from vramscope.hooks.sink import ListSink
from vramscope.hooks.snapshot import summarize

T0 = 1_700_000_000.0
WEIGHTS = 16_060_522_496  # Llama-3-8B shape, bf16 (2 x 8,030,261,248)
KIB = 1024


def scripted(spec: ServerSpec, reqs: list[Request]) -> tuple[SimServer, ListSink]:
    sink = ListSink()
    return SimServer(spec, sink, T0, arrivals=iter(reqs)), sink


def test_model_shape_sizes():
    m = SimModel()
    assert m.weights_bytes == WEIGHTS
    assert m.kv_bytes_per_token == 128 * KIB


def test_startup_allocates_weights_and_the_pool():
    server, _ = scripted(ServerSpec("healthy"), [])
    assert server.alloc.allocated_bytes == WEIGHTS + 4 * GiB
    assert server.pool.num_blocks == 2048  # 4 GiB / (16 tokens x 128 KiB)


def test_one_request_through_prefill_and_decode():
    spec = ServerSpec("healthy", sample_interval_s=0.5)
    server, sink = scripted(spec, [Request("r1", 0.0, prompt_tokens=100, output_tokens=24)])
    base = server.alloc.allocated_bytes
    server.step()  # admit, 7 blocks for the prompt, prefill, 12 decode tokens (still 7 blocks)
    assert [r.tokens for r in server.running] == [112]
    assert server.pool.stats().blocks_used == 7
    assert server.alloc.allocated_bytes == base  # temporaries came and went
    server.step()  # 12 more tokens: done, blocks back
    assert server.running == [] and server.counts["served"] == 1
    assert server.pool.stats().blocks_used == 0
    events = [(e.name, e.request_id, e.ts_s - T0) for e in sink.events()]
    assert events == [("request_start", "r1", 0.0), ("request_end", "r1", 0.5)]
    server.step()
    phases = [s.phase for s in sink.samples() if s.source == "torch"]
    assert phases[-1] is Phase.IDLE
    assert {s.source for s in sink.samples()} == {"torch", "kv", "nvml"}


def test_leak_keeps_512_kib_per_finished_request():
    spec = ServerSpec("leak", leak_bytes_per_request=512 * KIB)
    reqs = [Request(f"r{i}", i * 0.5, 50, 10) for i in range(10)]
    server, _ = scripted(spec, reqs)
    base = server.alloc.allocated_bytes
    server.run_until(T0 + 20)
    assert server.counts["served"] == 10
    assert server.alloc.allocated_bytes - base == 10 * 512 * KIB


def test_fragmentation_design_grows_per_request_buffers():
    spec = ServerSpec("fragmentation")
    server, _ = scripted(spec, [Request("r1", 0.0, prompt_tokens=300, output_tokens=300)])
    base = server.alloc.allocated_bytes
    server.step()  # 312 tokens: a 512-token buffer (256-token steps)
    assert server.alloc.allocated_bytes - base == 512 * 128 * KIB
    server.run_until(T0 + 10)  # 20 ticks: 300 + 240 tokens -> a 768-token buffer
    assert [r.tokens for r in server.running] == [540]
    assert server.alloc.allocated_bytes - base == 768 * 128 * KIB
    assert server.alloc.largest_free_block_bytes >= 64 * 1024 * KIB  # the old buffer, cached


def test_snapshot_is_readable_by_the_hooks_fragmentation_functions():
    server = SimServer(scenario_spec("fragmentation"), ListSink(), T0)
    server.run_until(T0 + 600)
    a = server.alloc
    frag = summarize(a.snapshot(), device=server.spec.device)
    assert (frag.reserved_bytes, frag.allocated_bytes, frag.requested_bytes) == (
        a.reserved_bytes, a.allocated_bytes, a.requested_bytes)
    assert frag.largest_free_block_bytes == a.largest_free_block_bytes
    assert frag.free_inactive_bytes == a.reserved_bytes - a.allocated_bytes
    assert frag.segments == a.num_segments


def run_scenario(name: str, minutes: float) -> tuple[SimServer, ListSink]:
    sink = ListSink()
    server = SimServer(scenario_spec(name), sink, T0)
    server.run_until(T0 + minutes * 60)
    return server, sink


def test_fragmentation_scenario_ooms_with_enough_free_memory_in_total():
    server, sink = run_scenario("fragmentation", 25)
    pms = sink.postmortems()
    assert server.counts["ooms"] == len(pms) >= 1
    pm = pms[0]
    assert pm.cause == "fragmentation"
    assert pm.largest_free_block_bytes < pm.failed_alloc_bytes
    assert pm.reserved_bytes - pm.allocated_bytes > 2 * pm.failed_alloc_bytes
    assert [e.name for e in sink.events() if e.name == "oom"] == ["oom"] * len(pms)
    at_oom = [s for s in sink.samples() if s.source == "torch" and s.ts_s == pm.ts_s]
    assert at_oom[-1].num_ooms == 1 and at_oom[-1].num_alloc_retries >= 1
    # the restarted process starts from zero
    after = [s for s in sink.samples() if s.source == "torch" and s.ts_s > pm.ts_s]
    assert after[0].num_ooms == 0 and after[0].allocated_bytes == WEIGHTS


def test_the_same_traffic_on_the_paged_pool_never_ooms():
    frag, _ = run_scenario("fragmentation", 25)
    pool, sink = run_scenario("pool", 25)
    assert pool.counts["ooms"] == 0 and sink.postmortems() == []
    assert pool.counts["served"] > frag.counts["served"]


def test_healthy_and_leak_differ_only_by_the_leak():
    healthy, hs = run_scenario("healthy", 20)
    leak, ls = run_scenario("leak", 20)
    assert healthy.counts == leak.counts  # same traffic, same scheduling
    floor = leak.alloc.allocated_bytes - healthy.alloc.allocated_bytes
    assert floor == leak.counts["served"] * 512 * KIB
    phases = {s.phase for s in hs.samples() if s.source == "kv"}
    assert {Phase.PREFILL, Phase.DECODE} <= phases
