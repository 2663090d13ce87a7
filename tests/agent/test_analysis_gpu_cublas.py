"""``vramscope analyze`` on the cuBLAS-workspace leak recorded through the product on the H200.

The trace is ``tests/gpu/record_cublas_leak.py``'s, run with its defaults (45 generate_batch
calls of 16 requests, one every 2 s, on a random-weight 4-layer Llama, transformers 5.17, torch
2.11): every call runs on a new CUDA stream, and torch keeps a 32 MiB cuBLAS workspace per
stream, so the idle floor rises 32 MiB a call. The analysis must report the leak and name its
make-up: new 32 MiB segments, one per new stream, and the workspace as the diagnosis.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vramscope.agent.alerts.offline import analyze_records
from vramscope.agent.analysis.makeup import CUBLAS_DIAGNOSIS, CUBLAS_REMEDY
from vramscope.agent.trace import read_trace

TRACE = Path(__file__).resolve().parents[1] / "data" / "gpu_cublas_leak.jsonl"
MIB = 2**20
WORKSPACE = 32 * MIB  # Hopper's default (CUBLAS_WORKSPACE_CONFIG unset)
PERIOD_S = 2.0  # the script's --period-s: one call, so one floor point, per window

pytestmark = pytest.mark.skipif(
    not TRACE.exists(), reason="tests/data/gpu_cublas_leak.jsonl not recorded yet: run "
    "tests/gpu/record_cublas_leak.py on the GPU machine and commit its --out file")


@pytest.fixture(scope="module")
def leak():
    trace = read_trace(str(TRACE))
    # time compressed through the analysis API (98 s of recording; the defaults answer
    # insufficient_data, test_analysis_windows): a trend point per call, verdicts on 20 s
    config = {"alerts.leak_warmup_s": 0.0, "alerts.leak_floor_window_s": PERIOD_S,
              "alerts.leak_horizon_s": 120 * PERIOD_S, "alerts.leak_min_span_s": 20.0}
    doc = analyze_records(trace.samples, trace.events, config)
    return doc["devices"]["0"]["leak"]


def test_the_leak_is_reported(leak):
    assert leak["detected"] is True, leak["evidence"]
    # one workspace per call, a call every PERIOD_S or a little more when a call ran long
    per_period = leak["slope_bytes_per_s"] * PERIOD_S
    assert 0.3 * WORKSPACE <= per_period <= 1.25 * WORKSPACE, leak["evidence"]


def test_its_makeup_is_a_32_mib_workspace_per_new_stream(leak):
    m = leak["makeup"]
    assert m is not None, "no two memory_layout events in the trace"
    top = m["blocks"][0]
    assert top["size_bytes"] == WORKSPACE
    assert top["count"] == top["streams"] == top["new_streams"] >= 10
    assert top["description"] == f"{top['count']} new blocks of 32 MiB, one per new stream"
    assert 2 * top["bytes"] >= m["new_bytes"]
    segments = {r["size_bytes"]: r for r in m["segments"]}
    assert WORKSPACE in segments, m["segments"]
    seg = segments[WORKSPACE]
    assert seg["count"] == seg["new_streams"] == top["count"]
    assert seg["description"].endswith("new segments of 32 MiB, one per new stream")
    assert (m["diagnosis"], m["remedy"]) == (CUBLAS_DIAGNOSIS, CUBLAS_REMEDY)


def test_the_growth_between_the_idle_points_is_the_workspaces(leak):
    m = leak["makeup"]
    calls = m["blocks"][0]["count"]
    assert abs(m["allocated_growth_bytes"] - calls * WORKSPACE) <= MIB
