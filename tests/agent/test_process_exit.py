"""Issue 44, item 4: an ended process ends its risk. A process that says it exits
(``process_exit``, sent by ``vramscope.uninstall()``) is ended at that instant: its last
verdict row is history (``ended``, risk ``ok``), the leak alert that named it resolves saying it
exited, and the device's leads move to the process left. Was: a minute of silence later.

The scripted device: pid 1 flat at 10 GiB, pid 2 rising 15 MiB/s from 40 GiB (a leak, and
the riskiest: it leads both questions) until it exits at ``EXIT``; pid 1 goes on."""

from __future__ import annotations

import pytest
from vramscope.agent.alerts.device import PROCESS_GONE_S
from vramscope.agent.alerts.engine import AlertChange, AlertEngine
from vramscope.agent.alerts.verdicts import DeviceVerdict, Verdict
from vramscope.agent.records import EXIT_EVENT, Event, Phase, Sample
from vramscope.agent.trace import parse_record

GIB, MIB = 2**30, 2**20
T0 = 1_800_000_000.0
EXIT = T0 + 1800.0  # pid 2's exit: just after its last sample (T0 + 1799.5)
END = T0 + 1900.0


def _samples(leaker_until: float = EXIT) -> list[Sample]:
    out = []
    for i in range(int(END - T0)):
        out.append(Sample(T0 + i, 0, Phase.DECODE, "torch", 1, allocated_bytes=10 * GIB,
                          reserved_bytes=11 * GIB, device_total_bytes=80 * GIB))
        if T0 + i + 0.5 < leaker_until:
            b = 40 * GIB + i * 15 * MIB
            out.append(Sample(T0 + i + 0.5, 0, Phase.DECODE, "torch", 2, allocated_bytes=b,
                              reserved_bytes=b + GIB, device_total_bytes=80 * GIB))
    return out


def _run(*extra: Sample | Event) -> tuple[AlertEngine, list[AlertChange]]:
    engine = AlertEngine.from_config(None)
    return engine, engine.feed([*_samples(), *extra])


def _ended(engine: AlertEngine) -> list[Verdict]:
    return [v for v in engine.verdicts.history if v.ended]


def _resolved(changes: list[AlertChange]) -> dict[str, tuple[float, str]]:
    return {c.rule: (c.ts_s, c.message) for c in changes if c.kind == "resolved"}


def test_an_exit_ends_the_process_at_its_instant_not_a_minute_later():
    engine, changes = _run(Event(EXIT, EXIT_EVENT, 0, 2))
    (row,) = _ended(engine)
    assert (row.ts_s, row.pid, row.ended) == (EXIT, 2, True)
    # its risk ended with it; what it says of the leak is history, kept as it was
    assert (row.risk_level, row.time_to_oom_s, row.risk_cause) == ("ok", None, None)
    assert row.leak_state == "leak" and row.leak_slope_bytes_per_s == pytest.approx(
        15 * MIB, rel=0.01)
    # the alerts that named it resolve at the exit, saying so
    fired = {c.rule: c.ts_s for c in changes if c.kind == "fired"}
    assert fired == {"oom_risk": T0 + 915.5, "memory_leak": T0 + 540.5}  # a steady rise: growth
    assert _resolved(changes) == {
        "memory_leak": (EXIT, "idle floor rising after the warm-up (pid 2 exited; its last "
                              "answer: leak)"),
        "oom_risk": (EXIT, "OOM risk: ok (risk level 0) (pid 2 exited)")}
    assert engine.active() == []
    # the device's leads move to the process left, in a row at the exit's instant
    assert engine.verdicts.device_history[-1] == DeviceVerdict(EXIT, 0, None, "ok", 1, 1)
    d = engine.devices[0]
    assert (d.risk_pid, d.leak_pid) == (1, 1)
    # pid 1's answers are its own, and it is not ended
    assert engine.verdicts.latest[(None, 0, 1)].ended is False


def test_without_the_exit_the_process_ends_after_its_silence():
    """The same records without the event: what the event changes (the test above fails
    without it). The row comes a minute of silence later; the risk alert stays held."""
    engine, changes = _run()
    (row,) = _ended(engine)
    last_sample = T0 + 1799.5
    assert row.ts_s == T0 + 1860.0 >= last_sample + PROCESS_GONE_S
    assert _resolved(changes) == {
        "memory_leak": (T0 + 1860.0, "idle floor rising after the warm-up (pid 2 ended; its "
                                     "last answer: leak)")}
    assert [rule for rule, _, _ in engine.active()] == ["oom_risk"]


def test_a_later_record_of_the_exited_process_brings_it_back():
    """As after silence: its models as they were (the leak it had, not a new detector), its
    lead back from its record, and its alerts with it; then silent, it ends again."""
    late = Sample(EXIT + 30.0, 0, Phase.DECODE, "torch", 2, allocated_bytes=67 * GIB,
                  reserved_bytes=68 * GIB, device_total_bytes=80 * GIB)
    engine, changes = _run(Event(EXIT, EXIT_EVENT, 0, 2), late)
    leads = [(r.ts_s, r.level, r.risk_pid, r.leak_pid)
             for r in engine.verdicts.device_history if r.ts_s >= EXIT]
    assert leads == [(EXIT, "ok", 1, 1), (EXIT + 30.0, "warning", 2, 2),
                     (EXIT + 30.0 + PROCESS_GONE_S, "ok", 1, 1)]
    fired = [(c.rule, c.ts_s) for c in changes if c.kind == "fired" and c.ts_s > EXIT]
    assert fired[0] == ("memory_leak", EXIT + 30.0)  # at once: the detector's own leak
    ended = _ended(engine)
    assert [v.ts_s for v in ended] == [EXIT, EXIT + 30.0 + PROCESS_GONE_S]
    assert ended[0].leak_first_detected_ts_s == ended[1].leak_first_detected_ts_s


@pytest.mark.parametrize("event", [
    Event(EXIT, EXIT_EVENT, 0, 7),  # a process the device never heard of
    Event(EXIT, EXIT_EVENT, 0, None),  # no process named
    Event(EXIT, EXIT_EVENT, 1, 2),  # another device than the one pid 2 sampled
])
def test_an_exit_of_no_running_process_changes_nothing(event):
    engine, changes = _run(event)
    baseline, base_changes = _run()
    assert changes == base_changes
    assert engine.verdicts.history == baseline.verdicts.history


def test_a_second_exit_of_the_same_process_writes_no_second_row():
    engine, _ = _run(Event(EXIT, EXIT_EVENT, 0, 2), Event(EXIT + 1.0, EXIT_EVENT, 0, 2))
    assert [v.ts_s for v in _ended(engine)] == [EXIT]


def test_the_trace_line_is_an_event_the_engine_reads():
    e = parse_record(f'{{"ts": {EXIT}, "event": "process_exit", "device": 0, "pid": 2}}')
    assert e == Event(EXIT, "process_exit", 0, 2)
    engine, _ = _run(e)  # type: ignore[arg-type]
    assert [v.ts_s for v in _ended(engine)] == [EXIT]


def test_a_risk_the_process_left_still_holds_stays():
    """The exit ends the exited process's risk, not the device's: pid 1 at 77.5 of 80 GiB
    (warning, the riskiest) keeps the risk alert; only the leak alert resolves."""
    flat = [s._replace(allocated_bytes=int(77.5 * GIB), reserved_bytes=78 * GIB)
            if s.pid == 1 else s for s in _samples()]
    engine = AlertEngine.from_config(None)
    changes = engine.feed([*flat, Event(EXIT, EXIT_EVENT, 0, 2)])
    assert _resolved(changes) == {
        "memory_leak": (EXIT, "idle floor rising after the warm-up (pid 2 exited; its last "
                              "answer: leak)")}
    assert [rule for rule, _, _ in engine.active()] == ["oom_risk"]
    assert engine.verdicts.device_history[-1] == DeviceVerdict(EXIT, 0, None, "warning", 1, 1)


def test_the_stored_exit_is_on_the_timeline_and_ends_the_stored_row(tmp_path):
    """What the live agent stores (the records, the engine's rows), read back: the ended row
    at the exit, and the exit among the timeline's rare events, drawn as its marker."""
    from vramscope.agent.config import parse_config
    from vramscope.agent.store import Store
    from vramscope.agent.store import verdicts as stored
    from vramscope.dashboard.app import create_app

    exit_event = Event(EXIT, EXIT_EVENT, 0, 2)
    engine, _ = _run(exit_event)
    with Store.open(f"sqlite:///{tmp_path}/vs.db") as st:
        st.write(_samples(), [exit_event])
        stored.write(st, engine.verdicts.take())
        rows = {v.pid: (v.ts_s, v.ended) for v in stored.latest(st, 0, None, END)}
        assert rows[2] == (EXIT, True) and rows[1][1] is False
        client = create_app(parse_config({}, None), st).test_client()
        window = f"device=0&start={EXIT - 60}&end={END}"
        doc = client.get(f"/api/v1/timeline?{window}").get_json()
        fig = client.get(f"/api/v1/figures/timeline?{window}").get_json()
    assert doc["events"] == [{"ts": EXIT, "name": "process_exit", "request_id": None,
                              "message": None, "pid": 2}]
    assert [(t["name"], t["text"]) for t in fig["data"] if t["name"] == "process exit"] == [
        ("process exit", ["pid 2 exited"])]


def test_the_ended_row_says_what_the_detector_was_missing_when_the_process_went():
    """Rows are written when an answer changes or at the heartbeat, so the last one before an
    exit may still say "warming up" minutes after the warm-up ended (the H100 run's healthy
    servers did, 8 minutes old). The ended row carries where the detector stood at the exit."""
    recs: list[Sample | Event] = []
    for i in range(420):  # idle and busy in turn, a flat floor, from T0
        busy = i % 2 == 1
        recs.append(Sample(T0 + i, 0, Phase.DECODE if busy else Phase.IDLE, "torch", 3,
                           allocated_bytes=(11 if busy else 10) * GIB, reserved_bytes=12 * GIB,
                           device_total_bytes=80 * GIB))
    recs.append(Event(T0 + 420, EXIT_EVENT, 0, 3))
    engine = AlertEngine.from_config(None)
    engine.feed(recs)
    rows = [(v.ts_s - T0, v.ended, v.leak_evidence.split(";")[0])
            for v in engine.verdicts.history if v.pid == 3]
    warming = ("not enough data yet: warming up (the first 5 min of a process are not its "
               "floor), then 15 min of idle floor")
    assert rows == [
        (0.0, False, warming), (300.0, False, warming),  # the heartbeat, just before it ended
        (420.0, True, "not enough data yet: 15.0 more min of idle floor (has 0.0 of the 15 min "
                      "a verdict rests on, after the 5 min warm-up)")]
