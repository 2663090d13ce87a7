"""Analysis windows chosen from the data (agent/analysis/windows.py), and the defaults on the
real recordings that the fixed one-minute windows could not judge."""

from pathlib import Path

import pytest
from vramscope.agent.alerts.offline import analyze_records
from vramscope.agent.analysis.thresholds import Thresholds
from vramscope.agent.analysis.windows import WindowChooser, Windows, choose, windows_from_json
from vramscope.agent.records import Event, Phase, Sample
from vramscope.agent.trace import read_trace

DATA = Path(__file__).resolve().parents[1] / "data"


def test_windows_kept_in_a_verdict_row_come_back_and_an_odd_field_is_no_windows():
    w = choose(Thresholds(), 0.05, 2.2, "idle entries")
    assert w.to_json() == {"floor_s": 2.2, "trend_s": 4.4, "warmup_s": 300.0,
                           "sample_interval_s": 0.05, "cycle_s": 2.2,
                           "cycle_from": "idle entries"}
    assert windows_from_json(w.to_json()) == w
    unknown = choose(Thresholds(), None, None)  # too few samples: no interval, no cycle
    assert windows_from_json(unknown.to_json()) == unknown
    # a row written before verdicts kept windows, or a damaged field: no windows, no error
    for odd in (None, "60 s", [60.0], {"floor_s": "a minute", "trend_s": 60, "warmup_s": 300},
                {"trend_s": 60.0}):
        assert windows_from_json(odd) is None, odd


def test_windows_follow_the_cycle_within_the_configured_bounds():
    t = Thresholds()
    # a request every 2.2 s sampled every 0.05 s: a floor of one cycle, a trend of two; the
    # warm-up is a duration (alerts.leak_warmup_s), whatever the cycle
    assert choose(t, 0.05, 2.2, "idle entries") == Windows(2.2, 4.4, 300.0, 0.05, 2.2,
                                                          "idle entries")
    # requests ending every 0.25 s sampled every 0.5 s: the sampling sets the windows
    assert choose(t, 0.5, 0.25)[:3] == (2.0, 4.0, 300.0)
    # a two-minute KV sawtooth: the settings are the upper bounds
    assert choose(t, 10.0, 120.0)[:3] == (60.0, 60.0, 300.0)
    # no cycle seen: the bounds, as before the windows were derived
    assert choose(t, 1.0, None)[:3] == (60.0, 60.0, 300.0)
    # tiny cycles never go under MIN_WINDOW_S
    assert choose(t, 0.001, 0.01)[:3] == (0.5, 0.5, 300.0)


def test_the_chooser_reads_idle_entries_from_request_events():
    c = WindowChooser(Thresholds())
    decided = None
    for i in range(200):  # samples every 0.1 s; a request from 1.0 to 1.5 s of every 2 s
        ts = i / 10
        if i % 20 == 10:
            c.on_event(Event(ts, "request_start", 0, request_id=str(i)))
        if i % 20 == 15:
            c.on_event(Event(ts, "request_end", 0, request_id=str(i)))
        decided = c.update(Sample(ts, 0, Phase.IDLE, "t", allocated_bytes=100))
        if decided:
            break
    # the 5th idle entry (4 gaps of 2 s) at 9.5 s decides
    assert decided.floor_s == pytest.approx(2.0) and decided.cycle_from == "idle entries"
    assert ts == pytest.approx(9.5)


def test_without_a_cycle_the_chooser_decides_after_two_bound_windows():
    c = WindowChooser(Thresholds(leak_floor_window_s=5.0))
    got = [c.update(Sample(float(ts), 0, Phase.DECODE, "t", allocated_bytes=1)) for ts in
           range(12)]
    assert got[9] is None and got[10][:3] == (5.0, 60.0, 300.0) and got[10].cycle_s is None


def test_a_short_recording_with_a_real_leak_answers_insufficient_data():
    """The 98-s H200 recording of transformers' generate_batch leaking a 32 MiB cuBLAS
    workspace per call (one call every 2 s): a real leak, but 98 s cannot tell a leak from a
    warm-up. With the defaults the answer is "not enough data yet" and what is missing, never
    "no leak", and no alert; the cycle (2.2 s) sets where floor points are read, not when a
    verdict is due."""
    trace = read_trace(str(DATA / "gpu_cublas_leak.jsonl"))
    doc = analyze_records(trace.samples, trace.events)
    dev = doc["devices"]["0"]
    leak = dev["leak"]
    assert (leak["detected"], leak["state"], leak["span_s"]) == (False, "insufficient_data",
                                                                  0.0)
    assert leak["evidence"].startswith("not enough data yet: warming up (the first 5 min of a "
                                       "process are not its floor), then 15 min of idle floor")
    assert (round(leak["windows"]["floor_s"], 1), leak["windows"]["warmup_s"]) == (2.2, 300.0)
    assert doc["alerts"] == []
    assert (dev["oom"]["first_warning_ts"], dev["oom"]["max_risk"]) == (None, "ok")


def test_healthy_recording_with_the_defaults_no_leak_no_warning():
    trace = read_trace(str(DATA / "gpu_healthy.jsonl"))
    dev = analyze_records(trace.samples, trace.events)["devices"]["0"]
    assert (dev["leak"]["detected"], dev["leak"]["state"]) == (False, "insufficient_data")
    assert (dev["oom"]["first_warning_ts"], dev["oom"]["max_risk"]) == (None, "ok")


def test_idle_phase_with_a_request_in_flight_is_not_the_floor():
    # One thread's request ended (its hook said idle) while another's still runs: the 100 B
    # moment is not between requests; the floor is the 150 B after the last one ended.
    from vramscope.agent.analysis.floor import FloorTracker

    f = FloorTracker(10.0)
    f.update(Sample(0.0, 0, Phase.DECODE, "t", allocated_bytes=300))
    f.on_event(Event(0.5, "request_start", 0, request_id="a"))
    f.update(Sample(1.0, 0, Phase.IDLE, "t", allocated_bytes=100))
    f.update(Sample(2.0, 0, Phase.DECODE, "t", allocated_bytes=200))
    f.on_event(Event(3.0, "request_end", 0, request_id="a"))
    f.update(Sample(4.0, 0, Phase.IDLE, "t", allocated_bytes=150))
    assert f.update(Sample(11.0, 0, Phase.IDLE, "t", allocated_bytes=150)) == (4.0, 150)


def test_a_never_idle_server_takes_its_cycle_from_request_ends_after_30_s():
    # two clients always busy: a request ends every 0.6 s, never all at once; samples 0.5 s
    c = WindowChooser(Thresholds())
    n_start = 0
    decided = None
    for i in range(200):
        ts = i * 0.5
        while n_start * 0.6 <= ts:  # one request starts as one ends: two always in flight
            if n_start >= 2:
                c.on_event(Event(n_start * 0.6, "request_end", 0, request_id=str(n_start - 2)))
            c.on_event(Event(n_start * 0.6, "request_start", 0, request_id=str(n_start)))
            n_start += 1
        decided = c.update(Sample(ts, 0, Phase.DECODE, "t", allocated_bytes=100))
        if decided:
            break
    assert ts == 30.0 and decided.cycle_from == "request ends"
    assert decided[:3] == (2.0, 4.0, 300.0) and decided.cycle_s == pytest.approx(0.6)
