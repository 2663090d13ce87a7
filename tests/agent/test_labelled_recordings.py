"""The scenario suite: deterministic, with the truth it claims, and the detectors right on it."""

import pytest
from vramscope.agent.alerts.engine import AlertEngine

from tools.bench import labelled_recordings as S
from tools.bench.detection import score


def fired(sc):
    return [(c.rule, c.ts_s - S.START_S) for c in
            AlertEngine.from_config(None).feed(sc.samples + sc.events) if c.kind == "fired"]


def test_same_seed_same_recording():
    a, b = S.growth_oom(3), S.growth_oom(3)
    assert a.samples == b.samples and a.events == b.events and a.oom_ts == b.oom_ts
    assert S.growth_oom(4).samples != a.samples


def test_growth_oom_runs_out_of_memory_where_it_says():
    sc = S.growth_oom(1)
    last = sc.samples[-1]
    assert last.ts_s == sc.oom_ts and last.num_ooms == 1
    assert [e.name for e in sc.events if e.name == "oom"] == ["oom"]
    assert sc.postmortems[0].ts_s == sc.oom_ts
    # floor +1.5 %/min from 30 % weights plus the KV cache: out of room within an hour
    assert 1200 < sc.duration_s < 3600


def test_frag_oom_fails_with_memory_free_but_no_block():
    sc = S.frag_oom(1)
    pm = sc.postmortems[0]
    assert pm.phase.value == "prefill"
    assert pm.largest_free_block_bytes < pm.failed_alloc_bytes
    assert pm.reserved_bytes - pm.allocated_bytes > pm.failed_alloc_bytes
    assert sc.samples[-1].num_alloc_retries > 0


@pytest.mark.parametrize("make", [S.growth_oom, S.frag_oom], ids=["growth", "frag"])
def test_every_oom_is_warned_at_least_30_s_ahead(make):
    sc = make(2)
    warnings = [ts for rule, ts in fired(sc) if rule == "oom_risk"]
    assert warnings and (sc.oom_ts - S.START_S) - warnings[0] >= 30


@pytest.mark.parametrize("sc", [S.steady(1, days=0.25), S.prealloc(1, days=0.25),
                                S.warmup(1, days=0.25)], ids=["steady", "prealloc", "warmup"])
def test_healthy_serving_raises_no_alert(sc):
    assert fired(sc) == []


def test_a_half_percent_per_hour_leak_is_found_within_two_hours_of_its_start():
    sc = S.leak(0.005, 1)
    leaks = [ts for rule, ts in fired(sc) if rule == "memory_leak"]
    assert leaks and 0 < leaks[0] - S.LEAK_START_S <= 7200
    assert [rule for rule, _ in fired(sc)] == ["memory_leak"]


def test_score_counts_what_it_claims():
    s = score([S.leak(0.01, 2), S.growth_oom(1), S.steady(2, days=0.1)])
    assert (s.leaks, s.detected, len(s.leads_s), s.false_alarms) == (1, 1, 1, 0)
    assert s.quiet_days == pytest.approx(0.1 + S.LEAK_START_S / 86400)
    assert s.leads_s[0] >= 30


def test_the_diurnal_load_is_kv_held_by_more_requests_and_shows_in_the_blocks_in_use():
    # the day's +8 % of the device is KV cache: at 0.40 of the device for 2000 blocks, +400
    # blocks at midday, and one more request per batch per 0.5 % of the device
    sc = S.diurnal(1, days=1.0)
    block = 0.40 * S.LIMIT_BYTES / S.KV_BLOCKS

    def trough(samples, f):
        return min(f(s) for s in samples)

    night = [s for s in sc.samples if s.ts_s - S.START_S < 3600]
    noon = [s for s in sc.samples if abs(s.ts_s - S.START_S - 43200) < 1800]
    # the batch's 2 % (100 blocks, 99 by truncation) at night; at 11:30-12:30 the load adds
    # at least 0.08 (1 + cos(2 pi / 48)) / 2 = 7.966 % of the device: 498 blocks
    assert (trough(night, lambda s: s.kv_blocks_used),
            trough(noon, lambda s: s.kv_blocks_used)) == (99, 498)
    # allocated memory less the blocks' bytes: the same at night as at noon (within a block)
    rest = [trough(part, lambda s: s.allocated_bytes - block * s.kv_blocks_used)
            for part in (night, noon)]
    assert abs(rest[1] - rest[0]) < block
    starts = {}
    for e in sc.events:
        if e.name == "request_start":
            starts[e.ts_s] = starts.get(e.ts_s, 0) + 1
    midday = [n for ts, n in starts.items() if abs(ts - S.START_S - 43200) < 1800]
    assert min(midday) >= 4 + 15  # randint(4, 16) plus int(0.08 * ~0.97 / 0.005) extra


def test_a_never_idle_diurnal_day_raises_no_alert_and_the_hard_figures_have_targets():
    from tools.bench.detection import _hard_figures

    sc = S.diurnal(2, days=1.0)
    assert fired(sc) == []
    figs = _hard_figures(score([sc, S.leak(0.01, 1, never_idle=True)]))
    assert [(f.metric, f.value, f.target, f.met) for f in figs] == [
        ("never idle: leaks >=0.5%/h found in 2 h", 100.0, ">= 90", True),
        ("never idle: false alarms per day", 0.0, "<= 0.143", True)]


@pytest.mark.parametrize("start_h, found_s", [(6.0, 22680.0), (18.0, 65820.0)])
def test_a_leak_on_a_diurnal_server_is_found_and_nothing_before_it(start_h, found_s):
    # 0.5 %/h from 6 h (the load rising) or 18 h (falling) into the day: the only alert is the
    # leak, 1,080 s and 1,020 s after it began (the floor is the residual after the KV blocks)
    sc = S.diurnal_leak(0.005, 1, start_h)
    assert fired(sc) == [("memory_leak", found_s)]
    assert sc.leak_start_ts - S.START_S == start_h * 3600
