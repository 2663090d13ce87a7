"""Offline analyze names an OOM's cause from the recording's own events when no post-mortem
was kept: the ``oom`` event's failed size and phase, the requests in flight, the latest
snapshot's largest free block (as the live post-mortem would)."""

from vramscope.agent.alerts.offline import analyze_records
from vramscope.agent.records import Event, Phase, Sample

G, M = 2**30, 2**20


def recording(failed, phase, in_flight, largest_free, allocated=40 * G, reserved=60 * G):
    samples = [Sample(float(t), 0, Phase.DECODE, "torch", allocated_bytes=allocated,
                      reserved_bytes=reserved, device_total_bytes=80 * G) for t in range(60)]
    samples.append(Sample(50.5, 0, Phase.DECODE, "torch_snapshot",
                          largest_free_block_bytes=largest_free))
    events = [Event(1.0 + i, "request_start", 0, request_id=f"r{i}") for i in range(in_flight)]
    events.append(Event(60.0, "oom", 0, phase=phase,
                        data={"message": "CUDA out of memory", "failed_alloc_bytes": failed}))
    return samples, events


def cause(*args, **kw):
    samples, events = recording(*args, **kw)
    return analyze_records(samples, events)["devices"]["0"]["oom"]["cause"]


def test_free_enough_but_no_block_large_enough_is_fragmentation():
    # 20 GiB cached free and 20 GiB still reservable, the largest free block 100 MiB, 1 GiB
    # asked: it was "unknown" offline (no failed size, no snapshot in the last sample)
    assert cause(G, Phase.DECODE, 3, 100 * M) == "fragmentation"


def test_a_full_device_with_several_requests_in_flight_is_a_batch():
    # 79.5 GiB reserved of 80, all but 0.2 GiB allocated: full; 3 requests in flight
    assert cause(G, Phase.DECODE, 3, 10 * G, allocated=int(79.3 * G),
                 reserved=int(79.5 * G)) == "batch"
    # the same with one request, failing in prefill: a prefill spike
    assert cause(G, Phase.PREFILL, 1, 10 * G, allocated=int(79.3 * G),
                 reserved=int(79.5 * G)) == "prefill_spike"
