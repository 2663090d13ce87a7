"""The causes of issue 20 (load, KV exhaustion, fragmentation without a snapshot) from what a
recording holds, offline as ``vramscope analyze`` names them: the ``oom`` event's failed size,
the requests in flight over time, the KV pool's readings and refusals."""

import pytest
from vramscope.agent.alerts.offline import analyze_records
from vramscope.agent.analysis.diagnosis import CAUSES, REMEDIES, diagnose, floor_rise
from vramscope.agent.records import Event, Phase, Sample

G = 2**30
LIMIT = 80 * G
WEIGHTS = 24 * G
PER_REQUEST = G // 2


def ramp(load_at, floor_at=lambda t: 0, seconds=400):
    """Never idle, one decode sample a second: weights + a floor + 0.5 GiB per request in
    flight; the requests in flight at ``t`` are ``load_at(t)`` (one start or end event per
    change). Then an OOM event in decode asking for 1 GiB."""
    samples, events, running = [], [], []
    for t in range(seconds):
        n = load_at(t)
        while len(running) < n:
            running.append(f"r{t}-{len(running)}")
            events.append(Event(float(t), "request_start", 0, request_id=running[-1]))
        while len(running) > n:
            events.append(Event(float(t), "request_end", 0, request_id=running.pop(0)))
        allocated = WEIGHTS + floor_at(t) + n * PER_REQUEST
        samples.append(Sample(float(t), 0, Phase.DECODE, "t", allocated_bytes=allocated,
                              reserved_bytes=min(LIMIT, allocated + G // 4),
                              device_total_bytes=LIMIT))
    events.append(Event(float(seconds - 1), "oom", 0, phase=Phase.DECODE,
                        data={"message": "CUDA out of memory", "failed_alloc_bytes": G}))
    return samples, events


def cause(samples, events):
    return analyze_records(samples, events)["devices"]["0"]["oom"]["cause"]


def wobbling_ramp(t):
    """8 requests rising to 110 over 400 s, +-2 around the ramp (requests start and end)."""
    return 8 + t // 4 + (2 if t % 3 == 0 else -2 if t % 3 == 1 else 0)


def test_a_load_ramp_with_a_flat_floor_is_load_not_growth():
    # 8 -> 110 requests in flight at 0.5 GiB each: allocated rose 51 GiB, all of it work.
    # The floor without the work stayed at the weights: "load" (it was "growth")
    samples, events = ramp(wobbling_ramp)
    assert cause(samples, events) == "load"


def test_a_tenth_of_the_limit_failing_under_the_ramp_is_a_prefill_spike():
    # the same ramp, but the failed allocation is 9 GiB (11 % of the limit): one long prompt
    samples, events = ramp(wobbling_ramp)
    events[-1] = events[-1]._replace(data={"message": "CUDA out of memory",
                                           "failed_alloc_bytes": 9 * G})
    assert cause(samples, events) == "prefill_spike"


def test_a_rising_floor_under_the_same_ramp_is_growth():
    # the same ramp with the floor rising 4 GiB per 100 s (16 GiB, 20 % of the limit): growth
    samples, events = ramp(wobbling_ramp, floor_at=lambda t: t * 4 * G // 100)
    assert cause(samples, events) == "growth"


def test_the_load_aware_floor_takes_the_work_out():
    samples, events = ramp(wobbling_ramp, floor_at=lambda t: t * 4 * G // 100)
    loads = [wobbling_ramp(int(s.ts_s)) for s in samples]
    # by quarters, the allocated memory rose 49.5 GiB (load and floor together); fitted on the
    # requests in flight and time, the floor rose its 4 GiB per 100 s over 399 s
    assert floor_rise(samples) == 49.5 * G
    assert floor_rise(samples, loads) == pytest.approx(399 * 4 * G / 100, rel=1e-6)
    flat = ramp(wobbling_ramp)[0]
    assert abs(floor_rise(flat, loads)) < 1e-3 * G


def test_idle_samples_early_and_late_are_the_floor():
    # idle every tenth second at 24 GiB throughout; busy samples climb with the load
    samples = [Sample(float(t), 0, Phase.IDLE if t % 10 == 0 else Phase.DECODE,
                      allocated_bytes=WEIGHTS + (0 if t % 10 == 0 else t * G // 10))
               for t in range(200)]
    assert floor_rise(samples) == 0.0


def kv_recording(refusal=False, used_at_oom=1000):
    samples = [Sample(float(t), 0, Phase.DECODE, "t", allocated_bytes=60 * G,
                      reserved_bytes=62 * G, device_total_bytes=LIMIT,
                      kv_blocks_used=min(used_at_oom, 700 + 5 * t), kv_blocks_total=1000)
               for t in range(61)]
    events = [Event(60.0, "oom", 0, phase=Phase.DECODE,
                    data={"message": "out of blocks", "failed_alloc_bytes": 64 * 2**20})]
    if refusal:
        events.insert(0, Event(40.0, "kv_alloc_failed", 0, request_id="r9",
                               data={"reason": "not enough free blocks"}))
    return samples, events


def test_a_full_kv_pool_at_the_oom_is_kv_exhaustion():
    # 1000 of 1000 blocks used at the OOM, 18 GiB free under the limit (no fragmentation
    # sign): the pool ran out (it was "unknown")
    assert cause(*kv_recording()) == "kv_exhaustion"


def test_a_kv_refusal_before_the_oom_is_kv_exhaustion():
    # the pool at 95 % (not full) but it refused a request 20 s before the OOM
    assert cause(*kv_recording(refusal=True, used_at_oom=950)) == "kv_exhaustion"
    assert cause(*kv_recording(used_at_oom=950)) == "unknown"


def frag_recording(retries):
    """Allocated 48 GiB, reserved 76 GiB of 80, no allocator snapshot; the retry counter
    at ``retries`` over the samples; a 20 GiB prefill fails with 32 GiB free (1.6x)."""
    samples = [Sample(float(t), 0, Phase.DECODE, "t", allocated_bytes=48 * G,
                      reserved_bytes=76 * G, device_total_bytes=LIMIT,
                      num_alloc_retries=retries(t)) for t in range(120)]
    events = [Event(119.0, "oom", 0, phase=Phase.PREFILL,
                    data={"message": "CUDA out of memory", "failed_alloc_bytes": 20 * G})]
    return samples, events


def test_retries_and_free_memory_without_a_snapshot_is_fragmentation():
    # enough free memory for the request, the allocator retrying before it gave up: no block
    # fitted (it was "prefill_spike": the request is 25 % of the limit)
    assert cause(*frag_recording(lambda t: t // 30)) == "fragmentation"
    # no retries: nothing says the cache was in pieces
    assert cause(*frag_recording(lambda t: 0)) == "prefill_spike"


def test_the_new_causes_are_public_with_remedies():
    assert CAUSES[-2:] == ("load", "kv_exhaustion")
    assert set(REMEDIES) == set(CAUSES)
    assert any("max_num_seqs" in r for r in REMEDIES["load"])
    assert any("blocks" in r for r in REMEDIES["kv_exhaustion"])


def test_load_needs_the_in_flight_history():
    # the same OOM without request events: no load to speak of, the non-prefill allocated
    # rose (growth), as before
    samples, _ = ramp(wobbling_ramp)
    oom = [Event(399.0, "oom", 0, phase=Phase.DECODE,
                 data={"message": "CUDA out of memory", "failed_alloc_bytes": G})]
    assert cause(samples, oom) == "growth"
    assert diagnose(None, samples, ts_s=399.0, requests_in_flight=110)[0] == "growth"
