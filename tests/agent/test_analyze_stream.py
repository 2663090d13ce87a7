"""``analyze --db`` streams: a device's records flow through the analysis and are dropped, so
memory is bounded however long the window; the OOM diagnosis keeps a bounded history."""

from __future__ import annotations

import json
from itertools import islice

import pytest
from vramscope.agent.alerts.device import DeviceAnalysis
from vramscope.agent.alerts.offline import CHUNK, analyze_records
from vramscope.agent.analysis.diagnosis import diagnose
from vramscope.agent.analysis.merge import (
    OutOfOrder,
    in_time_order,
    iter_merged,
    merged,
    time_batches,
)
from vramscope.agent.analysis.report import OomWitness
from vramscope.agent.cli import main
from vramscope.agent.records import Event, Phase, Sample
from vramscope.agent.store import Store
from vramscope.agent.trace import write_trace

from tools.history_generator import History, generate

GIB, MIB = 2**30, 2**20


def _s(ts: float, allocated: int = GIB, phase: Phase = Phase.IDLE, device: int = 0) -> Sample:
    return Sample(ts, device, phase, "torch", 100, allocated_bytes=allocated,
                  reserved_bytes=allocated + 64 * MIB, device_total_bytes=8 * GIB)


def _e(ts: float, name: str, rid: str | None = None, device: int = 0) -> Event:
    return Event(ts, name, device, 100, None, rid)


def test_the_lazy_merge_orders_ties_like_the_list_merge():
    samples = [_s(1.0, 1), _s(2.0, 2), _s(2.0, 3), _s(3.0, 4)]
    events = [_e(2.0, "a"), _e(2.0, "b"), _e(3.0, "c")]
    lazy = list(iter_merged(iter(samples), iter(events)))
    assert lazy == merged(samples, events)
    assert [r.name if isinstance(r, Event) else r.allocated_bytes for r in lazy] == [
        1, "a", "b", 2, 3, "c", 4]


def test_time_batches_cut_the_merged_order_into_consecutive_pieces():
    samples = [_s(1.0, 1), _s(2.0, 2), _s(2.0, 3), _s(3.0, 4), _s(4.0, 5)]
    events = [_e(0.5, "a"), _e(2.0, "b"), _e(2.0, "c"), _e(3.5, "d"), _e(5.0, "e"),
              _e(6.0, "f"), _e(7.0, "g")]
    batches = list(time_batches(iter(samples), iter(events), 2))

    def names(rs):
        return [r.name if isinstance(r, Event) else r.allocated_bytes for r in rs]

    # the events up to each batch's last sample (a tie: the event in the batch), then the
    # events after the last sample, two at a time
    assert [(names(s), names(e)) for s, e in batches] == [
        ([1, 2], ["a", "b", "c"]), ([3, 4], []), ([5], ["d"]), ([], ["e", "f"]), ([], ["g"])]
    assert [r for s, e in batches for r in merged(s, e)] == merged(samples, events)


def _oom_recording(n: int) -> tuple[list[Sample], list[Event]]:
    """``n`` idle/decode samples at 1 Hz whose idle floor rises 1 GiB over the recording (a
    growth OOM), a request per 10 s, then an ``oom`` event at the last sample."""
    samples, events = [], []
    for i in range(n):
        phase = Phase.DECODE if i % 10 in (1, 2, 3) else Phase.IDLE
        samples.append(_s(float(i), GIB + GIB * i // n + (MIB if phase is Phase.DECODE else 0),
                          phase))
        if i % 10 == 1:
            events.append(_e(i - 0.5, "request_start", f"r{i}"))
        if i % 10 == 4:
            events.append(_e(i - 0.5, "request_end", f"r{i - 3}"))
    events.append(_e(float(n - 1), "oom"))
    return samples, events


def test_the_witness_below_its_bound_gives_the_diagnosis_of_every_sample():
    samples, events = _oom_recording(2000)
    at = samples[-1].ts_s
    w = OomWitness(0, at, at)
    for r in merged(samples, events):
        w.add(r)
    before, facts = w.facts()
    assert before == samples
    assert facts["in_flight_series"][-1] == (at, 0)
    assert diagnose(None, before, ts_s=at, **facts)[0] == "growth"
    assert w.peak_held == 2000


def test_the_witness_thins_its_history_and_keeps_the_tail_whole():
    samples, events = _oom_recording(20_000)  # 5.5 h at 1 Hz; the tail: the last 300 s
    at = samples[-1].ts_s
    w = OomWitness(0, at, at, history_max=1000)
    for r in merged(samples, events):
        w.add(r)
    before, facts = w.facts()
    # 19,699 samples before the tail (ts < 19,699) thinned to every 32nd: 615 kept (the
    # history peaked at 999 before its last halving); + 301 in the tail
    assert len(before) == 615 + 301 and w.peak_held == 999
    assert before[:3] == samples[0:96:32] and before[-301:] == samples[-301:]
    assert diagnose(None, before, ts_s=at, **facts)[0] == "growth"  # as from every sample
    assert diagnose(None, samples, ts_s=at)[0] == "growth"


def test_the_first_serving_sample_survives_the_thinning():
    samples = [_s(float(i)) for i in range(5000)]
    samples[1] = _s(1.0, GIB, Phase.DECODE)  # served once, for one sample, long ago
    w = OomWitness(0, 4999.0, 4999.0, history_max=100)
    for s in samples:
        w.add(s)
    before, _ = w.facts()
    assert samples[1] in before
    assert diagnose(None, before, ts_s=4999.0)[0] != "startup"


def test_analyze_records_still_takes_lists():
    samples, events = _oom_recording(400)
    doc = analyze_records(samples, events)
    assert doc["devices"]["0"]["oom"]["cause"] == "growth"
    assert doc["devices"]["0"]["phases"]["decode"]["samples"] == 120


def test_an_oom_in_the_database_is_diagnosed_like_the_exported_file(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'o.db'}"
    samples, events = _oom_recording(600)
    with Store.open(url, host_name="h") as store:
        store.write(samples, events)
    assert main(["analyze", "--json", "--db", url, "--config", _host(tmp_path, "h")]) == 0
    from_db = json.loads(capsys.readouterr().out)
    trace = tmp_path / "o.jsonl"
    with open(trace, "w", encoding="utf-8") as out:
        write_trace(out, samples, events)
    assert main(["analyze", "--json", str(trace)]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert from_db["devices"] == from_file["devices"]
    assert from_db["devices"]["0"]["oom"]["cause"] == "growth"
    assert from_db["devices"]["0"]["oom"]["first_oom_ts"] == 599.0


def _host(tmp_path, name: str) -> str:
    path = tmp_path / "vramscope.toml"
    path.write_text(f'[agent]\nhost_name = "{name}"\n', encoding="utf-8")
    return str(path)


def test_the_database_is_analyzed_without_reading_the_window_ahead(tmp_path, capsys,
                                                                    monkeypatch):
    """The samples read from the store but not yet through the engine: at most a batch (the
    old code read a device's whole window into a list first: 8,640 here, 6 M a device-week)."""
    url = f"sqlite:///{tmp_path / 'w.db'}"
    with Store.open(url) as store:  # one device, 10 Hz, 0.01 day
        generate(store, History(devices=1, hz=10, days=0.01, rollups=False))
    read, fed, ahead = [0], [0], [0]
    real_iter, real_on_sample = Store.iter_samples, DeviceAnalysis.on_sample

    def iter_samples(self, *args, **kwargs):
        for s in real_iter(self, *args, **kwargs):
            read[0] += 1
            ahead[0] = max(ahead[0], read[0] - fed[0])
            yield s

    def on_sample(self, s):
        fed[0] += 1
        return real_on_sample(self, s)

    monkeypatch.setattr(Store, "iter_samples", iter_samples)
    monkeypatch.setattr(DeviceAnalysis, "on_sample", on_sample)
    assert main(["analyze", "--json", "--db", url]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sum(p["samples"] for p in doc["devices"]["0"]["phases"].values()) == 8640
    assert read[0] == fed[0] == 8640
    assert ahead[0] <= CHUNK


def _names(records):
    return [r.name if isinstance(r, Event) else (r.device, r.allocated_bytes) for r in records]


def _written_late(samples, events, late_s: float) -> list[Sample | Event]:
    """The records in the order a writer with a lagging thread puts them down: each event
    after the samples of the next ``late_s`` seconds."""
    out: list[Sample | Event] = []
    pending = sorted(events, key=lambda e: e.ts_s)
    for s in samples:
        while pending and pending[0].ts_s + late_s <= s.ts_s:
            out.append(pending.pop(0))
        out.append(s)
    return out + pending


def test_in_time_order_sorts_a_recording_written_a_little_late_as_merged_does():
    samples = [_s(1.0, 1), _s(2.0, 2), _s(2.0, 3), _s(1.5, 4), _s(3.0, 5), _s(9.0, 6)]
    events = [_e(2.0, "a"), _e(0.5, "b"), _e(2.0, "c"), _e(8.0, "d")]
    chunks = [(samples[:3], events[:1]), (samples[3:5], events[1:3]), (samples[5:], events[3:])]
    ordered = [item[4] for item in in_time_order(iter(chunks), slack_s=5.0)]
    assert ordered == merged(samples, events)
    assert _names(ordered) == ["b", (0, 1), (0, 4), "a", "c", (0, 2), (0, 3), (0, 5), "d",
                               (0, 6)]


def test_in_time_order_refuses_a_record_later_than_its_slack():
    chunks = [([_s(1.0, 1), _s(20.0, 2)], []), ([_s(30.0, 3)], []), ([], [_e(2.0, "late")])]
    it = in_time_order(iter(chunks), slack_s=5.0, name="t.jsonl")
    # 1.0 < 20 - 5: given out after the first chunk; 20.0 < 30 - 5 after the second
    assert _names(item[4] for item in islice(it, 2)) == [(0, 1), (0, 2)]
    with pytest.raises(OutOfOrder) as err:
        next(it)
    assert str(err.value) == ("t.jsonl: a record at 2.000 s comes after one at 20.000 s, "
                              "more than 5 s out of time order")


def _two_device_files(tmp_path, late_s: float) -> tuple[list[str], list[Sample], list[Event]]:
    """Device 0's OOM recording and device 1's steady one, each its own file over the same
    hours, each with its events written ``late_s`` late."""
    s0, e0 = _oom_recording(20_000)
    s1 = [_s(i + 0.25, GIB, Phase.IDLE, device=1) for i in range(20_000)]
    e1 = [_e(i + 0.25, "request_start", f"q{i}", device=1) for i in range(0, 20_000, 30)]
    paths = []
    for name, (samples, events) in (("d0", (s0, e0)), ("d1", (s1, e1))):
        path = tmp_path / f"{name}.jsonl"
        with open(path, "w", encoding="utf-8") as out:
            for r in _written_late(samples, events, late_s):
                write_trace(out, [r] if isinstance(r, Sample) else [],
                            [r] if isinstance(r, Event) else [])
        paths.append(str(path))
    return paths, s0 + s1, e0 + e1


def test_trace_files_are_analyzed_as_a_stream_like_loaded_whole(tmp_path, capsys,
                                                                 monkeypatch):
    """Two files over the same 5.5 hours, events written 3 s late: the document of loading
    them whole and sorting, with at most a few chunks of records read ahead of the engine
    (iter_trace's 5,000, a batch, the 60 s held back per file), not the 40,000 samples."""
    import vramscope.agent.trace as trace_mod

    paths, samples, events = _two_device_files(tmp_path, late_s=3.0)
    whole = analyze_records(samples, events)
    assert whole["devices"]["0"]["oom"]["cause"] == "growth"
    read, fed, ahead = [0], [0], [0]
    real_parse, real_on_sample = trace_mod.parse_record, DeviceAnalysis.on_sample

    def parse_record(*args):
        r = real_parse(*args)
        read[0] += isinstance(r, Sample)
        return r

    def on_sample(self, s):  # how far reading is ahead of the engine, at each sample it takes
        fed[0] += 1
        ahead[0] = max(ahead[0], read[0] - fed[0])
        return real_on_sample(self, s)

    monkeypatch.setattr(trace_mod, "parse_record", parse_record)
    monkeypatch.setattr(DeviceAnalysis, "on_sample", on_sample)
    assert main(["analyze", "--json", *paths]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == json.loads(json.dumps(whole))
    assert out.err == ""
    assert fed[0] == 40_000
    assert read[0] == 80_000  # and again up to device 0's OOM, its last sample (the diagnosis)
    assert ahead[0] <= 2 * 5000 + CHUNK + 2 * 61


def test_a_trace_file_further_out_of_order_is_loaded_whole_with_a_note(tmp_path, capsys):
    paths, samples, events = _two_device_files(tmp_path, late_s=90.0)
    assert main(["analyze", "--json", "--device", "0", *paths]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == json.loads(json.dumps(analyze_records(samples, events,
                                                                        device=0)))
    assert out.err.startswith(f"note: {paths[0]}: a record at ")
    assert out.err.endswith("more than 60 s out of time order: loading the recording whole "
                            "to sort it\n")
