"""One answer: two server processes on one device through a real agent, and every surface
(the live agent's stored verdicts, ``analyze FILE``, ``analyze --db``, ``/api/v1/analysis``,
the Leaks and OOM-risk views, ``/metrics``) gives the same verdicts, slopes and first
detections for windows of 15 min, 1 h and 24 h, and names the leaking process and only it.

The clients are real processes with the hooks' socket client; they send three hours of
allocator samples (timed in the last three hours, as fast as they can: the agent's clock is not
ours to fake). Server A leaks 64 MiB a request from 40 min on; server B fills its cache for
15 min, then stays flat (a warm-up plateau, no leak)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
from vramscope.agent.cli import main
from vramscope.agent.config import parse_config
from vramscope.agent.store import Store
from vramscope.agent.store import verdicts as stored
from vramscope.dashboard.app import create_app

from tests.support.waiting import wait_for
from tools.agent_process import REPO_ROOT, AgentProcess

SPAN_S = 3 * 3600.0
STEP_S = 2.0
CLIENT = textwrap.dedent("""
    import sys, time
    from vramscope.agent.records import Phase, Sample
    from vramscope.hooks.client import SocketSink
    path, name, t0 = sys.argv[1], sys.argv[2], float(sys.argv[3])
    GIB, MIB = 2**30, 2**20
    sink = SocketSink(path, process=name, devices=(0,), buffer_records=200_000)
    n = int(3 * 3600 / 2)
    for i in range(n):
        t = t0 + 2.0 * i
        busy = (i % 30) >= 10  # 20 s idle, then 40 s of a request, each minute
        if name == "leaky":  # a per-request leak from 40 min on: 64 MiB a request
            floor = 10 * GIB + 64 * MIB * max(0, (i - 1200) // 30 + 1) * (i >= 1200)
        else:  # its cache fills for 15 min, then it is flat
            floor = 12 * GIB + min(i, 450) * 4 * MIB
        sink.put(Sample(t, 0, Phase.DECODE if busy else Phase.IDLE, "torch",
                        allocated_bytes=floor + (2 * GIB if busy else 0),
                        reserved_bytes=floor + 3 * GIB, device_total_bytes=80 * GIB))
        if i % 2000 == 0:
            time.sleep(0.05)  # let the socket drain: the sink drops what its buffer cannot hold
    sink.close(timeout_s=30.0)
    print(sink.sent_total, sink.dropped_total)
""")
WINDOWS_S = (900.0, 3600.0, 86_400.0)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def recorded(request, tmp_path):
    """(db url, the two client pids (leaky, healthy), the newest sample's time)."""
    root = tempfile.mkdtemp(prefix="vs-one-", dir="/tmp")  # short: AF_UNIX paths
    url = (f"sqlite:///{root}/vramscope.db" if request.param == "sqlite"
           else request.getfixturevalue("postgres_url"))
    agent = AgentProcess(url, f"{root}/run/agent.sock", log_path=f"{root}/agent.log").start()
    t0 = math.floor((time.time() - SPAN_S - 60.0) / 3600.0) * 3600.0  # the same bins each run
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        procs = [subprocess.Popen([sys.executable, "-c", CLIENT, agent.socket_path, name,
                                   str(t0)], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                  text=True) for name in ("leaky", "healthy")]
        n = int(SPAN_S / STEP_S)
        assert [p.communicate(timeout=240)[0].split() for p in procs] == [[str(n), "0"]] * 2
        with Store.open(url) as store:
            # every sample stored, as rows or already in the compact raw tier (the leader
            # compacts the recording's closed ten-minute intervals as they arrive)
            wait_for(lambda: len(store.samples()) == 2 * n, timeout_s=120, poll_s=0.5)
    finally:
        agent.stop()
    yield url, (procs[0].pid, procs[1].pid), t0 + (n - 1) * STEP_S
    shutil.rmtree(root, ignore_errors=True)


def _run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _answer(v: dict) -> tuple:
    """What must be equal everywhere: the leak state, slope and first detection, the risk."""
    return (v["pid"], v["leak"]["state"], v["leak"]["slope_bytes_per_s"],
            v["leak"]["first_detected_ts"], v["risk"]["level"])


def test_every_surface_gives_the_live_agent_s_answer(recorded, tmp_path, capsys):
    url, (leaky, healthy), last_s = recorded
    with Store.open(url) as store:
        live = {v.pid: v for v in stored.latest(store, 0, None, last_s)}
    assert set(live) == {leaky, healthy}
    assert live[leaky].leak_state == "leak"
    # the plateau is a warm-up, not a leak
    assert live[healthy].leak_state == "no_leak", live[healthy].leak_evidence
    # 64 MiB a minute: the slope, and the first detection within 2 h of the onset
    assert live[leaky].leak_slope_bytes_per_s == pytest.approx(64 * 2**20 / 60, rel=0.02)
    onset = last_s - (SPAN_S - STEP_S) + 1200 * STEP_S
    assert onset < live[leaky].leak_first_detected_ts_s < onset + 7200
    expected = sorted(_answer(v.to_json()) for v in live.values())
    # the windows the leaking process's detector chose from its records, kept in its rows:
    # every surface shows these (samples every 2 s; no request events and no prefill phase,
    # so no cycle seen: the bounds, a minute each)
    windows = live[leaky].leak_windows._asdict() if live[leaky].leak_windows else None
    assert windows == {"floor_s": 60.0, "trend_s": 60.0, "warmup_s": 300.0, "dt_s": 2.0,
                       "cycle_s": None, "cycle_from": "none"}
    windows_doc = live[leaky].to_json()["leak"]["windows"]

    # analyze FILE: the exported recording through the same engine
    trace = tmp_path / "recording.jsonl"
    assert main(["export", "--db", url, "--output", str(trace)]) == 0
    capsys.readouterr()
    doc = _run_json(["analyze", str(trace), "--json"], capsys)
    assert sorted(_answer(v) for v in doc["devices"]["0"]["processes"]) == expected
    assert doc["devices"]["0"]["leak"]["windows"] == windows_doc
    # analyze --db: the stored verdicts
    doc = _run_json(["analyze", "--db", url, "--json"], capsys)
    assert doc["verdicts_from"] == "store"
    assert sorted(_answer(v) for v in doc["devices"]["0"]["processes"]) == expected
    assert doc["devices"]["0"]["leak"]["pid"] == leaky
    assert doc["devices"]["0"]["leak"]["windows"] == windows_doc
    # status: the agent is stopped; the stored verdicts are what it knows
    assert main(["status", "--db", url, "--socket", str(tmp_path / "none.sock")]) == 1
    said = capsys.readouterr().out
    slope_mib_h = live[leaky].leak_slope_bytes_per_s * 3600 / 2**20
    assert f"GPU 0 pid {leaky} (leaky): LEAK {slope_mib_h:.1f} MiB/h (" in said
    assert f"GPU 0 pid {healthy} (healthy): no leak; OOM risk" in said

    with Store.open(url) as store:
        client = create_app(parse_config({}, None), store).test_client()
        for width in WINDOWS_S:
            q = f"device=0&start={last_s - width}&end={last_s}"
            leaks = client.get(f"/api/v1/figures/leaks?{q}").get_json()
            risk = client.get(f"/api/v1/figures/risk?{q}").get_json()
            analysis = client.get(f"/api/v1/analysis?{q}").get_json()
            for procs in (leaks["processes"], risk["processes"],
                          analysis["devices"]["0"]["processes"]):
                assert sorted(_answer(v) for v in procs) == expected, width
            r = leaks["result"]
            assert (r["pid"], r["state"], r["slope_bytes_per_s"], r["first_detected_ts_s"]) == (
                leaky, "leak", live[leaky].leak_slope_bytes_per_s,
                live[leaky].leak_first_detected_ts_s)
            assert [p["pid"] for p in leaks["processes"] if p["leak"]["state"] == "leak"] == [
                leaky]
            assert analysis["devices"]["0"]["leak"]["pid"] == leaky
            assert analysis["devices"]["0"]["leak"]["windows"] == windows_doc, width
        metrics = client.get("/metrics").get_data(as_text=True)
    assert 'vramscope_process_leak_state{device="0",host=' in metrics
    leak_lines = sorted(line for line in metrics.splitlines()
                        if line.startswith("vramscope_process_leak_state{"))
    state = {line.split('pid="')[1].split('"')[0]: line.rsplit(" ", 1)[1] for line in leak_lines}
    assert state == {str(healthy): "0.0", str(leaky): "1.0"}
    assert any(f'pid="{leaky}",process="leaky"' in line and line.endswith(" 1.0")
               for line in leak_lines)


def _server(pid: int, leak: bool, t0: float = 1_800_000_000.0) -> list:
    from vramscope.agent.records import Phase, Sample

    gib, mib = 2**30, 2**20
    out = []
    for i in range(int(SPAN_S / STEP_S)):
        busy = (i % 30) >= 10
        floor = (10 * gib + 64 * mib * max(0, (i - 1200) // 30 + 1) if leak and i >= 1200
                 else 12 * gib + min(i, 450) * 4 * mib)
        out.append(Sample(t0 + STEP_S * i, 0, Phase.DECODE if busy else Phase.IDLE, "torch",
                          pid, allocated_bytes=floor + (2 * gib if busy else 0),
                          reserved_bytes=floor + 3 * gib, device_total_bytes=80 * gib))
    return out


def test_a_process_s_verdicts_do_not_depend_on_when_its_records_arrive():
    """The live agent gets each client's records in order, but two clients' records
    interleave as they arrive (one may lag the other by minutes of record time); a trace
    file is sorted. Each process's verdict rows are the same either way: a process that looks
    silent for a while because its records come late goes on where it was: it may get a row
    that says it ended (silence is all the engine has to go by), and the rows after it are its
    answers as before."""
    from vramscope.agent.alerts.engine import AlertEngine

    a, b = _server(101, leak=True), _server(202, leak=False)
    in_order = AlertEngine.from_config(None)
    in_order.feed(sorted(a + b, key=lambda s: s.ts_s))
    one_then_other = AlertEngine.from_config(None)
    # b's records lag a's by a batch of 1,000 (2,000 s of record time): at each of a's batches
    # b looks silent for over five minutes
    for chunk in range(0, len(a) + 1000, 1000):
        one_then_other.feed_batch(a[chunk:chunk + 1000], [])
        one_then_other.feed_batch(b[max(0, chunk - 1000):chunk], [])

    def rows(engine: AlertEngine, pid: int) -> list:
        return [v for v in engine.verdicts.history if v.pid == pid and not v.ended]

    for pid in (101, 202):
        assert rows(in_order, pid) == rows(one_then_other, pid)
    assert not any(v.ended for v in in_order.verdicts.history)  # neither was silent in order
    lagged = [v for v in one_then_other.verdicts.history if v.ended]
    assert lagged and {v.pid for v in lagged} == {202}  # b's records came 2,000 s late
    last = {pid: rows(in_order, pid)[-1] for pid in (101, 202)}
    assert (last[101].leak_state, last[202].leak_state) == ("leak", "no_leak")


def test_the_h200_recording_s_surfaces_give_the_committed_answer():
    """docs/gpu-verification.md section 15 comes from this JSON: the H200 run's database,
    read again by every surface now, still gives it (and one answer everywhere)."""
    from pathlib import Path

    from tests.gpu.one_answer_check import check

    runs = REPO_ROOT / "docs" / "gpu-runs" / "2026-12-04b"
    committed = json.loads((runs / "one_answer.json").read_text())
    got = json.loads(json.dumps(check(Path(runs / "gpu_agent_pair.db.gz"))))
    assert got == committed
    assert got["same_everywhere"] is True
    assert [a[:2] for a in got["live"]] == [[559, "insufficient_data"],
                                             [560, "insufficient_data"]]


def test_the_h200_continuous_batching_pair_names_the_leaking_pid_with_the_defaults():
    """docs/gpu-verification.md section 16: the agent with its default settings, two
    continuous-batching servers on one H200, one losing KV blocks; every surface, read again
    now, names the leaking pid (577) by its orphaned blocks and only it."""
    from pathlib import Path

    from tests.gpu.one_answer_check import check

    runs = REPO_ROOT / "docs" / "gpu-runs" / "2026-12-04d"
    committed = json.loads((runs / "one_answer.json").read_text())
    got = json.loads(json.dumps(check(Path(runs / "gpu_cb_pair.db.gz"), "")))
    assert got == committed and got["same_everywhere"] is True
    assert got["live"] == [[577, "leak", 0.0, 1796417128.085973, "ok"],
                           [578, "insufficient_data", 0.0, None, "ok"]]
    leak = json.loads((runs / "cb-leak.json").read_text())
    assert (leak["pid"], leak["leaked_requests"], leak["leaked_blocks"]) == (577, 37, 381)
    assert 0 < got["live"][0][3] - leak["first_leak_ts"] < 1.0  # found at the first loss


def test_a_damaged_verdict_row_is_no_answer_and_breaks_no_surface(any_url):
    """A row whose document is not a verdict (a damaged file, a hand edit) is skipped: the
    other process's answer stands, the damaged one's process has none, every surface answers."""
    from sqlalchemy import insert
    from vramscope.agent.alerts.verdicts import Verdict
    from vramscope.agent.store.schema import verdicts

    store = Store.open(any_url, host_name="h")
    try:
        good = Verdict(1000.0, 0, None, 7, "leak", 50.0, 900.0, 950.0, 100.0, "scripted", "ok",
                       None, (), 10**9, None, None, None, None, None)
        stored.write(store, [good])
        did = store.device_id(0)
        with store.engine.begin() as c:
            c.execute(insert(verdicts), [
                {"device_id": did, "pid": 8, "ts_s": 1000.0, "leak_state": "leak",
                 "risk_level": "ok", "doc": "{not json"},
                {"device_id": did, "pid": 9, "ts_s": 1000.0, "leak_state": "leak",
                 "risk_level": "ok", "doc": '{"format": "vramscope.verdict/1"}'}])
        assert stored.latest(store, 0, None, 2000.0) == [good]
        client = create_app(parse_config({}, None), store).test_client()
        for route in ("figures/leaks", "figures/risk", "analysis"):
            r = client.get(f"/api/v1/{route}?device=0&start=0&end=2000")
            assert r.status_code == 200, route
        leaks = client.get("/api/v1/figures/leaks?device=0&start=0&end=2000").get_json()
        assert [p["pid"] for p in leaks["processes"]] == [7]
        assert client.get("/metrics").status_code == 200
    finally:
        store.close()


def test_the_h200_slow_leak_on_a_never_idle_server_is_found_with_the_defaults():
    """docs/gpu-verification.md section 17 (issue 30's GPU check): the agent with its default
    settings beside two never-idle continuous-batching servers on one H200, one keeping 2 MiB
    every 6 s. The stored verdicts name the leaking pid 21.5 min after its start at its slope,
    say "no leak" of the healthy one, and no OOM-risk alert fired; every surface, read again
    now, gives the committed answers."""
    from pathlib import Path

    from tests.gpu.one_answer_check import check

    runs = REPO_ROOT / "docs" / "gpu-runs" / "2026-12-05"
    committed = json.loads((runs / "one_answer.json").read_text())
    got = json.loads(json.dumps(check(Path(runs / "gpu_cb_pair.db.gz"), "")))
    assert got == committed
    leak = json.loads((runs / "cb-leak.json").read_text())
    healthy = json.loads((runs / "cb-healthy.json").read_text())
    assert (leak["pid"], healthy["pid"], leak["kept_tensors"], healthy["kept_tensors"]) == (
        453, 454, 230, 0)
    truth = 229 * 2**21 / (leak["last_kept_ts"] - leak["first_kept_ts"])
    assert round(truth) == 345_859  # bytes/s: 0.83 % of the H200 an hour
    [(pid, state, slope, first, risk), healthy_now] = got["live"]
    assert (pid, state, risk) == (453, "leak", "ok")
    assert round(first - leak["t0"]) == 1288  # 5 min warm-up + 15 min of floor, then a verdict
    assert 1.0 < slope / truth < 1.005
    # the only alert: the leak, of pid 453; no OOM-risk alert at all
    assert [(a[0], a[1]) for a in got["alerts"]] == [("memory_leak", "warning")]
    assert got["alerts"][0][4].endswith("[pid 453]")
    assert {h[4] for h in got["history"]} == {"ok"}
    # the healthy server: "no leak" once its floor had the span, then (as the agent ran at
    # commit 00ebf52) its shutdown read as a reload; analyze with today's engine keeps no_leak
    said = [h[2] for h in got["history"] if h[0] == 454]
    assert said[-2:] == ["no_leak", "insufficient_data"] and "leak" not in said
    assert healthy_now == [454, "insufficient_data", 0.0, None, "ok"]
    assert got["surfaces"]["analyze FILE (the store's export)"][1] == [
        454, "no_leak", 0.0, None, "ok"]


@pytest.mark.parametrize("run, leaking, healthy, kept, truth_bps, found_after_s", [
    ("2026-12-05b", 462, 463, 230, 345_353, 1305),  # section 18: commit 56462e8
    ("2026-12-05c", 584, 585, 218, 344_638, 1311),  # section 19: the quickening-rise forecast
])
def test_the_h200_slow_leak_again_with_todays_agent_gives_one_answer_everywhere(
        run, leaking, healthy, kept, truth_bps, found_after_s):
    """docs/gpu-verification.md sections 18 and 19: the recording of section 17 made again with
    the agent of commit 56462e8 (a shutdown keeps its last answer; the leak rate of
    leaks.leak_rate), then with that of c7689c5 (the OOM forecast of a quickening rise). Every
    surface, the stored rows included, names the leaking pid at its rate and says "no leak" of
    the healthy one; the only alert is the leak's, and every stored risk level is ok."""
    from pathlib import Path

    from tests.gpu.one_answer_check import check

    runs = REPO_ROOT / "docs" / "gpu-runs" / run
    committed = json.loads((runs / "one_answer.json").read_text())
    got = json.loads(json.dumps(check(Path(runs / "gpu_cb_pair.db.gz"), "")))
    assert got == committed
    assert got["same_everywhere"] is True
    leak = json.loads((runs / "cb-leak.json").read_text())
    assert (leak["pid"], leak["kept_tensors"]) == (leaking, kept)
    truth = (kept - 1) * 2**21 / (leak["last_kept_ts"] - leak["first_kept_ts"])
    assert round(truth) == truth_bps
    [(pid, state, slope, first, risk), healthy_now] = got["live"]
    assert (pid, state, risk) == (leaking, "leak", "ok")
    assert round(first - leak["t0"]) == found_after_s
    assert 0.99 < slope / truth < 0.995
    assert healthy_now == [healthy, "no_leak", 0.0, None, "ok"]
    assert [(a[0], a[1]) for a in got["alerts"]] == [("memory_leak", "warning")]
    assert got["alerts"][0][4].endswith(f"[pid {leaking}]")
    assert {h[4] for h in got["history"]} == {"ok"}
    assert {tuple(row) for rows in got["surfaces"].values() for row in rows} == {
        tuple(got["live"][0]), tuple(healthy_now)}
