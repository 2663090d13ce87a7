"""The data recorded on the H200 (tests/data/gpu_*): valid trace v1 with what each run shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vramscope.agent.records import Phase, PostMortem
from vramscope.agent.trace import read_trace

DATA = Path(__file__).resolve().parents[1] / "data"
MiB = 2**20
H200_TOTAL_BYTES = 150_109_880_320


def torch_samples(trace):
    return [s for s in trace.samples if s.source == "torch"]


@pytest.mark.parametrize("name", ["healthy", "leak", "oom"])
def test_traces_are_strict_v1_with_both_phases_and_all_sources(name):
    trace = read_trace(str(DATA / f"gpu_{name}.jsonl"))  # strict: any bad line raises
    assert {s.source for s in trace.samples} == {"torch", "nvml", "torch_snapshot"}
    assert {Phase.PREFILL, Phase.DECODE, Phase.IDLE} <= {s.phase for s in torch_samples(trace)}
    starts = [e.request_id for e in trace.events if e.name == "request_start"]
    ends = [e.request_id for e in trace.events if e.name == "request_end"]
    assert starts == ends and len(starts) >= 5
    assert (DATA / f"gpu_{name}.jsonl").stat().st_size < 3_000_000


def idle_floor(trace):
    idle = [s.allocated_bytes for s in torch_samples(trace) if s.phase is Phase.IDLE]
    return idle[0], idle[-1]


def test_healthy_floor_is_flat_and_leak_floor_grows_64_mib_per_request():
    first, last = idle_floor(read_trace(str(DATA / "gpu_healthy.jsonl")))
    assert abs(last - first) < MiB
    leak = read_trace(str(DATA / "gpu_leak.jsonl"))
    first, last = idle_floor(leak)
    requests = sum(e.name == "request_end" for e in leak.events)
    assert last - first == pytest.approx((requests - 1) * 64 * MiB, abs=2 * MiB)


def test_oom_trace_has_the_event_the_counter_and_the_limit():
    trace = read_trace(str(DATA / "gpu_oom.jsonl"))
    [oom] = [e for e in trace.events if e.name == "oom"]
    assert oom.phase is Phase.PREFILL and oom.data["failed_alloc_bytes"] > 0
    samples = torch_samples(trace)
    assert {s.device_total_bytes for s in samples} == {samples[0].device_total_bytes}
    assert samples[0].device_total_bytes < H200_TOTAL_BYTES  # set_per_process_memory_fraction
    after = [s.num_ooms for s in samples if s.ts_s > oom.ts_s]
    assert after and set(after) == {1}


def test_recorded_postmortem_names_size_hole_and_holders_with_frames():
    pm = PostMortem.from_json(json.loads((DATA / "gpu_postmortem.json").read_text()))
    assert pm.failed_alloc_bytes == 1_453_326_336 and pm.phase is Phase.PREFILL
    assert 0 < pm.largest_free_block_bytes < pm.failed_alloc_bytes  # no hole big enough
    assert pm.requests_in_flight and pm.requests_in_flight[0].startswith("generate-")
    assert "modeling_llama.py" in pm.top_holders[0].frames[0]  # history on: real stacks
    assert pm.allocated_bytes <= pm.reserved_bytes <= pm.device_total_bytes
