"""One cause per risk episode (agent/alerts/explain.py, CauseEpisode; docs/analysis.md, "One
cause per risk episode"): the alert, the stored verdict rows and the post-mortem name the cause
the episode's first warning gave, unless the evidence for another is decisive."""

from vramscope.agent.alerts.engine import AlertEngine
from vramscope.agent.alerts.explain import warning_cause
from vramscope.agent.daemon import AlertFeed
from vramscope.agent.records import Event, Phase, PostMortem, Sample

GIB = 2**30
D, P = Phase.DECODE, Phase.PREFILL
PID = 7


def _serve(engine, steps, start=0):
    """One sample per 10 s: (phase, allocated GiB, allocator retries, largest free block GiB),
    77 GiB reserved of an 80 GiB limit; the alert changes."""
    out = []
    for k, (phase, alloc, retries, free) in enumerate(steps, start):
        out += engine.feed([Sample(10.0 * k, 0, phase, allocated_bytes=alloc * GIB,
                                   reserved_bytes=77 * GIB, num_alloc_retries=retries,
                                   largest_free_block_bytes=None if free is None else free * GIB,
                                   device_total_bytes=80 * GIB, pid=PID)])
    return out


# decode at 60 GiB; a 4 GiB prefill makes the allocator retry; a snapshot finds no free block
# over 1 GiB with 20 GiB free in all: fragmentation. Then the load grows to 70 and 73 GiB: at
# 73 the 4 GiB request takes more than half of the 7 GiB free (SPIKE_SHARE), but fits in it.
FRAGMENTED = [(D, 60, 0, None), (P, 64, 1, None), (D, 60, 1, 1), (D, 70, 1, None),
              (D, 73, 1, None)]


def _causes(engine):
    return [(v.ts_s, v.risk_level, v.risk_cause) for v in engine.verdicts.history]


def test_an_episode_named_fragmentation_keeps_it_when_a_prefill_still_fits_in_all_free():
    e = AlertEngine.from_config(None)
    fired = [c for c in _serve(e, FRAGMENTED) if c.kind == "fired"]
    assert [(c.ts_s, c.rule) for c in fired] == [(20.0, "oom_risk"),
                                                 (20.0, "oom_risk_critical")]
    assert all(c.message.endswith("; likely fragmentation; try: set PYTORCH_CUDA_ALLOC_CONF="
                                  "expandable_segments:True") for c in fired)
    d = e.device(0)
    model = d.risks[PID]
    # read afresh at 73 GiB, the point alone says prefill_spike (4 GiB > half of the 7 free);
    # not decisive: the request fits in the free memory taken together
    assert warning_cause(model.last, model, d.leaks[PID]) == "prefill_spike"
    assert model.headroom_bytes == 7 * GIB and model.largest_request_bytes == 4 * GIB
    assert _causes(e) == [(0.0, "ok", None), (10.0, "warning", "fragmentation"),
                          (20.0, "critical", "fragmentation")]
    assert d.cause_of(model, d.leaks[PID]) == "fragmentation"


def test_a_prefill_needing_more_than_all_free_makes_it_a_prefill_spike_never_back():
    e = AlertEngine.from_config(None)
    # a prefill at 73 GiB to 77: the 4 GiB request needs more than the 3 GiB free in all
    # (decisive); back at 73 GiB the point reads fragmentation again, the episode does not
    _serve(e, FRAGMENTED + [(P, 77, 1, None), (D, 73, 1, None)])
    assert _causes(e) == [(0.0, "ok", None), (10.0, "warning", "fragmentation"),
                          (20.0, "critical", "fragmentation"),
                          (50.0, "warning", "prefill_spike"),
                          (60.0, "critical", "prefill_spike")]
    d = e.device(0)
    assert "fragmentation" in d.risks[PID].last.reasons
    # the OOM ends the episode; its post-mortem, sent without a cause, takes the episode's
    e.feed([Event(65.0, "oom", 0, pid=PID)])
    assert d.episodes[d.risks[PID]].cause is None
    pm = PostMortem(65.0, 0, PID, P, 4 * GIB, 3 * GIB, 80 * GIB, 73 * GIB, 77 * GIB, GIB, 0.9)
    done = AlertFeed(e, [], None).completed(pm)
    assert (done.cause, done.remedies[0]) == (
        "prefill_spike", "enable chunked prefill (bound the tokens prefilled per step)")
    assert AlertFeed(e, [], None).completed(pm._replace(cause="fragmentation")).cause == \
        "fragmentation"  # a producer's own cause stands


def test_an_episode_ends_after_the_alerts_hold_at_ok_and_the_next_is_named_afresh():
    e = AlertEngine.from_config(None)
    _serve(e, FRAGMENTED)
    d = e.device(0)
    model = d.risks[PID]
    ep = d.episodes[model]
    said = []
    # the cache emptied (reserved 50 GiB: the retry holds the risk only near the limit, and
    # its own minute is over after 70 s) and the load fell: ok from 80 s. The episode lasts as
    # long as the alert that named it holds at ok (30 min), then ends (no OOM: no cause kept)
    for ts in (70.0, 80.0, 1870.0, 1880.0):
        e.feed([Sample(ts, 0, D, allocated_bytes=40 * GIB, reserved_bytes=50 * GIB,
                       num_alloc_retries=1, device_total_bytes=80 * GIB, pid=PID)])
        said.append((ts, model.level_index, ep.cause))
    assert said == [(70.0, 1, "fragmentation"), (80.0, 0, "fragmentation"),
                    (1870.0, 0, "fragmentation"), (1880.0, 0, None)]
    assert ep.ended_cause is None
    # the next warning names its own cause: the headroom gone with a prefill in flight
    e.feed([Sample(1890.0, 0, D, allocated_bytes=74 * GIB, reserved_bytes=78 * GIB,
                   num_alloc_retries=1, device_total_bytes=80 * GIB, pid=PID),
            Sample(1900.0, 0, P, allocated_bytes=int(78.5 * GIB), reserved_bytes=79 * GIB,
                   num_alloc_retries=1, device_total_bytes=80 * GIB, pid=PID)])
    assert (model.level_index, ep.cause) == (2, "prefill_spike")


def test_the_demos_fragmentation_server_has_one_cause_from_its_first_warning_to_its_oom():
    # the demo's fragmentation server (agent/sim/scenarios.py): warned at 450 s, critical at
    # 494 s, its OOM at 1225.5 s. Its rows flip between warning and critical and ok for a
    # moment, and a few of its points read as a prefill spike (the largest request more than
    # half of what is free, SPIKE_SHARE), but the episode, its alerts, its rows and the
    # post-mortem the server sends all say fragmentation
    from vramscope.agent.sim.scenarios import scenario_spec
    from vramscope.agent.sim.server import SimServer

    from tests.agent.test_sim_server import T0, ListSink

    sink = ListSink()
    SimServer(scenario_spec("fragmentation", pid=PID), sink, T0).run_until(T0 + 1226)
    e = AlertEngine.from_config(None)
    records = sorted([*sink.samples(), *sink.events()], key=lambda r: r.ts_s)
    fired = [c for c in e.feed(records) if c.kind == "fired"]
    oom = sink.postmortems()[0].ts_s
    assert [(c.rule, c.ts_s - T0) for c in fired] == [
        ("oom_risk", 450.0), ("oom_risk_critical", 494.0), ("oom", 1225.5)]
    assert all("; likely fragmentation; try: set PYTORCH_CUDA_ALLOC_CONF" in c.message
               for c in fired[:2])
    rows = [v for v in e.verdicts.history if v.ts_s < oom and v.risk_level != "ok"]
    assert len(rows) >= 8 and {v.risk_cause for v in rows} == {"fragmentation"}
    assert sink.postmortems()[0].cause == "fragmentation"
