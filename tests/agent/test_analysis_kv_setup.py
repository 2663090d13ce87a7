"""The KV summary per pool (issue 13: "47 blocks used of 45") and the setup phase in analysis."""

from __future__ import annotations

from vramscope.agent.alerts.offline import analyze_records
from vramscope.agent.analysis.floor import idle_floor
from vramscope.agent.analysis.kv import KvTracker
from vramscope.agent.analysis.phases import phase_stats
from vramscope.agent.records import Phase, Sample
from vramscope.agent.trace import record_from_json

G = 2**30


def kv(ts, used, total):
    return Sample(float(ts), 0, Phase.DECODE, "kv", kv_blocks_used=used, kv_blocks_total=total)


def shrinking_pools():
    """generate_batch sized each call's pool from what was left: 20,315 blocks, then 45."""
    return ([kv(t, u, 20_315) for t, u in ((0, 10), (1, 47), (2, 0))]
            + [kv(t, u, 45) for t, u in ((10, 5), (11, 40), (12, 0))])


def test_peak_and_total_come_from_one_pool():
    tracker = KvTracker()
    for s in shrinking_pools():
        tracker.observe(s)
    assert (tracker.peak_blocks_used, tracker.peak_blocks_total, tracker.pools) == (40, 45, 2)
    assert tracker.peak_usage_ratio == 40 / 45
    assert (tracker.blocks_total, tracker.pool_peak_blocks_used) == (45, 40)
    doc = analyze_records(shrinking_pools())["devices"]["0"]["kv"]
    assert doc == {"peak_blocks_used": 40, "blocks_total": 45, "peak_usage_ratio": 40 / 45,
                   "pools": 2}


def test_the_fuller_pool_wins_even_when_it_came_first():
    tracker = KvTracker()
    for s in [kv(0, 90, 100), kv(1, 10, 1_000), kv(2, 500, 1_000)]:
        tracker.observe(s)
    assert (tracker.peak_blocks_used, tracker.peak_blocks_total) == (90, 100)


def test_a_new_pool_starts_its_rate_over():
    tracker = KvTracker()
    for t in range(0, 20):
        tracker.observe(kv(t, 10 * t, 1_000))  # rising 10 blocks/s: exhaustion forecast
    assert tracker.exhaustion_s is not None
    tracker.observe(kv(21, 900, 950))  # a new pool: one sample is no rate
    assert tracker.exhaustion_s is None


def at(ts, phase, allocated, source="torch"):
    return Sample(float(ts), 0, phase, source, allocated_bytes=allocated)


def test_setup_is_not_the_idle_floor_and_has_its_own_peak():
    """The pool's allocation before the first step: 100 GiB "idle" before the setup phase."""
    samples = ([at(t, Phase.IDLE, G) for t in range(0, 50)]
               + [at(t, Phase.SETUP, 100 * G) for t in range(50, 70)]
               + [at(t, Phase.IDLE, 2 * G) for t in range(70, 121)])
    assert idle_floor(samples, window_s=60.0) == [(0.0, G), (70.0, 2 * G)]
    stats = phase_stats(samples)
    assert (stats["setup"].samples, stats["setup"].peak_allocated_bytes) == (20, 100 * G)
    assert stats["idle"].peak_allocated_bytes == 2 * G
    phases = analyze_records(samples)["devices"]["0"]["phases"]
    assert phases["setup"] == {"samples": 20, "peak_allocated_bytes": 100 * G}
    assert phases["idle"] == {"samples": 101, "peak_allocated_bytes": 2 * G}


def test_trace_import_accepts_setup():
    s = record_from_json({"ts": 1.0, "phase": "setup", "allocated_bytes": 5})
    e = record_from_json({"ts": 1.0, "event": "phase", "phase": "setup"})
    assert s.phase is Phase.SETUP and e.phase is Phase.SETUP
