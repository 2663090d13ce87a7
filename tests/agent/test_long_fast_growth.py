"""The long suite's fast group (issue 44): fast growth and a fast load ramp that end in an OOM,
their truth, and the scorers of time to name, OOM lead, flapping, the leak verdict's interval
and forecast, and ``no_leak`` after an onset, on scripted alert histories."""

import math

import pytest
from vramscope.agent.alerts.engine import AlertChange
from vramscope.agent.analysis.leaks import LeakResult
from vramscope.agent.records import Sample

from tools.bench import long_detection as ld
from tools.bench import long_suite as L
from tools.bench.labelled_recordings import START_S, Scenario

GIB = 2**30
H = 3600.0
LIMIT = 80 * GIB


def change(kind, rule, ts, message="", severity="warning"):
    return AlertChange(kind, rule, severity, 0, ts, 1.0, message, {}, ts)


def fast_trace(onset=1000.0, oom=4000.0, cause="growth", history=(), name="f"):
    samples = [Sample(0.0, 0, allocated_bytes=GIB, device_total_bytes=LIMIT)]
    sc = Scenario(name, "fast", 1, samples, [], oom, oom_ts=oom)
    sc.fast, sc.failure_onset_ts, sc.oom_cause = True, onset, cause
    sc.leak_start_ts = onset if cause == "growth" else None
    sc.leak_history = list(history)
    return sc


def verdict(low, high, ttoom=600.0, estimated=False):
    return LeakResult(True, 0.0, 0, None, None, "", None, None, estimated_floor=estimated,
                      rate_low_bytes_per_s=low, rate_high_bytes_per_s=high,
                      time_to_oom_s=ttoom)


# --- the traces --------------------------------------------------------------------------------
def test_fast_growth_begun_in_the_first_minutes_ends_in_an_oom_at_its_truth():
    spec = next(s for s in L.specs(quick=True)
                if s.name == "fast/growth/6min/early/per_request_kv-never_idle/640")
    assert spec.fast and spec.kind == "fast" and spec.failure.develop_s == 360.0
    sc = L.build(spec)
    onset = START_S + spec.failure.onset_s
    assert 150.0 <= spec.failure.onset_s <= 240.0  # once the process serves
    assert sc.leak_start_ts == sc.failure_onset_ts == onset
    assert (sc.kind, sc.oom_cause, sc.leak_shape, sc.fast) == ("fast", "growth", "growth", True)
    assert sc.oom_ts - onset == pytest.approx(365.32, abs=0.01)  # ~the 6 min it was built for
    assert [e.ts_s for e in sc.events if e.name == "oom"] == [sc.oom_ts]
    last = sc.samples[-1]
    assert (last.ts_s, last.num_ooms) == (sc.oom_ts, 1) and sc.postmortems
    # steady: the rate that fills the headroom in 6 min, a history point every sample
    assert sc.leak_rate_ratio_per_h == pytest.approx(5.897, abs=0.001)
    rate = sc.leak_rate_ratio_per_h * LIMIT / H
    assert [round(b - a, 6) for (a, _), (b, _) in zip(sc.leak_history, sc.leak_history[1:])] \
        == [2.0] * (len(sc.leak_history) - 1)
    assert all(b == pytest.approx(rate * (t - onset), abs=1000) for t, b in sc.leak_history)
    # the rate so far, as the scorer reads it, within a sample of the truth
    assert ld.grown_per_s(sc.leak_history, onset, onset + 300.0) == pytest.approx(
        rate, rel=2 / 300)


def test_a_fast_load_ramp_ends_in_an_oom_within_minutes_of_its_onset():
    spec = next(s for s in L.specs(quick=True) if s.fast and s.failure.cause == "load")
    sc = L.build(spec)
    assert (sc.oom_cause, sc.leak_start_ts, sc.leak_history) == ("load", None, [])
    assert 300.0 <= spec.failure.develop_s <= 900.0
    assert sc.oom_ts - sc.failure_onset_ts == pytest.approx(407.53, abs=0.01)
    assert sc.samples[-1].num_ooms == 1 and sc.postmortems


def test_the_fast_group_spans_six_fill_times_two_onsets_two_servers_and_two_load_ramps():
    fast = [s for s in L.specs() if s.fast]
    growth = [s for s in fast if s.failure.cause == "growth" and s.kv_tokens]
    assert sorted({s.failure.develop_s for s in growth}) == [360.0, 900.0, 1800.0, H, 3 * H,
                                                             10 * H]
    assert len(growth) == 24 and {s.traffic for s in growth} == {"never_idle", "diurnal"}
    # and four on servers whose hooks report no token figures
    untokened = [s for s in fast if not s.kv_tokens]
    assert [s.name.split("/")[1:4] for s in untokened] == [
        ["growth-untokened", "15min", "early"], ["growth-untokened", "30min", "late"],
        ["growth-untokened", "1h", "late"], ["growth-untokened", "3h", "early"]]
    growth += untokened
    assert sum(s.failure.onset_s < 300.0 for s in growth) == 12 + 2
    assert all(s.failure.onset_s >= H for s in growth if s.failure.onset_s >= 300.0)
    assert [s.failure.cause for s in fast if s not in growth] == ["load", "load"]
    quick = [s.name for s in L.specs(quick=True) if s.fast]
    assert len(quick) == 4 and set(quick) <= {s.name for s in fast}


@pytest.mark.parametrize("kw, quoted", [
    ({"failure": L.Failure("growth", 200.0, 100.0), "fast": True}, "100.0"),
    ({"failure": L.Failure("growth", 200.0, 360.0)}, "360.0"),  # not fast: >= 600 s
    ({"failure": L.Failure("fragmentation", 200.0, 900.0), "fast": True}, "fragmentation"),
])
def test_only_a_fast_growth_or_load_failure_may_develop_in_minutes(kw, quoted):
    with pytest.raises(ValueError, match=quoted):
        L.profiled_spec("t/bad", 1, "per_request_kv", "never_idle", H, **kw)


# --- the scorers -------------------------------------------------------------------------------
def test_growth_is_named_by_a_leak_alert_or_a_growth_risk_alert_after_its_onset():
    out = ld.LongScore()
    # onset 1000, OOM 4000: 3000 s to OOM, allowed max(180, 300) = 300 s
    ld.score_fast(fast_trace(), ld.Run([
        change("fired", "memory_leak", 900.0),  # before the onset: not a naming
        change("fired", "oom_risk", 1100.0, "OOM risk warning: ...; likely batch; try: x"),
        change("fired", "oom_risk", 1240.0, "OOM risk warning: ...; likely growth; try: x"),
        change("fired", "memory_leak", 1250.0)], {}, 4000.0), out)
    ld.score_fast(fast_trace(oom=2000.0, name="g"), ld.Run([], {}, 2000.0), out)  # not named
    assert out.named == [("f", 240.0, 300.0, 3000.0), ("g", math.inf, 180.0, 1000.0)]
    # the first right warning: 1240, 2760 s ahead of 3000; none in the second
    assert out.leads == [("f", pytest.approx(0.92)), ("g", 0.0)]
    assert out.flaps == {"f": 2, "g": 0}
    untokened = fast_trace(name="u")
    untokened.engine, untokened.kv_tokens = "per_request_kv", False  # scored apart
    ld.score_fast(untokened, ld.Run([change("fired", "memory_leak", 1100.0)], {}, 4000.0), out)
    assert out.named_untokened == [("u", 100.0, 300.0, 3000.0)] and len(out.named) == 2


def test_a_fast_ooms_lead_takes_the_first_risk_alert_naming_its_cause_and_flaps_are_counted():
    out = ld.LongScore()
    run = ld.Run([change("fired", "oom_risk", 500.0, "x; likely batch; y"),  # before the onset
                  change("fired", "oom_risk", 1200.0, "x; likely fragmentation; y"),
                  change("resolved", "oom_risk", 1300.0),
                  change("fired", "oom_risk", 1400.0, "x; likely batch; y"),
                  change("fired", "oom_risk_critical", 1500.0, "x; likely batch; y"),
                  change("fired", "memory_leak", 1600.0),  # not an OOM-risk change
                  change("resolved", "oom_risk", 2000.0),  # the OOM's own resolutions
                  change("resolved", "oom_risk_critical", 2000.0)], {}, 2000.0)
    ld.score_fast(fast_trace(oom=2000.0, cause="load"), run, out)
    assert out.named == []  # a load ramp is not named as growth
    assert out.leads == [("f", pytest.approx(0.6))]  # 1400: 600 s of 1000 ahead
    assert out.flaps == {"f": 4}


def test_a_leak_alert_with_its_time_to_oom_is_a_forecast_of_growth_and_one_without_is_not():
    # onset 1000, OOM 4000: the leak alert at 1300 carries no time to OOM, the one at 1600
    # does (1600: 2400 s of 3000 ahead); the risk warning naming growth comes later still
    run = ld.Run([change("fired", "memory_leak", 1300.0),
                  change("resolved", "memory_leak", 1400.0),
                  change("fired", "memory_leak", 1600.0),
                  change("fired", "oom_risk", 3000.0, "x; likely growth; y")], {}, 4000.0)
    run.verdicts = {1300.0: verdict(0.1, 0.2, ttoom=None), 1600.0: verdict(0.1, 0.2)}
    out = ld.LongScore()
    ld.score_fast(fast_trace(), run, out)
    assert out.named == [("f", 300.0, 300.0, 3000.0)]  # the first leak alert names it
    assert out.leads == [("f", pytest.approx(0.8))]
    # a load ramp's forecast is a risk warning naming the load, never a leak alert
    out = ld.LongScore()
    ld.score_fast(fast_trace(cause="load"), run, out)
    assert out.leads == [("f", 0.0)]


def test_leak_verdicts_cover_the_rate_so_far_exact_and_estimated_apart():
    rate = 0.01 * LIMIT / H
    history = [(1000.0 + 60.0 * k, int(rate * 60.0 * k)) for k in range(61)]
    sc = fast_trace(onset=1000.0, oom=5000.0, history=history)
    run = ld.Run([], {}, 5000.0, verdicts={
        900.0: verdict(None, None),  # before the onset: not read
        1600.0: verdict(0.9 * rate, 1.1 * rate),
        2200.0: verdict(1.05 * rate, 1.2 * rate, ttoom=None),
        2800.0: verdict(0.5 * rate, 2 * rate, estimated=True),
        3400.0: verdict(None, 2 * rate, estimated=True)})
    out = ld.LongScore()
    ld.score_verdicts(sc, run, out)
    assert out.covered == {False: [1, 2], True: [1, 2]}
    assert out.uncovered == {False: ["f at +20.0 min: 1.05-1.2 vs 1 %/h"],
                             True: ["f at +40.0 min: ?-2 vs 1 %/h"]}
    assert out.no_forecast == ["f at +20.0 min"]
    assert (out.leak_runs, out.said_no_leak) == (1, [])
    figs = {f.metric: f for f in ld.verdict_figures(out)}
    exact = figs["long suite: leak rate interval at detection holds the rate so far "
                 "(exact floors)"]
    assert (exact.value, exact.met) == (50.0, False)
    assert exact.spread == "1 of 2; first missed: f at +20.0 min: 1.05-1.2 vs 1 %/h"
    missing = figs["long suite: leak detections without a time to OOM"]
    assert (missing.value, missing.unit, missing.met) == (1.0, "of 4", False)


def test_a_leak_run_that_says_no_leak_once_the_leak_is_visible_counts_once():
    out = ld.LongScore()
    # the leak holds 0.1 % of the limit from 1120 s: a no_leak at 1060 s is not counted
    history = [(1000.0 + 60 * k, int(0.0006 * k * LIMIT)) for k in range(5)]
    sc = fast_trace(onset=1000.0, oom=9000.0, history=history)
    for states in (["no_leak", "insufficient_data", "leak"], ["no_leak", "no_leak", "no_leak"]):
        run = ld.Run([], {}, 9000.0,
                     onset_states=[(1060.0 + 60 * k, s) for k, s in enumerate(states)])
        ld.score_verdicts(sc, run, out)
    assert (out.leak_runs, out.said_no_leak) == (2, ["f at +2 min (last +3 min, 2 batches)"])
    fig = ld.verdict_figures(out)[-1]
    assert (fig.metric, fig.value, fig.met) == (
        "long suite: leak runs answered no_leak after the onset", 50.0, False)


def test_the_fast_figures_read_their_scores():
    # "a" and "b" fill within an hour (held to the target), "c" in three hours (reported)
    s = ld.LongScore(named=[("a", 60.0, 180.0, 900.0), ("b", 400.0, 200.0, 3600.0),
                            ("c", 1200.0, 1080.0, 10800.0)],
                     leads=[("a", 0.8), ("b", 0.25), ("c", 0.0)], flaps={"a": 2, "b": 6, "c": 0})
    name, slower, lead, flaps = ld.fast_figures(s)
    assert (name.value, name.unit, name.target, name.met) == (1.0, "of 2", "2", False)
    assert name.metric.endswith("of its onset (fills within an hour)")
    assert name.spread == "worst 2.00x the time allowed; late: b: 2.00x"
    assert (slower.value, slower.unit, slower.target, slower.met) == (0.0, "of 1", "", None)
    assert slower.spread == "worst 1.11x the time allowed; late: c: 1.11x"
    assert (lead.value, lead.unit, lead.met) == (1.0, "of 3", False)
    assert "least lead 0.00" in lead.spread and "b: 0.25; c: 0.00" in lead.spread
    assert (flaps.value, flaps.met, flaps.spread) == (6.0, False, "median 2 over 3; above 4: b: 6")
    s.named_untokened = [("u", 100.0, 300.0, 1800.0)]
    name, slower, untokened, *_ = ld.fast_figures(s)
    assert (untokened.value, untokened.unit, untokened.met) == (1.0, "of 1", True)
    assert untokened.metric.endswith("(fills within an hour, servers without token figures)")


def test_the_engine_run_keeps_the_verdict_at_each_leak_firing_and_the_state_after_the_onset():
    # the quick group's growth of 30 min begun after an hour, through the engine: whatever it
    # says, the scorer's inputs are there (the engine's figures move with it; see the bench)
    spec = next(s for s in L.specs(quick=True) if s.name.startswith("fast/growth/30min/late"))
    sc = L.build(spec)
    run = ld.run_engine(sc)
    fired = [c.ts_s for c in run.changes if c.kind == "fired" and c.rule == "memory_leak"]
    assert sorted(run.verdicts) == sorted(run.leak_slopes) == sorted(fired)
    assert run.onset_states and all(ts >= sc.leak_start_ts for ts, _ in run.onset_states)
    assert len(run.onset_states) == pytest.approx((sc.oom_ts - sc.leak_start_ts) / 60, abs=2)
    out = ld.LongScore()
    ld.score_fast(sc, run, out)
    assert [n for n, *_ in out.named] == [n for n, _ in out.leads] == [sc.name]
    assert out.leak_runs == 1
