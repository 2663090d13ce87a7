"""``analyze --db`` streams: a device's records flow through the analysis and are dropped, so
memory is bounded however long the window; the OOM diagnosis keeps a bounded history."""

from __future__ import annotations

import json

from vramscope.agent.alerts.engine import DeviceAnalysis
from vramscope.agent.alerts.offline import CHUNK, analyze_records
from vramscope.agent.analysis.diagnosis import diagnose
from vramscope.agent.analysis.merge import iter_merged, merged, time_batches
from vramscope.agent.analysis.report import OomWitness
from vramscope.agent.cli import main
from vramscope.agent.records import Event, Phase, Sample
from vramscope.agent.store import Store
from vramscope.agent.store.history_generator import History, generate
from vramscope.agent.trace import write_trace

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
