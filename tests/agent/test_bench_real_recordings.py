"""bench detection's real recordings: listed truth, record_serving truth files, per-recording
scores with the default settings."""

import json

import pytest
from vramscope.agent.records import Event, Phase, Sample
from vramscope.agent.trace import write_trace

from tools.bench.detection import real_figures
from tools.bench.real_recordings import RealRecording, recordings, score

MIB = 2**20


def test_the_cublas_recording_is_right_to_say_it_is_too_short():
    # 98 s of a real leak: too short for a verdict by the defaults (5 min warm-up, then 15 min
    # of floor); the right answer is insufficient_data, with no alert
    rec = next(r for r in recordings() if r.name == "gpu_cublas_leak")
    s = score(rec)
    assert (s.leak, s.detected, s.state, s.false_alarms, s.short, s.right) == (
        True, False, "insufficient_data", 0, True, True)
    assert s.windows["floor_s"] == pytest.approx(2.2, abs=0.01)
    [fig] = real_figures([s])
    assert (fig.metric, fig.value, fig.met) == ("real: gpu_cublas_leak", 1.0, True)
    assert "insufficient data said (a leak)" in fig.spread


def test_a_record_serving_truth_file_is_found_without_a_listing(tmp_path):
    # 45 minutes of a server idle between requests every 2 s, leaking 1 MiB per request
    samples, events = [], []
    for i in range(1350):
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
    # the first verdict: the trend point of the minute at 1200 s (15 min after the first one,
    # at the end of the 5-min warm-up), known once the next minute's first floor window
    # closes (1262 s)
    assert s.delay_s == pytest.approx(1261.0)


def test_the_detection_figures_in_docs_analysis_are_rendered_from_the_committed_json():
    from pathlib import Path

    from tools.bench.tables import render

    docs = Path(__file__).resolve().parents[2] / "docs"
    text = (docs / "analysis.md").read_text()
    assert "bench/detection.json" in text
    assert render(text, docs) == text, (
        "docs/analysis.md is out of date: python -m tools.bench.tables docs/analysis.md")


@pytest.mark.parametrize("name", ["gpu_serving_healthy", "gpu_serving_request_leak",
                                  "gpu_serving_never_idle"])
def test_the_short_h200_serving_recordings_say_they_are_too_short(name):
    """tests/gpu/record_serving.py on the H200 (100-300 s; two of them leak): no verdict is
    due before 5 min of warm-up and 15 min of floor, so each says insufficient_data and nothing
    fires, leak or not."""
    rec = next((r for r in recordings() if r.name == name), None)
    if rec is None:
        pytest.skip(f"{name} not recorded")
    s = score(rec)
    assert (s.state, s.alerts, s.oom, s.short, s.right) == (
        "insufficient_data", [], False, True, True)


def test_the_20_minute_never_idle_h200_recording_is_just_short_of_a_verdict():
    """tests/gpu/record_serving.py --scenario never_idle --duration-s 1230 --leak-start-s 420 on
    the H200 (4 clients, never idle; a 2 MiB tensor kept every 20th request from 420 s), kept
    gzip-compressed: 14.1 min of floor after the warm-up, 0.9 min short of the 15 a verdict
    rests on; it says so, and nothing fires."""
    rec = next(r for r in recordings() if r.name == "gpu_never_idle_long")
    assert rec.path.name == "gpu_never_idle_long.jsonl.gz" and rec.leak
    s = score(rec)
    assert s.duration_s > 1200 and (s.state, s.alerts, s.right) == (
        "insufficient_data", [], True)
    assert s.windows["cycle_from"] == "request ends"  # never idle: the floor after a request


def test_two_servers_on_one_h200_five_minutes_no_alert_and_not_enough_data():
    """tests/gpu/record_pair.sh on the H200 (2026-12-04): two never-idle generate() servers on
    one GPU for 302 s, one keeping a 2 MiB tensor every 17th request from 60 s (303 kB/s, 0.7 %
    of the GPU an hour), the other healthy. Analyzed together, as the agent would see them: no
    alert of any kind (the agent once raised oom_risk 60 s into such a run, with a forecast
    of 25 minutes), and each process's leak verdict says what it lacks."""
    from vramscope.agent.alerts.offline import analyze_records
    from vramscope.agent.trace import read_trace

    data = recordings()[0].path.parent
    leak, healthy = (read_trace(str(data / f"gpu_pair_{n}.jsonl.gz")) for n in ("leak",
                                                                              "healthy"))
    assert {s.pid for s in leak.samples} != {s.pid for s in healthy.samples}
    doc = analyze_records(leak.samples + healthy.samples, leak.events + healthy.events)
    dev = doc["devices"]["0"]
    assert doc["alerts"] == []
    assert (dev["oom"]["max_risk"], dev["oom"]["first_warning_ts"]) == ("ok", None)
    assert dev["leak"]["state"] == "insufficient_data"
    assert dev["leak"]["evidence"].startswith("not enough data yet: warming up (the first 5 "
                                              "min")
    rec = next(r for r in recordings() if r.name == "gpu_pair_healthy")
    assert (rec.leak, score(rec).right) == (False, True)  # its truth: no leak (fixed label)


def test_growth_that_fills_an_h100_in_a_quarter_hour_is_named_in_a_minute_and_a_half():
    """tests/gpu/record_serving.py --scenario never_idle --duration-s 500 --leak-start-s 150
    --leak-every 1 --leak-bytes 25165824 --seed 7 on an H100 (2026-12-07; 4 never-idle
    generate() clients, attach_transformers reporting the tokens their caches hold): every
    request keeps 24 MiB from 150 s, 93.2 MB/s (312.4 GiB/h; the 79 GiB device full in about a
    quarter hour). The leak is named 88.5 s after its onset, inside max(3 min, 10 % of its
    time to fill), at 1.008x its rate. The process exits at the end of the recording: the
    document still speaks of the leak that ran in it (it said "not enough data yet" from a
    pid-less snapshot's detector before)."""
    rec = next(r for r in recordings() if r.name == "gpu_never_idle_fast")
    assert rec.leak and rec.leak_bytes_per_s == pytest.approx(93177236.86, abs=0.01)
    s = score(rec)
    assert (s.detected, s.state, s.false_alarms, s.right) == (True, "leak", 0, True)
    assert s.delay_s == pytest.approx(88.49, abs=0.01)
    assert s.slope_ratio == pytest.approx(1.008, abs=0.001)
    assert [a.split("@")[0] for a in s.alerts] == ["memory_leak", "oom_risk"]
