"""The engine chooses once which process leads (issue 46): the riskiest process an alert names
and the leaking one are stored with the device's level (``device_verdicts``), and every
surface reads that choice instead of choosing again with a key of its own.

The scripted device has two processes at ``warning``: pid 1 flat 2.5 GiB under its 80 GiB
limit (the lowest headroom), pid 2 half full and rising 15 MiB/s (the soonest time to OOM, and
a leak). The engine's key (lowest headroom ratio) leads with pid 1; the key the store used to
apply (soonest time to OOM) led with pid 2, so the alert said pid 1 and the page pid 2."""

from __future__ import annotations

import pytest
from vramscope.agent.alerts.engine import AlertEngine
from vramscope.agent.alerts.sinks import StoreSink
from vramscope.agent.alerts.verdicts import DeviceVerdict
from vramscope.agent.clock import FakeClock
from vramscope.agent.config import parse_config
from vramscope.agent.records import EXIT_EVENT, Event, Phase, Sample
from vramscope.agent.store import Store, window_verdicts
from vramscope.agent.store import verdicts as stored
from vramscope.dashboard.app import create_app

GIB, MIB = 2**30, 2**20
T0 = 1_800_000_000.0
END = T0 + 1799.5


def _samples() -> list[Sample]:
    out = []
    for i in range(1800):
        out.append(Sample(T0 + i, 0, Phase.DECODE, "torch", 1, allocated_bytes=int(77.5 * GIB),
                          reserved_bytes=78 * GIB, device_total_bytes=80 * GIB))
        b = 40 * GIB + i * 15 * MIB
        out.append(Sample(T0 + i + 0.5, 0, Phase.DECODE, "torch", 2, allocated_bytes=b,
                          reserved_bytes=b + GIB, device_total_bytes=80 * GIB))
    return out


@pytest.fixture
def store(any_url):
    s = Store.open(any_url)
    engine = AlertEngine.from_config(None)
    changes = engine.feed(_samples())
    stored.write(s, engine.verdicts.take())
    sink = StoreSink(s)
    for change in changes:
        sink.write(change)
    yield s
    s.close()


def test_the_alert_and_every_page_name_the_process_the_engine_chose(store):
    # the two keys disagree on these rows: pid 2 has the soonest time to OOM, pid 1 none
    rows = {v.pid: v for v in stored.latest(store, 0, None, END)}
    assert (rows[1].risk_level, rows[1].time_to_oom_s) == ("warning", None)
    assert rows[2].risk_level == "warning" and rows[2].time_to_oom_s == pytest.approx(1171.67,
                                                                                      abs=0.01)
    assert rows[1].headroom_bytes == int(2.5 * GIB)
    # the engine's choice, stored: pid 1 leads the risk, pid 2 the leak
    assert stored.device_answer(store, 0, None, END) == DeviceVerdict(
        T0 + 1740.5, 0, None, "warning", 1, 2)
    fired = {a["rule"]: a["message"] for a in store.alerts(device=0, limit=10)}
    assert fired["oom_risk"].startswith("OOM risk warning [pid 1]: headroom 3.1 %")

    client = create_app(parse_config({}, None), store, clock=FakeClock(END)).test_client()
    risk = client.get(f"/api/v1/figures/risk?device=0&start={T0}&end={END}").get_json()
    assert (risk["now"]["pid"], risk["now"]["level"], risk["now"]["headroom_bytes"]) == (
        1, "warning", int(2.5 * GIB))
    assert {p["pid"]: p["leads"] for p in risk["processes"]} == {1: ["risk"], 2: ["leak"]}
    leaks = client.get(f"/api/v1/figures/leaks?device=0&start={T0}&end={END}").get_json()
    assert (leaks["result"]["pid"], leaks["result"]["state"]) == (2, "leak")
    # the floor drawn is the one pid 2's detector judged on, as its rows carry it
    judged = stored.judged_floor(store, 0, None, 2, T0, END)
    trace = leaks["figure"]["data"][0]
    assert len(judged) > 20 and leaks["floor_points"] == len(judged)
    assert trace["y"] == [b / GIB for _, b in judged]
    assert judged != stored.judged_floor(store, 0, None, 1, T0, END)
    fleet = client.get("/api/v1/fleet").get_json()["devices"]
    assert [(d["level"], d["risk_process"], d["leak_process"]) for d in fleet] == [
        ("warning", "unknown (pid 1)", "unknown (pid 2)")]


def test_without_a_stored_choice_one_process_leads_and_several_do_not(store):
    """A window before the device's first stored answer (a store written before migration
    0014): a lone running process leads (nothing to choose), two lead nothing."""
    first = stored.device_answer(store, 0, None, T0 + 1e9)
    assert first is not None
    with store.engine.begin() as c:
        from vramscope.agent.store.schema import device_verdicts
        c.execute(device_verdicts.delete())
    procs = stored.processes(store, 0, None, END)
    assert [(p["pid"], p["leads"]) for p in procs] == [(1, []), (2, [])]
    assert stored.leading(procs, "risk") is None
    only = stored.mark_leads([{**procs[0], "ended": False}, {**procs[1], "ended": True}], None)
    assert [p["leads"] for p in only] == [["risk", "leak"], []]


def test_the_timeline_draws_the_floor_the_engine_judged_on(tmp_path):
    """The Timeline's floor is the leak detector's of the process the engine stored as leading
    the leak question (pid 2), point for point as the detector made them, the same the Leaks
    page draws; never one drawn from the series (pid 1's flat 77.5 GiB is the device's
    allocated peak, pid 2's rise its minimum)."""
    s = Store.open(f"sqlite:///{tmp_path}/vramscope.db")
    engine = AlertEngine.from_config(None)
    engine.feed(_samples())
    made = [p for v in engine.verdicts.history if v.pid == 2 for p in v.leak_floor]
    stored.write(s, engine.verdicts.take())
    client = create_app(parse_config({}, None), s, clock=FakeClock(END)).test_client()
    start = T0 + 600.0
    doc = client.get(f"/api/v1/timeline?device=0&start={start}&end={END}").get_json()
    want = [[t, b] for t, b in made if start <= t <= END]
    # pid 2's floor a minute: its first sample of each minute (it only rises), from minute 10
    # to the points its newest row carries (the last minutes' come with its next row)
    assert want == [[T0 + 0.5 + 60 * m, 40 * GIB + 60 * m * 15 * MIB] for m in range(10, 25)]
    assert doc["floor"] == {"pid": 2, "process": "unknown (pid 2)", "points": want}
    fig = client.get(f"/api/v1/figures/timeline?device=0&start={start}&end={END}").get_json()
    (floor,) = [t for t in fig["data"] if "floor" in t["name"]]
    # two processes on the device: the legend says whose floor it is
    assert floor["name"] == "idle floor (the leak detector's) · unknown (pid 2)"
    assert floor["x"] == [t * 1000 for t, _ in want]
    assert floor["y"] == [b / GIB for _, b in want]
    leaks = client.get(f"/api/v1/figures/leaks?device=0&start={start}&end={END}").get_json()
    assert leaks["figure"]["data"][0]["y"] == floor["y"]
    s.close()


def test_a_process_whose_records_lag_does_not_take_the_device_s_answer_back_in_time(any_url):
    """pid 2's records come 5 minutes after pid 1's of the same moment (two clients sending at
    their own pace). By pid 1's clock pid 2 looks gone, and the answer is made without it; its
    late records bring it back, and the answer that names it again is the device's newest row,
    not one stamped with its records' older time behind the answer it replaces."""
    lag_s = 300.0
    arrival = sorted(_samples(), key=lambda s: s.ts_s + (lag_s if s.pid == 2 else 0.0))
    engine = AlertEngine.from_config(None)
    for i in range(0, len(arrival), 50):
        engine.feed(arrival[i:i + 50])
    rows = engine.verdicts.device_history
    assert [r.ts_s for r in rows] == sorted(r.ts_s for r in rows)
    assert {r.leak_pid for r in rows} >= {2}
    with Store.open(any_url) as s:
        stored.write(s, engine.verdicts.take())
        answer = stored.device_answer(s, 0, None, END + lag_s)
        assert answer is not None
        assert (answer.risk_pid, answer.leak_pid) == (1, 2)


def test_a_window_s_leak_is_the_one_that_ran_in_it_though_its_process_exited(any_url):
    """pid 2, the leak, exits (``process_exit``) at END; pid 1 runs 10 minutes more. At the
    window's end the engine's stored answer names no leak (pid 1's is not one), but the window
    saw pid 2 leak: the Leaks page, the Timeline's floor and ``analyze --db`` speak for pid 2,
    ended; a window that starts after it exited does not."""
    after = [Sample(END + 0.5 + i, 0, Phase.DECODE, "torch", 1,
                    allocated_bytes=int(77.5 * GIB), reserved_bytes=78 * GIB,
                    device_total_bytes=80 * GIB) for i in range(600)]
    engine = AlertEngine.from_config(None)
    engine.feed([*_samples(), Event(END + 0.25, EXIT_EVENT, 0, 2), *after])
    last = END + 600.0
    with Store.open(any_url) as s:
        stored.write(s, engine.verdicts.take())
        answer = stored.device_answer(s, 0, None, last)
        assert answer is not None and answer.leak_pid != 2
        procs = stored.processes(s, 0, None, last)
        ended = {p["pid"]: (p["ended"], p["leak"]["state"]) for p in procs}
        assert ended[2] == (True, "leak") and ended[1][0] is False
        assert stored.leading(procs, "leak")["leak"]["state"] != "leak"
        lead = stored.window_leak_lead(procs, T0)
        assert (lead["pid"], lead["ended"]) == (2, True)
        assert stored.window_leak_lead(procs, END + 60.0) is stored.leading(procs, "leak")

        client = create_app(parse_config({}, None), s, clock=FakeClock(last)).test_client()
        leaks = client.get(f"/api/v1/figures/leaks?device=0&start={T0}&end={last}").get_json()
        r = leaks["result"]
        assert (r["pid"], r["state"], r["ended"], r["time_to_oom_s"]) == (2, "leak", True, None)
        assert leaks["floor_points"] == len(stored.judged_floor(s, 0, None, 2, T0, last)) > 20
        later = client.get(
            f"/api/v1/figures/leaks?device=0&start={END + 60}&end={last}").get_json()
        assert later["result"]["pid"] != 2
        timeline = client.get(f"/api/v1/timeline?device=0&start={T0}&end={last}").get_json()
        assert timeline["floor"]["pid"] == 2
        doc = {"devices": {"0": {}}}
        window_verdicts.attach_stored(doc, s, 0, None, T0, last)
        assert (doc["devices"]["0"]["leak"]["pid"], doc["devices"]["0"]["leak"]["state"]) == (
            2, "leak")
