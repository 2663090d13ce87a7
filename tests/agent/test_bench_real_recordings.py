"""bench detection's real recordings: listed truth, record_serving truth files, per-recording
scores with the default settings."""

import json

import pytest
from vramscope.agent.bench.detection import real_figures
from vramscope.agent.bench.real_recordings import RealRecording, recordings, score
from vramscope.agent.records import Event, Phase, Sample
from vramscope.agent.trace import write_trace

MIB = 2**20


def test_the_cublas_recording_scores_right_with_the_defaults():
    rec = next(r for r in recordings() if r.name == "gpu_cublas_leak")
    s = score(rec)
    assert (s.leak, s.detected, s.false_alarms, s.right) == (True, True, 0, True)
    assert s.slope_ratio == pytest.approx(0.90, abs=0.01)  # 15.1 MB/s found, 16.8 leaked
    assert s.windows["floor_s"] == pytest.approx(2.2, abs=0.01)
    [fig] = real_figures([s])
    assert (fig.metric, fig.value, fig.met) == ("real: gpu_cublas_leak", 1.0, True)
    assert "slope x0.90" in fig.spread


def test_a_record_serving_truth_file_is_found_without_a_listing(tmp_path):
    # 10 minutes of a server idle between requests every 2 s, leaking 1 MiB per request
    samples, events = [], []
    for i in range(300):
        t = 2.0 * i
        events += [Event(t + 0.5, "request_start", 0, request_id=f"r{i}"),
                   Event(t + 1.0, "request_end", 0, request_id=f"r{i}")]
        for k in range(4):
            phase = Phase.DECODE if k == 1 else Phase.IDLE
            alloc = 100 * MIB + i * MIB + (8 * MIB if k == 1 else 0)
            samples.append(Sample(t + 0.5 * k, 0, phase, "torch", allocated_bytes=alloc,
                                  reserved_bytes=400 * MIB, device_total_bytes=80 * 2**30))
    trace = tmp_path / "serving.jsonl"
    with open(trace, "w") as fh:
        write_trace(fh, samples, events)
    truth = {"scenario": "request_leak", "oom_expected": False,
             "leak": {"present": True, "start_ts": 1.0, "bytes_per_s": MIB / 2.0, "how": "x"}}
    (tmp_path / "serving.jsonl.truth.json").write_text(json.dumps(truth))
    [rec] = recordings(tmp_path)
    assert rec == RealRecording("serving", trace, True, MIB / 2.0, 1.0, False, "x")
    s = score(rec)
    assert (s.detected, s.false_alarms, s.right) == (True, 0, True)
    assert s.slope_ratio == pytest.approx(1.0, abs=0.02)
    assert s.windows["cycle_s"] == 2.0 and s.windows["floor_s"] == 2.0
    assert s.delay_s < 120  # 30 points of 2 s after a 10 s warm-up, evaluated every 5


def test_the_detection_figures_in_docs_analysis_are_rendered_from_the_committed_json():
    from pathlib import Path

    from vramscope.agent.bench.tables import render

    docs = Path(__file__).resolve().parents[2] / "docs"
    text = (docs / "analysis.md").read_text()
    assert "bench/detection.json" in text
    assert render(text, docs) == text, (
        "docs/analysis.md is out of date: python -m vramscope.agent.bench.tables docs/analysis.md")


@pytest.mark.parametrize("name", ["gpu_serving_healthy", "gpu_serving_request_leak",
                                  "gpu_serving_never_idle"])
def test_the_h200_serving_recordings_with_the_defaults(name):
    """tests/gpu/record_serving.py on the H200 (100-300 s): the healthy and leaking generate()
    servers are right with the defaults (the leak at 1.12x its rate, 90 s in) and none raises
    a false alarm; the never-idle one (2 MiB kept every 20th request from 180 s, 30 MiB in
    its last 2 minutes) is found by the sequential test."""
    rec = next((r for r in recordings() if r.name == name), None)
    if rec is None:
        pytest.skip(f"{name} not recorded")
    s = score(rec)
    assert (s.false_alarms, s.oom, s.right) == (0, False, True)
    if name == "gpu_serving_request_leak":
        assert 1 / 1.5 < s.slope_ratio < 1.5


def test_the_5_minute_never_idle_h200_recording_is_found_by_the_sequential_test():
    """Its floor (2-s windows, the floor after a request less ~2.5 MiB per request still in
    flight) is flat to 180 s, then rises by 2 MiB every ~7 s: the CUSUM crosses and the 6
    points since its change point confirm 68.5 s after the leak began; the slope over that span
    is the leak's (the horizon test's over the whole 2-minute floor was a third of it, and not
    significant at the end)."""
    rec = next((r for r in recordings() if r.name == "gpu_serving_never_idle"), None)
    if rec is None:
        pytest.skip("gpu_serving_never_idle not recorded")
    s = score(rec)
    assert s.delay_s == pytest.approx(68.5, abs=0.1)
    assert s.slope_ratio == pytest.approx(1.09, abs=0.005)
    assert s.alerts == ["memory_leak@248.5s"]


def test_the_20_minute_never_idle_h200_recording_is_right_with_the_defaults():
    """tests/gpu/record_serving.py --scenario never_idle --duration-s 1230 --leak-start-s 420 on
    the H200 (4 clients, never idle; a 2 MiB tensor kept every 20th request from 420 s), kept
    gzip-compressed: the leak is found with the defaults, at its rate, and nothing else fires."""
    rec = next(r for r in recordings() if r.name == "gpu_never_idle_long")
    assert rec.path.name == "gpu_never_idle_long.jsonl.gz" and rec.leak
    s = score(rec)
    assert s.duration_s > 1200 and (s.detected, s.false_alarms, s.right) == (True, 0, True)
    assert 1 / 1.5 < s.slope_ratio < 1.5
    assert s.windows["cycle_from"] == "request ends"  # never idle: the floor after a request
    assert s.delay_s < 600
