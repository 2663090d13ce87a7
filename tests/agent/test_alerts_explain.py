"""What an alert says (agent/alerts/explain.py): the reason that fired with its numbers, and the
cause by the post-mortem's words, on scripted servers."""

from vramscope.agent.alerts.engine import AlertEngine
from vramscope.agent.alerts.explain import time_range
from vramscope.agent.analysis.risk_model import RiskPoint
from vramscope.agent.records import Phase, Sample

from tools.bench import labelled_recordings, oom_scenarios

GIB = 2**30


def fired(sc):
    engine = AlertEngine.from_config(None)
    return [c for c in engine.feed([*sc.samples, *sc.events]) if c.kind == "fired"]


def test_a_rising_floor_is_named_with_its_time_to_oom_and_the_risk_follows_it():
    # growth from the first sample, 90 %/h of 80 GiB, OOM at 2356 s: a rise that rises steadily
    # in a process's first minutes is growth, not a warm-up (docs/analysis.md, fast growth): the
    # leak is named at 780 s, full in about 26 min (it came 26.3 min later), the risk follows
    # it 16 s later, and the critical level comes from its rate: 5.0 min (it came 7.6 min later)
    sc = labelled_recordings.growth_oom(5)
    got = fired(sc)
    assert [(c.rule, c.ts_s - sc.samples[0].ts_s) for c in got] == [
        ("memory_leak", 780.0), ("oom_risk", 796.0), ("oom_risk_critical", 1899.0),
        ("oom", 2356.0)]
    assert got[1].message == (
        "OOM risk warning: the floor growing 70.86 GiB/h (60.23 GiB/h to 81.49 GiB/h): OOM in "
        "24.8 min (21.6 min to 29.2 min); likely growth; try: look for a leak: compare the idle "
        "floor before and after requests (vramscope leaks page)")
    assert got[2].message == (
        "OOM risk critical: the floor growing 73.24 GiB/h (60.51 GiB/h to 84.23 GiB/h): OOM in "
        "5.0 min (4.3 min to 6.0 min); likely growth; try: look for a leak: compare the idle "
        "floor before and after requests (vramscope leaks page)")


def test_peaks_rising_over_a_flat_floor_is_the_load():
    # the first warning, 1045 s before the OOM, from the peaks' fast route (4.5 min of 15-s
    # peaks rising at 202 GiB/h, above every peak before them, while the floor under them has
    # not moved); the critical one, from the slow route's 20 min of peaks, keeps the episode's
    # cause. The first forecast comes early: the ramp rises in surges, and a surge's rate is
    # the stretch's (docs/analysis.md, OOM risk); the critical one's 5.0 min came 4.3 min later
    sc = next(s for s in oom_scenarios.scenarios(quick=True) if s.name == "load_ramp/1")
    got = fired(sc)
    assert [(c.rule, c.ts_s - sc.samples[0].ts_s) for c in got] == [
        ("oom_risk", 720.0), ("oom_risk_critical", 1508.0), ("oom", 1765.0)]
    assert got[0].message == (
        "OOM risk warning: peaks rising 201.54 GiB/h over 4.5 min: OOM in 8.6 min (6.8 min to "
        "11.7 min); likely batch; try: lower the maximum concurrency (max_num_seqs) or the "
        "batched tokens per step")
    assert "; likely batch; try: lower the maximum concurrency" in got[1].message


def test_headroom_gone_only_with_the_largest_prefill_spike_is_a_prefill_spike():
    # decode at 74 GiB of 80; one prefill to 78.5 GiB: back at 74 GiB, 1.5 GiB of headroom is
    # left after the 4.5 GiB spike; 6 GiB are free now
    e = AlertEngine.from_config(None)
    got = e.feed([Sample(0.0, 0, Phase.DECODE, allocated_bytes=74 * GIB,
                         device_total_bytes=80 * GIB),
                  Sample(1.0, 0, Phase.PREFILL, allocated_bytes=int(78.5 * GIB),
                         device_total_bytes=80 * GIB),
                  Sample(2.0, 0, Phase.DECODE, allocated_bytes=74 * GIB,
                         device_total_bytes=80 * GIB)])
    assert [c.rule for c in got] == ["oom_risk", "oom_risk_critical"]
    assert got[0].message == (
        "OOM risk critical: headroom 1.9 % of the 80.00 GiB limit after the largest prefill "
        "spike (4.50 GiB); 1.50 GiB free now; likely prefill_spike; try: enable chunked "
        "prefill (bound the tokens prefilled per step)")


def test_a_leak_alert_says_its_rate_its_interval_since_when_and_its_time_to_oom():
    leak = next(c for c in fired(labelled_recordings.growth_oom(5)) if c.rule == "memory_leak")
    assert leak.message == (
        "idle floor rising 70.86 GiB/h (60.23 GiB/h to 81.49 GiB/h), 88.58 % of the limit per hour "
        "since 2023-11-14T22:15:05.000Z, over 10.5 min of floor (leak); full in about 26.0 min "
        "(22.6 min to 30.5 min)")  # the truth: 1.5 % a minute, 90 %/h; the OOM 26.3 min later


def _retrying_after_a_prefill(spike_gib: float) -> list[str]:
    """Decode at 60 GiB of 80, 77 GiB reserved; one prefill of ``spike_gib`` makes the
    allocator retry; a snapshot then finds no free block over 1 GiB (20 GiB free in all)."""
    e = AlertEngine.from_config(None)
    steps = [(Phase.DECODE, 60.0, 0), (Phase.PREFILL, 60.0 + spike_gib, 1), (Phase.DECODE, 60.0, 1)]
    return [c.message for c in e.feed([
        Sample(float(k), 0, phase, allocated_bytes=int(alloc * GIB), reserved_bytes=77 * GIB,
               num_alloc_retries=retries, largest_free_block_bytes=GIB if k == 2 else None,
               device_total_bytes=80 * GIB)
        for k, (phase, alloc, retries) in enumerate(steps)])]


def test_retries_for_a_request_small_beside_the_free_memory_are_fragmentation():
    first = _retrying_after_a_prefill(4.0)[0]
    assert "the largest request (4.00 GiB) fits neither the largest free block (1.00 GiB)" in first
    assert first.endswith("; likely fragmentation; try: set "
                          "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")


def test_retries_for_a_request_taking_most_of_the_free_memory_are_a_prefill_spike():
    # 12 GiB of the 20 GiB free in all: however the free memory were arranged, a somewhat
    # longer prompt would not fit (the post-mortem of that OOM says prefill_spike)
    first = _retrying_after_a_prefill(12.0)[0]
    assert "the largest request (12.00 GiB) fits neither" in first
    assert first.endswith("; likely prefill_spike; try: enable chunked prefill (bound the "
                          "tokens prefilled per step)")


def test_every_risk_alert_of_a_growth_failure_names_growth():
    # the long suite's growth failure on a static-batch server with bursty traffic: the peaks
    # rise with the floor under them (a growth the leak check has not named yet on this bursty
    # server). The first warning, 77 min ahead, is an accelerating rise (the span's recent
    # half); the second, 32 min ahead, is the leak's own forecast (the floor growing); the
    # critical one, 28 min ahead, is read over the half's floor too: growth, as the
    # post-mortem will say, the one cause of the episode
    from tools.bench import long_detection, long_suite

    spec = next(s for s in long_suite.specs()
                if s.name == "failure/growth/static_batch-bursty/312")
    sc = long_suite.build(spec)
    run = long_detection.run_engine(sc)
    fired = [c for c in run.changes if c.kind == "fired" and c.rule.startswith("oom_risk")]
    assert [(c.rule, round((sc.oom_ts or 0.0) - c.ts_s)) for c in fired] == [
        ("oom_risk", 4626), ("oom_risk", 1938), ("oom_risk_critical", 1702)]
    assert "peaks rising 72.32 GiB/h over 11.0 min" in fired[0].message
    assert all("; likely growth; try: look for a leak" in c.message for c in fired)


def test_a_load_ramp_filling_the_device_is_the_load_though_the_largest_prefill_fits_nowhere():
    # the long suite's load ramp on a never-idle server: the peaks rise over a flat floor, and
    # near the end the largest prefill fits neither a free block nor a new segment. The work
    # in flight grew to the limit: the post-mortem says load, and so does every alert of the
    # episode (not prefill_spike, which the fragmentation signs alone would give): the warning
    # 555 s ahead from the peaks' fast route (6.8 min of 15-s peaks), the critical 107 s ahead
    from tools.bench import long_detection, long_suite

    spec = next(s for s in long_suite.specs()
                if s.name == "failure/load/per_request_kv-never_idle/321")
    sc = long_suite.build(spec)
    run = long_detection.run_engine(sc)
    fired = [c for c in run.changes if c.kind == "fired" and c.rule.startswith("oom_risk")]
    assert [(c.rule, round((sc.oom_ts or 0.0) - c.ts_s)) for c in fired] == [
        ("oom_risk", 555), ("oom_risk_critical", 107)]
    assert fired[0].message.startswith(
        "OOM risk warning: peaks rising 153.74 GiB/h over 6.8 min: OOM in 12.4 min (11.0 min "
        "to 14.1 min)")
    assert "fits neither the largest free block (4.09 GiB) nor a new segment" in fired[1].message
    assert all("; likely batch; try: lower the maximum concurrency" in c.message for c in fired)


def test_a_forecast_whose_bounds_read_as_its_figure_is_said_once():
    # the H100 run's critical alert (docs/gpu-verification.md section 20): peaks rising so
    # regularly that the interval's bounds round to the figure; "5.0 min (5.0 min to 5.0 min)"
    # says nothing the figure does not
    def point(mid, low, high):
        return RiskPoint(0.0, 0, "critical", GIB, 0.01, mid, low, high, ("trend",))

    assert time_range(point(299.9, 298.7, 301.2)) == "5.0 min"
    assert time_range(point(299.9, 270.0, 301.2)) == "5.0 min (4.5 min to 5.0 min)"
