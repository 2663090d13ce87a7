"""Request traces: reproducible from a seed, bursty, lengths within the context."""

from __future__ import annotations

import pytest
from vramscope.agent.sim.workload import WorkloadSpec, requests, take_until


def test_same_seed_same_trace_other_seed_other_trace():
    a = take_until(requests(WorkloadSpec(seed=7)), 600)
    b = take_until(requests(WorkloadSpec(seed=7)), 600)
    c = take_until(requests(WorkloadSpec(seed=8)), 600)
    assert a == b and a != c
    assert [r.request_id for r in a[:3]] == ["r1", "r2", "r3"]


def test_rate_lengths_and_bursts_over_a_simulated_day():
    spec = WorkloadSpec(rate_per_s=1.0, burst_rate_per_s=10.0, mean_calm_s=100.0,
                        mean_burst_s=10.0, max_context_tokens=4096, seed=3)
    trace = take_until(requests(spec), 86_400)
    # mean rate (100 x 1 + 10 x 10) / 110 = 1.82 /s
    assert 1.6 < len(trace) / 86_400 < 2.0
    assert all(r.prompt_tokens + r.output_tokens <= 4096 for r in trace)
    assert all(r.prompt_tokens >= 8 and r.output_tokens >= 1 for r in trace)
    per_10s = [0] * 8640
    for r in trace:
        per_10s[int(r.arrival_s // 10)] += 1
    assert max(per_10s) >= 60  # bursts: 6x the calm rate somewhere


def test_bad_spec_is_refused():
    with pytest.raises(ValueError, match="rate_per_s: 0"):
        WorkloadSpec(rate_per_s=0)
