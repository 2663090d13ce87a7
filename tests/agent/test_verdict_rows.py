"""When the alert engine writes a verdict row (agent/alerts/verdicts.py): on a change of the
answer, at the heartbeat, and as a pool keeps losing KV blocks: at once when their count
doubles, else at the device's first record ``ORPHAN_ROW_S`` after the process's last row (the
stored count follows the newest report within that, without a row per report)."""

from __future__ import annotations

from vramscope.agent.alerts.engine import AlertEngine
from vramscope.agent.alerts.verdicts import ORPHAN_ROW_S
from vramscope.agent.records import Event, Phase, Sample

GIB = 2**30
PID = 4242


def test_orphaned_blocks_are_rows_every_orphan_row_s_with_the_newest_count():
    engine = AlertEngine.from_config(None)
    t0 = 1_800_000_000.0
    records: list[Sample | Event] = [
        Sample(t0 + i, 0, Phase.DECODE, "torch", PID, allocated_bytes=10 * GIB,
               reserved_bytes=12 * GIB, device_total_bytes=80 * GIB) for i in range(0, 240, 2)]
    # a pool losing blocks, reported at each idle moment: 8, 9, ... 40 blocks in 4 minutes,
    # inside one heartbeat (5 min)
    records += [Event(t0 + 5 + 7 * k, "kv_orphaned_blocks", 0, PID, data={"blocks": 8 + k})
                for k in range(33)]
    records.sort(key=lambda r: r.ts_s)
    engine.feed(records)
    rows = [(v.ts_s - t0, v.leak_state, v.leak_kv.blocks if v.leak_kv else None,
             v.leak_evidence.split(" (latest")[0]) for v in engine.verdicts.history
            if v.pid == PID]
    assert rows[:2] == [
        (0.0, "insufficient_data", None, "not enough data yet: warming up (the first 5 min of "
         "a process are not its floor), then 15 min of idle floor"),
        (5.0, "leak", 8, "KV pool check: 8 orphaned KV blocks")]
    # then, while the count moves, a row at the first record ORPHAN_ROW_S after the last one
    # (a sample every 2 s), saying the newest report's count: never one row per report
    newest = [min(40, 8 + int((t - 5) // 7)) for t in range(16, 240, 10)]
    assert ORPHAN_ROW_S == 10.0
    assert rows[2:] == [(float(t), "leak", n, f"KV pool check: {n} orphaned KV blocks")
                        for t, n in zip(range(16, 240, 10), newest)]


def test_a_leak_rate_turning_rough_is_a_row_of_its_own():
    # the detector's answer scripted on a real engine: a leak on an exact floor, then the same
    # leak (same state, first detection, slope) read off a floor now mostly estimated
    engine = AlertEngine.from_config(None)
    t0 = 1_800_000_000.0
    engine.feed([Sample(t0, 0, Phase.DECODE, "torch", PID, allocated_bytes=10 * GIB,
                        device_total_bytes=80 * GIB)])
    d, log = engine.devices[0], engine.verdicts
    leak = d.leaks[PID]
    exact = leak.result._replace(detected=True, slope_bytes_per_s=1000.0,
                                 first_detected_ts_s=t0 + 10, enough_data=True)
    for ts, result in [(t0 + 10, exact), (t0 + 20, exact._replace(estimated_floor=True)),
                       (t0 + 30, exact._replace(estimated_floor=True))]:
        leak.result = result
        log.note(d, PID, None, ts)
    rows = [(v.ts_s - t0, v.leak_state, v.leak_estimated_floor) for v in log.history
            if v.pid == PID]
    assert rows[-2:] == [(10.0, "leak", False), (20.0, "leak", True)]  # none at 30: unchanged


def test_a_process_without_its_own_state_has_no_borrowed_verdict():
    """Issue 46: a process the engine holds no risk model for (here one that only reported
    its KV pool's orphaned blocks) has no risk answer, never the riskiest process's; a pid
    with no state at all gets no row (the device's own answer, pid None, is not lent)."""
    from vramscope.agent.alerts.verdicts import VerdictLog, verdict_of

    engine = AlertEngine.from_config(None)
    t0 = 1_800_000_000.0
    # pid 1: flat 2.5 GiB under its 80 GiB limit, an OOM-risk warning by its headroom
    records: list[Sample | Event] = [
        Sample(t0 + i, 0, Phase.DECODE, "torch", 1, allocated_bytes=int(77.5 * GIB),
               reserved_bytes=78 * GIB, device_total_bytes=80 * GIB) for i in range(120)]
    records.append(Event(t0 + 60.5, "kv_orphaned_blocks", 0, 9, data={"blocks": 12}))
    engine.feed(sorted(records, key=lambda r: r.ts_s))
    d = engine.devices[0]
    assert (d.risk_pid, d.risk.last.level, d.risk.headroom_bytes) == (1, "warning",
                                                                        int(2.5 * GIB))
    own = verdict_of(d, 9, None, t0 + 119)
    assert (own.pid, own.leak_state, own.leak_kv.blocks) == (9, "leak", 12)
    assert (own.risk_level, own.risk_cause, own.risk_reasons, own.headroom_bytes,
            own.time_to_oom_s) == ("", None, (), None, None)
    # no row for a process with no state of its own, whoever sent the record
    log = VerdictLog()
    log.note(d, 42, None, t0 + 119)
    log.note(d, None, None, t0 + 119)
    assert [v.pid for v in log.history] == [1]
    assert log.history[0].risk_level == "warning"


def test_the_rows_carry_each_floor_point_the_detector_made_once():
    """Each row carries the floor points its process's detector made since its previous row:
    together, a process's rows are its floor (here each minute's idle sample, two processes
    whose floors differ by 10 GiB), each point once, read back as stored."""
    from vramscope.agent.alerts.verdicts import verdict_from_json

    engine = AlertEngine.from_config(None)
    t0 = 1_800_000_000.0
    mib = 2**20
    records = []
    for k in range(90 * 4):  # 90 minutes, a sample every 15 s, each minute's first idle
        m, idle = k // 4, k % 4 == 0
        for pid, base in ((1, 20 * GIB), (2, 30 * GIB)):
            floor = base + m * 16 * mib
            records.append(Sample(t0 + 15 * k + pid * 0.1, 0,
                                  Phase.IDLE if idle else Phase.DECODE, "torch", pid,
                                  allocated_bytes=floor if idle else floor + GIB,
                                  device_total_bytes=80 * GIB))
    engine.feed(records)
    for pid, base in ((1, 20 * GIB), (2, 30 * GIB)):
        rows = [v for v in engine.verdicts.history if v.pid == pid]
        points = [p for v in rows for p in v.leak_floor]
        # a minute's point is made once its window closes (at the next minute's sample); the
        # points made after the newest row come with the next one
        floor = [(t0 + 60 * m + pid * 0.1, base + m * 16 * mib) for m in range(90)]
        made = sum(1 for t, _ in floor if t + 60 <= rows[-1].ts_s)
        assert points == floor[:len(points)] and len(points) >= made > 80
        assert all(verdict_from_json(v.to_json(stored=True)) == v for v in rows)
        assert "floor_points" not in rows[-1].to_json()["leak"]  # no document shows them
