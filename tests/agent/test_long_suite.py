"""The long suite: deterministic, with the truth it claims, in the counts it promises."""

import pytest
from vramscope.agent.records import Phase

from tools.bench import long_suite as L
from tools.bench import long_suite_shapes as shapes
from tools.bench.labelled_recordings import CONTEXT_BYTES, GIB, START_S

H = 3600.0
LIMIT = 80 * GIB


def short(name, seed=1, engine="per_request_kv", traffic="diurnal", duration_s=H, **kw):
    return L.profiled_spec(name, seed, engine, traffic, duration_s, **kw)


def slope(xs, ys):
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def one_of(cause):
    return next(s for s in L.specs(quick=True) if s.failure and s.failure.cause == cause)


# --- determinism and records -------------------------------------------------------------------
def test_same_seed_same_trace_and_another_seed_another():
    spec = short("t/det", engine="static_batch", traffic="bursty", duration_s=2 * H)
    a, b = L.build(spec), L.build(spec)
    assert a.samples == b.samples and a.events == b.events and a.peak_ratio == b.peak_ratio
    other = L.build(short("t/det", seed=2, engine="static_batch", traffic="bursty",
                          duration_s=2 * H))
    assert other.samples != a.samples


def test_samples_are_trace_v1_sim_records_every_dt():
    sc = L.build(short("t/rec", engine="paged_pool", traffic="never_idle", duration_s=0.5 * H))
    s = sc.samples[-1]
    assert (s.source, s.device, s.device_total_bytes) == ("sim", 0, LIMIT)
    assert s.device_used_bytes == s.reserved_bytes + CONTEXT_BYTES
    assert s.kv_blocks_total > 0 and s.kv_blocks_used is not None
    assert [round(b.ts_s - a.ts_s, 6) for a, b in zip(sc.samples, sc.samples[1:])] == [2.0] * (
        len(sc.samples) - 1)
    snapshots = [x.ts_s for x in sc.samples if x.largest_free_block_bytes is not None]
    assert all(59.9 < b - a < 62.1 for a, b in zip(snapshots, snapshots[1:]))
    starts = {e.request_id for e in sc.events if e.name == "request_start"}
    assert starts and all(e.pid == s.pid for e in sc.events)


# --- leaks -------------------------------------------------------------------------------------
def test_a_per_request_leak_raises_the_idle_floor_at_its_truth_rate():
    """Floor: the least allocated over idle samples per 10 minutes; its slope over the 2 h after
    onset is the truth rate within 10 %."""
    spec = short("t/leak", engine="per_request_kv", traffic="diurnal", duration_s=3900 + 3 * H,
                 rate_per_s=0.2, kv=0.015, act=0.02, start_hour=11.0, decode_s=(2.0, 6.0),
                 leak=L.Leak("per_request", 0.01, 3900.0))
    sc = L.build(spec)
    onset = sc.leak_start_ts
    assert onset == START_S + 3900.0 and sc.leak_rate_ratio_per_h == 0.01
    floors: dict[int, int] = {}
    for s in sc.samples:
        if s.phase is Phase.IDLE and onset <= s.ts_s < onset + 2 * H:
            k = int((s.ts_s - onset) // 600)
            floors[k] = min(floors.get(k, s.allocated_bytes), s.allocated_bytes)
    assert sorted(floors) == list(range(12))
    rate = slope([600 * k + 300 for k in floors], list(floors.values())) * H / LIMIT
    assert rate == pytest.approx(0.01, rel=0.10)


class Recording(shapes.Sim):
    """The simulator, keeping what it had leaked at each sample."""

    def _step(self, u):
        super()._step(u)
        self.trail.append((u, self.leaked))

    def run(self):
        self.trail = []
        return super().run()


@pytest.mark.parametrize("spec", [s for s in L.specs(quick=True) if s.leak],
                         ids=lambda s: s.name)
def test_every_leak_shape_averages_its_truth_rate_over_two_hours(spec):
    sim = Recording(spec)
    sim.run()
    onset = spec.leak.onset_s

    def leaked(u):
        return [b for t, b in sim.trail if t < u][-1]

    rate = (leaked(onset + 2 * H) - leaked(onset)) / 2 / LIMIT
    assert rate == pytest.approx(spec.leak.rate, rel=0.03)
    assert leaked(onset) == 0.0 and leaked(spec.duration_s) >= leaked(onset + 2 * H) > 0


def test_a_leak_trace_keeps_what_its_leak_added_a_minute_apart_for_the_scorer():
    from tools.bench.long_detection import grown_per_s

    spec = next(s for s in L.specs(quick=True) if s.leak and s.leak.shape == "under_load")
    sim = Recording(spec)
    sim.run()
    sc = L.build(spec)
    onset = START_S + spec.leak.onset_s
    history = sc.leak_history
    # from the first step at the onset, a point a minute
    assert onset <= history[0][0] < onset + spec.dt_s
    assert all(b - a == 60.0 for (a, _), (b, _) in zip(history, history[1:]))
    trail = dict(sim.trail)
    assert all(b == int(trail[t - START_S]) for t, b in history)
    # the rate so far at each hour: what the leak added until then over the time since onset
    for hours in (0.5, 1.0, 2.0):
        ts = onset + hours * H
        added = [b for t, b in history if t <= ts][-1]
        assert grown_per_s(history, onset, ts) == added / (hours * H)
    # under load only: after two hours its average is the suite's rate, not at every hour
    assert grown_per_s(history, onset, onset + 2 * H) == pytest.approx(
        spec.leak.rate * LIMIT / 3600, rel=0.03)
    assert grown_per_s([], onset, onset + H) == 0.0 == grown_per_s(history, onset, onset - 1)


def test_steps_jump_every_10_to_40_minutes_and_hold_the_window_exactly():
    import random
    times, sizes = shapes._steps(random.Random(3), 5000.0, 5000.0 + 4 * H, 100.0)
    in_window = [b for t, b in zip(times, sizes) if t < 5000.0 + shapes.WINDOW_S]
    assert sum(in_window) == pytest.approx(100.0 * shapes.WINDOW_S)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == 5000.0 and all(450.0 <= g <= 2400.0 for g in gaps)


# --- servers -----------------------------------------------------------------------------------
def test_a_paged_pool_is_allocated_in_setup_and_flat_while_its_blocks_move():
    spec = short("t/paged", engine="paged_pool", traffic="diurnal", duration_s=2 * H,
                 start_hour=10.0, weights=0.25, act=0.01, kv=0.025, rate_per_s=0.1)
    sc = L.build(spec)
    planned = int(0.90 * LIMIT) - CONTEXT_BYTES  # weights + pool + activation budget
    budget = int(2.5 * 0.01 * LIMIT)
    setup = [s for s in sc.samples if s.phase is Phase.SETUP]
    serving = [s for s in sc.samples if s.phase in (Phase.PREFILL, Phase.DECODE, Phase.IDLE)]
    assert setup and setup[0].ts_s < serving[0].ts_s
    assert setup[0].allocated_bytes >= planned - budget  # the pool, at once
    alloc = [s.allocated_bytes for s in serving]
    assert planned - budget <= min(alloc) and max(alloc) <= planned + 0.002 * LIMIT
    used = [s.kv_blocks_used for s in serving]
    assert max(used) - min(used) > 0.3 * serving[0].kv_blocks_total


def test_a_reload_drains_exits_and_a_new_pid_loads_again_after_a_gap():
    spec = short("t/reload", engine="per_request_kv", traffic="never_idle", reloads_s=(1800.0,))
    sc = L.build(spec)
    pids = list(dict.fromkeys(s.pid for s in sc.samples))
    assert len(pids) == 2 and len(sc.reload_ts) == 1
    old = [s for s in sc.samples if s.pid == pids[0]]
    new = [s for s in sc.samples if s.pid == pids[1]]
    assert old[-1].ts_s < sc.reload_ts[0] <= new[0].ts_s - 45.0
    assert 45.0 <= new[0].ts_s - old[-1].ts_s <= 80.0
    assert new[0].phase is Phase.UNKNOWN and new[0].allocated_bytes < old[-1].allocated_bytes
    assert any(s.phase is Phase.SETUP for s in new)
    started = {e.request_id for e in sc.events if e.pid == pids[0] and e.name == "request_start"}
    ended = {e.request_id for e in sc.events if e.pid == pids[0] and e.name == "request_end"}
    assert started == ended  # it drained before exiting


def test_an_agent_restart_leaves_no_records_and_the_same_pid_goes_on():
    spec = short("t/gap", engine="static_batch", traffic="never_idle",
                 agent_gaps=((1200.0, 180.0),))
    sc = L.build(spec)
    lo, hi = START_S + 1200.0, START_S + 1380.0
    assert sc.agent_gaps == [(lo, hi)]
    assert not [s for s in sc.samples if lo <= s.ts_s < hi]
    assert not [e for e in sc.events if lo <= e.ts_s < hi]
    before = [s for s in sc.samples if s.ts_s < lo][-1]
    after = [s for s in sc.samples if s.ts_s >= hi][0]
    assert after.ts_s - before.ts_s == pytest.approx(182.0)
    assert before.pid == after.pid


def test_a_lazy_warm_up_grows_5_to_10_percent_in_its_first_20_minutes_then_stops():
    sc = L.build(short("t/warm", engine="per_request_kv", traffic="bursty", duration_s=2 * H,
                       lazy_warmup=True))
    idle = [s for s in sc.samples if s.phase is Phase.IDLE]
    first = min(s.allocated_bytes for s in idle[:5])
    after = [s.allocated_bytes for s in idle if s.ts_s > sc.warmup_end_ts]
    assert sc.warmup_end_ts - START_S <= 60 + 80 + 1200
    assert min(after) - first >= 0.05 * LIMIT and max(min(after), first) < 0.42 * LIMIT
    assert max(after) - min(after) < 0.002 * LIMIT  # a plateau


def test_the_tight_server_peaks_at_85_to_90_percent_and_retries_without_an_oom():
    spec = next(s for s in L.specs() if s.tight)
    sc = L.build(spec)
    assert sc.tight and 0.85 <= sc.peak_ratio <= 0.90
    assert sc.samples[-1].num_alloc_retries > 0 and sc.samples[-1].num_ooms == 0
    assert sc.oom_ts is None and not [e for e in sc.events if e.name == "oom"]


# --- failures ----------------------------------------------------------------------------------
def test_fragmentation_retries_rise_before_the_oom_which_finds_memory_but_no_block():
    sc = L.build(one_of("fragmentation"))
    oom = [e for e in sc.events if e.name == "oom"]
    assert [e.ts_s for e in oom] == [sc.oom_ts] and "CUDA out of memory" in oom[0].data["message"]
    last = sc.samples[-1]
    assert (last.ts_s, last.num_ooms) == (sc.oom_ts, 1)

    def retries_at(ts):
        return [s.num_alloc_retries for s in sc.samples if s.ts_s <= ts][-1]

    assert retries_at(sc.oom_ts - 1800) < retries_at(sc.oom_ts - 300) < last.num_alloc_retries
    pm = sc.postmortems[0]
    free = LIMIT - CONTEXT_BYTES - pm.allocated_bytes
    assert pm.largest_free_block_bytes < pm.failed_alloc_bytes < free
    splits = [s.inactive_split_bytes for s in sc.samples]
    assert splits[-1] > 10 * splits[len(splits) // 3]


@pytest.mark.parametrize("cause", ["growth", "load", "prefill_spike"])
def test_a_cuda_oom_ends_the_trace_at_its_truth_time(cause):
    sc = L.build(one_of(cause))
    assert sc.oom_cause == cause and sc.samples[-1].ts_s == sc.oom_ts
    assert [e.ts_s for e in sc.events if e.name == "oom"] == [sc.oom_ts]
    pm = sc.postmortems[0]
    assert pm.failed_alloc_bytes > LIMIT - CONTEXT_BYTES - pm.allocated_bytes  # no room at all
    if cause != "prefill_spike":
        assert sc.oom_ts - START_S - one_of(cause).failure.onset_s >= 600


def test_kv_exhaustion_fills_the_pool_at_its_truth_time_without_a_cuda_oom():
    sc = L.build(one_of("kv_exhaustion"))
    at = [s for s in sc.samples if s.ts_s == sc.oom_ts][0]
    assert at.kv_blocks_used == at.kv_blocks_total
    assert all(s.kv_blocks_used < s.kv_blocks_total for s in sc.samples if s.ts_s < sc.oom_ts
               and s.kv_blocks_used is not None)
    assert 300 <= sc.samples[-1].ts_s - sc.oom_ts <= 602  # preempting, on for 5-10 minutes
    assert not sc.postmortems and sc.samples[-1].num_ooms == 0


# --- the suite ---------------------------------------------------------------------------------
def test_the_full_suite_holds_what_it_promises():
    specs = L.specs()
    healthy = [s for s in specs if s.kind == "healthy" and not s.throughput]
    assert len(healthy) >= 8 and sum(s.duration_s for s in healthy) >= 7 * 86400
    assert {s.engine for s in healthy} == set(L.ENGINES)
    assert {s.traffic for s in healthy} == set(L.TRAFFICS)
    assert any(s.reloads_s for s in healthy) and any(s.agent_gaps for s in healthy)
    assert any(s.lazy_warmup for s in healthy) and sum(s.tight for s in healthy) == 1
    leaks = [s for s in specs if s.leak]
    fast = [s for s in leaks if s.leak.rate >= 0.005]
    assert len(fast) >= 40 and any(s.leak.rate == 0.0025 for s in leaks)
    assert {s.leak.shape for s in fast} == set(L.LEAK_SHAPES)
    assert {s.engine for s in fast} == set(L.ENGINES)
    assert all(s.leak.onset_s >= H and s.duration_s - s.leak.onset_s >= 3 * H for s in leaks)
    causes = [s.failure.cause for s in specs if s.failure]
    assert len(causes) >= 12 and all(causes.count(c) >= 2 for c in L.CAUSES)
    fine = [s for s in specs if s.throughput]
    assert fine and all(s.dt_s == 0.1 and s.duration_s == H for s in fine)
    assert len({s.seed for s in specs}) == len({s.name for s in specs}) == len(specs)


def test_the_quick_suite_is_small_and_has_every_kind():
    specs = L.specs(quick=True)
    assert sum(s.duration_s / s.dt_s for s in specs) < 150_000
    assert {s.failure.cause for s in specs if s.failure} == set(L.CAUSES)
    assert {s.leak.shape for s in specs if s.leak} == set(L.LEAK_SHAPES)


def test_describe_says_the_truth_in_one_line():
    sc = L.build(one_of("fragmentation"))
    line = L.describe(sc)
    assert "\n" not in line and line.startswith(sc.name)
    assert "fragmentation at +" in line and "per_request_kv/bursty" in line


@pytest.mark.parametrize("kw, quoted", [
    ({"engine": "tgi"}, "'tgi'"),
    ({"leak": L.Leak("per_request", 0.01, 600.0)}, "600.0"),
    ({"leak": L.Leak("drip", 0.01, 4000.0), "duration_s": 4000 + 3 * H}, "'drip'"),
    ({"failure": L.Failure("growth", 600.0, 60.0)}, "60.0"),
    ({"failure": L.Failure("kv_exhaustion", 600.0, 900.0)}, "kv_exhaustion"),
])
def test_a_bad_spec_is_refused_quoting_the_value(kw, quoted):
    with pytest.raises(ValueError, match=quoted):
        short("t/bad", **kw)
