"""The alert engine on scripted records: for, clear, clear_for, devices, OOMs, identity."""

import pytest
from vramscope.agent.alerts.engine import AlertChange, AlertEngine
from vramscope.agent.alerts.offline import analyze_records
from vramscope.agent.alerts.rules import Rule
from vramscope.agent.config import parse_config
from vramscope.agent.records import Event, Phase, Sample


def S(ts, reserved, device=0):
    return Sample(float(ts), device, Phase.DECODE, "t", reserved_bytes=reserved)


RULE = Rule("reserved_high", "reserved_bytes", ">", 100, for_s=10, clear=80, clear_for_s=5,
            severity="critical", labels={"team": "a"}, message="reserved high")


def changes(engine, records):
    return [(c.kind, c.rule, c.device, c.ts_s, c.value) for c in engine.feed(records)]


def test_for_clear_and_clear_for():
    e = AlertEngine([RULE])
    values = {0: 50, 1: 120, 5: 90, 6: 130, 15: 130, 16: 130, 20: 90, 22: 70, 26: 75, 27: 60}
    got = changes(e, [S(t, v) for t, v in values.items()])
    # breach at 1, broken at 5 (90 is not > 100); breach again at 6, held 10 s -> fires at 16.
    # 90 at 20 is inside the band (not <= 80); 70 at 22 starts clearing; held 5 s -> 27
    assert got == [("fired", "reserved_high", 0, 16.0, 130), ("resolved", "reserved_high", 0,
                                                              27.0, 60)]


def test_change_records_carry_the_rule():
    e = AlertEngine([RULE.__class__("r", "reserved_bytes", ">", 1, severity="info",
                                    labels={"k": "v"}, message="m")])
    [c] = e.feed([Sample(5.0, 2, reserved_bytes=3, host="h1")])
    assert c == AlertChange("fired", "r", "info", 2, 5.0, 3, "m: 0.0 MiB", {"k": "v"}, 5.0, "h1")
    assert c.to_json() == {"format": "vramscope.alert/1", "kind": "fired", "rule": "r",
                           "severity": "info", "device": 2, "host": "h1", "ts": 5.0,
                           "fired_ts": 5.0, "value": 3, "message": "m: 0.0 MiB",
                           "labels": {"k": "v"}}


def test_rules_are_per_device_and_a_device_filter_applies():
    only1 = Rule("only1", "reserved_bytes", ">", 10, device=1)
    e = AlertEngine([only1, Rule("any", "reserved_bytes", ">", 10)])
    got = changes(e, [S(0, 20, device=0), S(1, 20, device=1)])
    assert got == [("fired", "any", 0, 0.0, 20), ("fired", "only1", 1, 1.0, 20),
                   ("fired", "any", 1, 1.0, 20)]
    assert sorted(e.active()) == [("any", 0, 0.0), ("any", 1, 1.0), ("only1", 1, 1.0)]


def test_incremental_feeding_equals_one_batch():
    rule = Rule("r", "reserved_bytes", ">", 100, clear=70, clear_for_s=2)
    records = [S(t, 50 + 10 * (t % 9)) for t in range(60)]
    whole = AlertEngine([rule]).feed(records)
    e = AlertEngine([rule])
    parts = [c for i in range(0, 60, 7) for c in e.feed(records[i:i + 7])]
    assert parts == whole
    # fires at 6 (110), 15, ...; cleared (<= 70) from 9 on, held 2 s: resolves at 11, 20, ...
    assert [(c.kind, c.ts_s) for c in whole[:4]] == [("fired", 6.0), ("resolved", 11.0),
                                                      ("fired", 15.0), ("resolved", 20.0)]


def test_an_oom_event_fires_the_builtin_oom_alert_for_five_minutes():
    e = AlertEngine.from_config(None)
    recs = [Sample(0.0, 0, allocated_bytes=1), Event(10.0, "oom", data={"message": "x"}),
            Sample(200.0, 0, allocated_bytes=1), Sample(311.0, 0, allocated_bytes=1)]
    got = [(c.kind, c.rule, c.ts_s) for c in e.feed(recs)]
    assert got == [("fired", "oom", 10.0), ("resolved", "oom", 311.0)]


def test_a_rise_of_num_ooms_counts_as_an_oom_once():
    e = AlertEngine.from_config(None)
    recs = [Sample(0.0, 0, num_ooms=0), Event(5.0, "oom"), Sample(5.2, 0, num_ooms=1)]
    e.feed(recs)
    assert e.devices[0].oom_ts_s == [5.0]


def test_user_rules_from_the_config_run_in_analyze_too():
    cfg = parse_config({"alerts": {"rules": [
        {"name": "big", "metric": "allocated_bytes", "threshold": 5, "severity": "critical"}]}},
        None, {})
    samples = [Sample(float(t), 0, allocated_bytes=t) for t in range(10)]
    doc = analyze_records(samples, [], cfg)
    assert doc["alerts"] == [{"rule": "big", "severity": "critical", "device": 0,
                              "fired_ts": 6.0, "resolved_ts": None}]


def test_a_risk_alert_says_why_and_what_to_try():
    e = AlertEngine.from_config(None)
    gib = 2**30
    [fired, critical] = e.feed([Sample(0.0, 0, Phase.DECODE, allocated_bytes=79 * gib,
                                       device_total_bytes=80 * gib)])
    assert fired.rule == "oom_risk"
    # the one reason that fired, with its numbers; no prefill spike seen: the load itself
    assert fired.message == (
        "OOM risk critical: headroom 1.2 % of the 80.00 GiB limit; 1.00 GiB free now; "
        "likely batch; try: lower the maximum concurrency (max_num_seqs) or the batched tokens "
        "per step")
    assert critical.rule == "oom_risk_critical"


def test_live_batches_give_exactly_the_alerts_of_analyze():
    from tools.bench import labelled_recordings as scenarios

    sc = scenarios.growth_oom(5)
    offline = analyze_records(sc.samples, sc.events, None)["alerts"]
    engine, t = AlertEngine.from_config(None), sc.samples[0].ts_s
    while t <= sc.samples[-1].ts_s:  # as the agent's writer: a batch of samples, then events
        batch = [s for s in sc.samples if t <= s.ts_s < t + 7.5]
        batch += [e for e in sc.events if t <= e.ts_s < t + 7.5]
        engine.feed(batch)
        t += 7.5
    live = [(c.kind, c.rule, c.ts_s) for c in engine.history]
    assert [("fired", a["rule"], a["fired_ts"]) for a in offline] == [
        x for x in live if x[0] == "fired"]
    # the leak is named (a steady rise from the start is growth), the risk follows it, its
    # time to OOM goes critical; the OOM ends the risk episode: both risk alerts resolve at it
    assert [(k, r) for k, r, _ in live] == [
        ("fired", "memory_leak"), ("fired", "oom_risk"), ("fired", "oom_risk_critical"),
        ("resolved", "oom_risk"), ("resolved", "oom_risk_critical"), ("fired", "oom")]
    assert {ts for k, _, ts in live if k == "resolved"} == {sc.oom_ts}


def test_orphaned_kv_blocks_fire_the_leak_alert_once_their_rate_is_known():
    """The pool's checks report 4, 8, 12, 16 orphaned blocks a second apart: the verdict is a
    leak from the first; the alert fires at the fourth, when the checks give a rate (4 blocks
    a second, exactly: a straight line), and says it, with the pool's time to run out."""
    e = AlertEngine.from_config(None)
    checks = [Event(3.0 + i, "kv_orphaned_blocks", 0, 7,
                    data={"blocks": 4 * (i + 1), "block_ids": [7], "bytes_per_block": 1024})
              for i in range(4)]
    # the pool's sample after the third check: 12 of its 100 blocks held by the lost requests
    pool = Sample(5.5, 0, Phase.IDLE, "kv", 7, kv_blocks_used=12, kv_blocks_total=100)
    first = e.feed([Sample(0.0, 0, allocated_bytes=1), *checks[:3], pool])
    assert first == []
    assert e.devices[0].leaks[7].result.state == "leak"
    got = e.feed(checks[3:])
    assert [(c.kind, c.rule, c.ts_s) for c in got] == [("fired", "memory_leak", 6.0)]
    assert got[0].message == (
        "KV pool leaking blocks: 16 orphaned KV blocks (latest check); rising 4 blocks/s "
        "(4 blocks/s to 4 blocks/s, 90 %) = 14.1 MiB/h (14.1 MiB/h to 14.1 MiB/h); the pool's "
        "88 free blocks last about 22 s (22 s – 22 s) (leak) [pid 7]")
    assert e.devices[0].value("kv_orphaned_blocks", 6.0) == 16.0


def kv_samples(used_by_second):
    return [Sample(float(t), 0, Phase.DECODE, "kv", kv_blocks_used=u, kv_blocks_total=100)
            for t, u in enumerate(used_by_second)]


def fired_and_resolved(records, rule=None):
    got = [(c.kind, c.ts_s) for c in AlertEngine.from_config(None).feed(records)
           if rule is None or c.rule == rule]
    return got


KV_CASES = [
    # bursty, healthy: 10 blocks, a burst to 63 of 100 at 5 blocks/s, back down. The forecast
    # says "full in 40 s" for ten seconds; at 63 % that is no exhaustion: no alert (it fired)
    ("burst_to_63_percent", [10] * 10 + [10 + 5 * i for i in range(1, 11)] + [63] * 3
     + [63 - 5 * i for i in range(1, 11)] + [13] * 60, []),
    # a fill to the top at 3 blocks/s: 82 % at 33 s, held 5 s -> fires at 38; it stays while
    # the pool is full (the rate is 0 from 70 s on), and resolves 30 s after usage drops
    # below 80 % at 101 s (it resolved at 100 s, full, before)
    ("fill_to_full", [10] * 10 + [10 + 3 * i for i in range(1, 31)] + [100] * 61 + [20] * 60,
     [("fired", 38.0), ("resolved", 131.0)]),
    # two fills to the top a minute apart, each full for 10 s: 82 % at 17 s -> fires at 22,
    # resolves 30 s after the drop at 30 s; the second 70 s later
    ("two_fills", ([10] * 10 + [10 + 9 * i for i in range(1, 11)] + [100] * 10 + [10] * 40) * 2,
     [("fired", 22.0), ("resolved", 60.0), ("fired", 92.0), ("resolved", 130.0)]),
]


@pytest.mark.parametrize("name, used, expected", KV_CASES, ids=[c[0] for c in KV_CASES])
def test_kv_exhaustion_needs_a_nearly_full_pool_and_holds_while_it_is(name, used, expected):
    assert fired_and_resolved(kv_samples(used), "kv_exhaustion") == expected


def test_kv_exhaustion_min_usage_from_the_config():
    cfg = parse_config({"alerts": {"kv_exhaustion_min_usage_ratio": 0.5}}, None, {})
    used = KV_CASES[0][1]
    got = [(c.kind, c.ts_s) for c in AlertEngine.from_config(cfg).feed(kv_samples(used))]
    # half full at 17 s, held 5 s; below half from 25 s: resolved 30 s later (the gate, not
    # the forecast, holds it: it resolved at 58 s, 30 s after the forecast passed 60 s)
    assert got == [("fired", 22.0), ("resolved", 55.0)]


def risk_samples(allocated):
    """1 s decode samples on a 1000-byte limit (warning under 5 % headroom, critical under 2)."""
    return [Sample(float(t), 0, Phase.DECODE, "t", allocated_bytes=a, device_total_bytes=1000)
            for t, a in enumerate(allocated)]


HOLD = 1800  # an OOM-risk alert resolves after half an hour back at ok (rules.RISK_HOLD_S)

RISK_CASES = [
    # an unsteady load touching the warning level (960: 4 % headroom) for 10 s every 40 s:
    # no alert (it fired at 10 s, and again at 90 s, 130 s... once the minute of ok passed)
    ("unsteady_near_warning", ([900] * 30 + [960] * 10) * 5, []),
    # warning held: fires after 15 s at warning (at 25 s), resolves after half an hour at ok
    ("sustained_warning", [900] * 10 + [960] * 40 + [900] * (HOLD + 20),
     [("fired", "oom_risk", 25.0), ("resolved", "oom_risk", 50.0 + HOLD)]),
    # critical (990: 1 %) fires both at once
    ("sudden_critical", [900] * 10 + [990] * 5 + [900] * (HOLD + 20),
     [("fired", "oom_risk", 10.0), ("fired", "oom_risk_critical", 10.0),
      ("resolved", "oom_risk", 15.0 + HOLD), ("resolved", "oom_risk_critical", 15.0 + HOLD)]),
    # a tight server at warning for 30 s every 10 minutes, for two hours: one alert held (it
    # fired and resolved 12 times with a one-minute hold)
    ("tight_every_10_min", ([960] * 30 + [900] * 570) * 12,
     [("fired", "oom_risk", 15.0)]),
]


@pytest.mark.parametrize("name, allocated, expected", RISK_CASES, ids=[c[0] for c in RISK_CASES])
def test_risk_alerts_wait_for_a_steady_warning_but_not_for_critical(name, allocated, expected):
    got = [(c.kind, c.rule, c.ts_s) for c in AlertEngine.from_config(None).feed(
        risk_samples(allocated))]
    assert got == expected


def test_risk_for_s_from_the_config():
    cfg = parse_config({"alerts": {"risk_for_s": 0}}, None, {})
    allocated = [900] * 10 + [960] * 10 + [900] * (HOLD + 20)
    got = [(c.kind, c.rule, c.ts_s) for c in AlertEngine.from_config(cfg).feed(
        risk_samples(allocated))]
    assert got == [("fired", "oom_risk", 10.0), ("resolved", "oom_risk", 20.0 + HOLD)]
