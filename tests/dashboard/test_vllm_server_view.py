"""A vLLM server as its user sees it on the dashboard (issue 33): an idle server is idle, not
stale; stale names who stopped reporting; history being written is "catching up"; the KV pool is
drawn as steps with gaps where no samples exist; running / waiting requests and preemptions
beside it; each server process with its KV usage now, requests per minute, and old pids ended.

The database is the scripted one of ``tests/support/vllm_store.py`` (what the plugin writes on
a host without a GPU); expected values are its script's, spelt out.
"""

from __future__ import annotations

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.dashboard import timeline as tl
from vramscope.dashboard.app import create_app
from vramscope.dashboard.verdict import freshness

from tests.support import vllm_store as V

CONFIG = V.config()  # stale_after_s 25 (dashboard.refresh_s 5 s)


def _client(store, now: float = V.NOW):
    return create_app(CONFIG, store, clock=FakeClock(now)).test_client()


def _get(client, path: str):
    r = client.get(path)
    assert r.status_code == 200, r.get_data(as_text=True)
    return r.get_json()


# --- freshness: who stopped reporting ----------------------------------------------------------
@pytest.mark.parametrize(("agent", "clients", "expected"), [
    (None, None, ("stale", "agent")),  # no agent report stored: as before, stale
    ({"ts_s": 960.0, "clients": 1, "rows_per_s": 0.0}, None, ("stale", "agent")),  # 40 s old
    ({"ts_s": 998.0, "clients": 1, "rows_per_s": 0.0}, None, ("idle", None)),
    ({"ts_s": 998.0, "clients": 0, "rows_per_s": 0.0}, None, ("stale", "clients")),
    ({"ts_s": 998.0, "clients": 0, "rows_per_s": 900.0}, None, ("catching_up", None)),
    ({"ts_s": 998.0, "clients": 2, "rows_per_s": 0.0}, 0, ("stale", "clients")),  # not ours
])
def test_old_samples_are_stale_only_when_a_reporter_stopped(agent, clients, expected):
    doc = freshness(900.0, 1000.0, CONFIG, agent, clients)  # the newest sample is 100 s old
    assert (doc["state"], doc["why"]) == expected
    assert doc["stale"] is (expected[0] == "stale")
    assert freshness(990.0, 1000.0, CONFIG, agent)["state"] == "live"  # 10 s < 25 s


def test_an_idle_connected_server_is_idle_everywhere(tmp_path):
    c = _client(V.vllm_store(tmp_path / "v.db"))
    fresh = _get(c, "/api/v1/freshness")
    assert fresh == {"now_s": V.NOW, "newest_ts_s": V.IDLE2, "age_s": 40.0,
                     "stale_after_s": 25.0, "state": "idle", "stale": False, "why": None,
                     "agent_age_s": 2.0, "clients": 1}
    overview = _get(c, "/api/v1/overview")
    assert overview["freshness"] == fresh
    (row,) = overview["devices"]
    assert (row["freshness"], row["stale"]) == ("idle", False)
    # the device's KV pool now (the idle sample: 0 of 63) and its requests of the last minute
    assert (row["kv_usage_ratio"], row["requests_per_min"]) == (0.0, 2.0)


def test_stale_says_who_stopped(tmp_path):
    later = _client(V.vllm_store(tmp_path / "a.db"), V.NOW + 60)  # the agent's report: 62 s
    assert _get(later, "/api/v1/freshness")["why"] == "agent"
    gone = _client(V.vllm_store(tmp_path / "c.db", clients=0, seen_ts=V.IDLE2))
    fresh = _get(gone, "/api/v1/freshness")
    assert (fresh["state"], fresh["why"]) == ("stale", "clients")
    (row,) = _get(gone, "/api/v1/overview")["devices"]
    assert (row["freshness"], row["stale"]) == ("stale", True)  # its pid is not connected


def test_history_being_written_is_catching_up(tmp_path):
    c = _client(V.vllm_store(tmp_path / "d.db", clients=0, rows_per_s=1500.0),
                V.NOW + 6 * 3600)
    c2 = create_app(CONFIG, V.vllm_store(tmp_path / "e.db", agent_ts=V.NOW + 6 * 3600 - 1,
                                         clients=0, rows_per_s=1500.0, seen_ts=V.NOW - 300),
                    clock=FakeClock(V.NOW + 6 * 3600)).test_client()
    assert _get(c, "/api/v1/freshness")["why"] == "agent"  # that report is 6 h old
    fresh = _get(c2, "/api/v1/freshness")
    assert (fresh["state"], fresh["stale"]) == ("catching_up", False)


# --- the server processes ---------------------------------------------------------------------
def test_each_server_with_kv_now_requests_per_minute_and_old_pids_ended(tmp_path):
    c = _client(V.vllm_store(tmp_path / "p.db"))
    procs = {p["pid"]: p for p in _get(c, "/api/v1/overview")["processes"]}
    live = procs[V.PID]
    assert (live["name"], live["model"], live["state"]) == (V.NAME, V.MODEL, "connected")
    # the newest KV reading is the idle sample: 0 of 63 blocks; 2 requests in the last minute
    assert (live["kv_blocks_used"], live["kv_blocks_total"], live["kv_usage_ratio"]) == (
        0, 63, 0.0)
    assert live["kv_at_s"] == V.IDLE2  # as of that reading
    assert live["requests_per_min"] == 2.0
    assert [procs[p]["state"] for p in V.OLD_PIDS] == ["ended", "ended"]
    assert [procs[p]["last_seen_s"] for p in V.OLD_PIDS] == [V.NOW - 3600, V.NOW - 1800]
    assert _get(c, "/api/v1/processes")["processes"] == list(procs.values())


def test_kv_usage_now_while_busy(tmp_path):
    c = _client(V.vllm_store(tmp_path / "b.db"), V.IDLE2)
    # at NOW-40 the newest sample is the idle one; one step before, 4 of 63 blocks
    store = V.vllm_store(tmp_path / "b2.db")
    store.write([V.kv(V.IDLE2 + 0.05, 7)])
    live = {p["pid"]: p for p in _get(_client(store, V.IDLE2 + 1), "/api/v1/overview")
            ["processes"]}[V.PID]
    assert (live["kv_blocks_used"], live["kv_usage_ratio"], live["kv_at_s"]) == (
        7, 7 / 63, V.IDLE2 + 0.05)
    assert {p["pid"]: p for p in _get(c, "/api/v1/overview")["processes"]}[V.PID][
        "requests_per_min"] == 2.0


# --- the timeline: steps, gaps, load ----------------------------------------------------------
def _figure(tmp_path):
    c = _client(V.vllm_store(tmp_path / "t.db"))
    start, end = V.WINDOW
    return _get(c, f"/api/v1/figures/timeline?device=0&start={start}&end={end}&max_points=300")


def _trace(fig, name):
    (t,) = [t for t in fig["data"] if t["name"] == name]
    return t


def test_kv_is_drawn_as_steps_with_a_gap_where_no_sample_exists(tmp_path):
    fig = _figure(tmp_path)
    used = _trace(fig, "KV blocks used")
    assert used["line"]["shape"] == "hv" and used["connectgaps"] is False
    points = list(zip(used["x"], used["y"]))
    # the usual spacing is a bucket (1 s): nothing drawn joins points further apart than
    # 2.5 of them, so nothing slopes (or holds) across the 51 s without samples
    assert fig["layout"]["meta"]["bucket_s"] == 1.0
    limit_ms = tl.GAP_FACTOR * 1.0 * 1000
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if y0 is not None and y1 is not None:
            assert x1 - x0 <= limit_ms, (x0, x1)
    gap = [x for x, y in points if y is None]
    assert len(gap) == 1 and V.IDLE1 * 1000 < gap[0] < V.BUSY2 * 1000
    before = [y for x, y in points if y is not None and x <= gap[0]]
    after = [y for x, y in points if y is not None and x > gap[0]]
    assert max(before) == 19 and before[-1] == 0  # busy peak, then the idle sample's 0
    assert after[0] == 4 and after[-1] == 0
    total = _trace(fig, "KV blocks total")
    assert total["line"]["shape"] == "hv" and set(total["y"]) == {63, None}


def test_running_waiting_and_preemptions_beside_kv(tmp_path):
    fig = _figure(tmp_path)
    ms = [t * 1000 for t, _, _ in V.LOAD]
    running, waiting = _trace(fig, "running requests"), _trace(fig, "waiting requests")
    # counts held from each change to the next (one event per change), as steps
    bucket_s = fig["layout"]["meta"]["bucket_s"]  # 1 s: the per-second grid of 300 asked
    assert running["x"] == ms + [(V.IDLE2 + bucket_s) * 1000]
    assert running["y"] == [3, 5, 0, 2, 0, 0]
    assert waiting["y"] == [2, 0, 0, 0, 0, 0]
    assert running["line"]["shape"] == "hv" and running["yaxis"] == "y8"
    bars = _trace(fig, "preemptions")
    assert (bars["x"], bars["y"]) == ([(V.NOW - 110) * 1000], [2])
    lane = fig["layout"]["yaxis8"]
    kv_lane = fig["layout"]["yaxis3"]
    assert lane["domain"][1] < kv_lane["domain"][0]  # right under the KV pool


def test_prefix_hits_by_vllms_definition_and_the_preempted_reuse_apart(tmp_path):
    fig = _figure(tmp_path)
    hits = _trace(fig, "prefix-cache hit tokens")
    reused = _trace(fig, "preempted re-use tokens (not hits to vLLM)")
    ms = [t * 1000 for t, _, _, _ in V.ALLOCS]
    assert (hits["x"], hits["y"]) == (ms, [32, 0, 16])
    assert (reused["x"], reused["y"]) == (ms, [0, 64, 0])
    assert hits["yaxis"] == reused["yaxis"] == "y9" and fig["layout"]["barmode"] == "stack"
    # the tokens looked up, as steps over the bars, and vLLM's hit rate over the window in
    # the lane's title: (32 + 16) / (80 + 48), the preempted re-use in neither
    queried = _trace(fig, "prefix-cache query tokens")
    assert queried["y"][:2] == [80, 0] and queried["yaxis"] == "y9"
    assert fig["layout"]["yaxis9"]["title"]["text"] == "prefix tokens<br>hits 37.5%"


def test_the_timeline_document_has_the_hit_rate_and_tokens_per_second(tmp_path):
    c = _client(V.vllm_store(tmp_path / "d.db"))
    start, end = V.WINDOW
    doc = _get(c, f"/api/v1/timeline?device=0&start={start}&end={end}&max_points=300")
    assert doc["bucket_s"] == 1.0
    prefix = doc["prefix_cache"]
    assert (prefix["query_tokens"], prefix["hit_rate"]) == ([80, 0, 48], 48 / 128)
    # 500 prompt tokens counted over the 10 s from NOW-120: 50 a second in each of its 1 s
    # buckets (not 500 in one); the instant's 100 in its own
    tokens = doc["tokens"]
    assert tokens["ts"] == [V.NOW - 120 + k for k in range(10)] + [V.NOW - 48]
    assert tokens["prompt_per_s"] == pytest.approx([50.0] * 10 + [100.0])
    assert tokens["generation_per_s"] == pytest.approx([20.0] * 10 + [40.0])
    fig = _figure(tmp_path)
    prompt = _trace(fig, "prompt tokens/s")
    assert prompt["yaxis"] == "y10"
    assert max(y for y in prompt["y"] if y is not None) == pytest.approx(100.0)
    assert fig["layout"]["yaxis10"]["title"]["text"] == "tokens/s"


def test_step_points_hold_end_and_break():
    xs, ys = tl.step_points([0.0, 1.0, 2.0, 60.0], [5, 7, 3, 4], [5, 2, 0, 4], 1.0)
    assert xs == [0.0, 1.0, 2.0, 3.0, 3.0, 60.0, 61.0]
    assert ys == [5, 7, 3, 0, None, 4, 4]


def test_token_counts_spread_over_their_stretch_and_what_came_before_the_window_is_not_its():
    from vramscope.agent.records import Event

    def tokens(ts, prompt, since):
        return Event(ts, "tokens", data={"prompt_tokens": prompt, "generation_tokens": 0,
                                         "since_s": since})

    got = tl.token_series([
        tokens(104.0, 40, 96.0),  # 8 s, half of them before the window: 20 tokens are its
        tokens(110.5, 7, "yesterday"),  # not a time: counted at its moment
        tokens(113.0, 9, 114.0),  # a stretch ending before it starts: likewise
    ], 100.0, 120.0, 2.0)
    assert got["ts"] == [100.0, 102.0, 110.0, 112.0]
    assert got["prompt_per_s"] == [5.0, 5.0, 3.5, 4.5]
    assert got["generation_per_s"] == [0.0] * 4


def test_a_pool_sampled_on_change_is_held_between_changes_and_breaks_only_when_silent():
    # the vLLM plugin's samples: steps 10 ms apart while the pool changes, 0.1 s apart while it
    # holds (sampling.kv_interval_s), then 29.5 s of silence (idle) in 10 ms buckets
    ts = [0.0, 0.01, 0.02, 0.03, 0.13, 0.23, 0.24, 0.25, 0.35, 0.45, 30.0, 30.01]
    used = [1, 2, 3, 4, 4, 4, 5, 6, 6, 0, 2, 3]
    assert tl.gap_after_s(ts, 0.01) == pytest.approx(2.5 * 0.01)  # the median spacing's
    assert tl.gap_after_s(ts, 0.01, held_s=0.1) == pytest.approx(2.5 * 0.1)
    assert tl.step_points(ts, used, None, 0.01)[1].count(None) == 5  # each hold, the silence
    xs, ys = tl.step_points(ts, used, None, 0.01, held_s=0.1)
    assert [y for y in ys if y is None] == [None]  # the one gap: the silence
    assert ys[:ys.index(None)] == used[:10] + [0] and ys[ys.index(None) + 1:] == [2, 3, 3]


def test_a_buckets_values_stand_where_they_were_read():
    # 10 ms buckets, each with a step's peak then its end (what /metrics publishes), read at
    # +7 ms; the next bucket follows at once: the line still holds each end from its moment
    # (the third bucket's one reading, 5 at +24 ms, is drawn from then: 8 holds until it)
    xs, ys = tl.step_points([0.0, 0.01, 0.02], [9, 10, 5], [7, 8, 5], 0.01,
                            last_ts=[0.007, 0.017, 0.024])
    assert list(zip(xs, ys)) == [(0.0, 9), (0.007, 7), (0.01, 10), (0.017, 8), (0.024, 5),
                                 (0.03, 5)]
    # without the moments: as before, peaks from each bucket's start
    assert tl.step_points([0.0, 0.01], [9, 10], [7, 8], 0.01)[1] == [9, 10, 8]
