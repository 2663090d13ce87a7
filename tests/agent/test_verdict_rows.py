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
