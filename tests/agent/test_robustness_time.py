"""Record times the agent, the store and the pages must survive (issue 32, items 1, 2, 6).

- a live client's records outside a window around the agent's clock are refused one by one and
  counted (``rejected["ts"]``), on the socket and in the Prometheus source;
- ``import`` (the trace validator) keeps a trace's own times but refuses those no store or page
  can represent (before 1970, after year 9999);
- rows with extreme times already stored (an older agent, a hand edit) stop neither retention
  nor any dashboard route, and future ones are deleted;
- strings with NUL are refused at ingest (PostgreSQL cannot store them in text).
"""

from __future__ import annotations

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.config import parse_config
from vramscope.agent.errors import TraceError
from vramscope.agent.ingest import protocol as proto
from vramscope.agent.ingest.connection import AgentConnection
from vramscope.agent.ingest.timewindow import TimeWindow
from vramscope.agent.records import Event, Phase, PostMortem, Sample
from vramscope.agent.retention import Retention
from vramscope.agent.sources.prometheus import PrometheusSource
from vramscope.agent.store import Store
from vramscope.agent.timefmt import iso_utc
from vramscope.agent.trace import parse_lines, record_from_json

from tests.support.live_agent import running_agent
from tests.support.rollup_rows import read_rollups
from tests.support.waiting import wait_for

NOW = 1_700_000_040.0 + 3600  # a minute boundary
EXTREMES = [-1e300, 0.0, 1e12, 253402300800.0, 1e308]
HOST = "node-a"


def _good(n: int = 600, device: int = 4) -> list[Sample]:
    """``n`` samples a second apart, ending now."""
    return [Sample(NOW - n + i, device, Phase.DECODE, "torch", 11, allocated_bytes=1000 + i,
                   reserved_bytes=2000 + i) for i in range(n)]


# --- stored extremes: every route answers, retention advances -------------------------------
def _get_routes(app):
    return sorted(r.rule for r in app.url_map.iter_rules()
                  if "GET" in r.methods and "<" not in r.rule)


@pytest.mark.parametrize("extreme", EXTREMES)
def test_an_extreme_stored_time_breaks_no_route_and_retention_advances(any_url, extreme):
    from vramscope.dashboard.app import create_app

    store = Store.open(any_url, host_name=HOST)
    try:
        store.write(_good())
        # behind the validators' back, as an older agent or a hand edit could have stored them
        store.write([Sample(extreme, 0, Phase.DECODE, "torch", 12, allocated_bytes=1)],
                    [Event(extreme, "oom", 0, 12, None, None, {"message": "x"})])
        clock = FakeClock(NOW)
        app = create_app(parse_config({}, None, {}), store, clock=clock)
        client = app.test_client()
        failed = []
        for rule in _get_routes(app):
            for query in ({}, {"host": HOST, "device": 0}, {"host": HOST, "device": 4}):
                reply = client.get(rule, query_string=query)
                if reply.status_code >= 500:
                    failed.append((rule, query, reply.status_code))
        assert failed == []
        fresh = client.get("/api/v1/freshness").get_json()
        # a row from the future neither makes the data look live for good nor stale: the
        # newest sample not ahead of the clock is read (issue 45, item 9)
        assert (fresh["stale"], fresh["newest_ts_s"]) == (False, NOW - 1)

        retention = Retention(raw_s=60, rollup_s=86400, step_rows=10_000, clock=clock)
        for _ in range(10):
            retention.step(store)
        minutes = {r["bucket_s"] for r in read_rollups(store)}
        assert minutes == {NOW - 600 + 60 * k for k in range(8)}  # up to now - grace (120 s)
        kept = [s.ts_s for s in store.samples(device=None)]
        # raw rows go once rolled up and older than raw_s; the extreme row goes too: the old
        # ones by age, the future ones as a wrong clock's
        assert min(kept) == NOW - 120 and len(kept) == 120
        assert [e.ts_s for e in store.events(None)] == []
        assert client.get("/api/v1/freshness").get_json()["stale"] is False
    finally:
        store.close()


def test_iso_utc_shows_times_no_datetime_can_hold():
    assert iso_utc(1e12) == "year>9999 (1e+12 s)"
    assert iso_utc(-62135596800.0) == "year<1970 (-6.21356e+10 s)"
    assert iso_utc(253402300799.0) == "9999-12-31T23:59:59.000Z"
    assert iso_utc(0.0, ms=False) == "1970-01-01T00:00:00Z"


# --- import: a trace's own times, but only representable ones --------------------------------
@pytest.mark.parametrize("ts", ["-1", "-1e300", "1e12", "253402300800", "1e308"])
def test_a_trace_line_timed_outside_1970_to_9999_is_refused_with_its_line(ts):
    lines = ['{"ts": 1700000000, "allocated_bytes": 1}', f'{{"ts": {ts}, "allocated_bytes": 2}}']
    with pytest.raises(TraceError) as err:
        parse_lines(iter(lines), "t.jsonl")
    assert str(err.value).startswith("t.jsonl:2: 'ts' must be Unix seconds from 0 (1970) to "
                                     "253402300799 (9999-12-31), got ")


def test_a_trace_keeps_its_own_old_times():
    assert record_from_json({"ts": 0, "allocated_bytes": 1}).ts_s == 0.0
    assert record_from_json({"ts": 253402300799, "event": "x"}).ts_s == 253402300799.0


@pytest.mark.parametrize("ts", [-1.0, 1e12, 1e308])
def test_the_fast_path_refuses_what_the_validator_refuses(ts):
    batch = {"records": [{"ts": NOW, "allocated_bytes": 1}, {"ts": ts, "allocated_bytes": 2}]}
    with pytest.raises(proto.ProtocolError) as err:
        proto.parse_records(batch)
    assert err.value.reason == "schema" and "record 1: 'ts' must be Unix seconds" in str(err.value)


# --- the live window: socket and Prometheus -----------------------------------------------------
def test_the_window_defaults_to_the_raw_retention_and_five_minutes_ahead():
    clock = FakeClock(NOW)
    window = TimeWindow.from_config(parse_config({"retention": {"raw_s": 3600}}, None, {}),
                                    clock)
    assert window.bounds() == (NOW - 3600, NOW + 300)
    assert TimeWindow.from_config(parse_config({"agent": {"max_record_age_s": 60}}, None, {}),
                                  clock).bounds() == (NOW - 60, NOW + 300)


@pytest.fixture
def live_agent(any_url, short_dir):
    settings = {"retention": {"raw_s": 600}}
    with running_agent(any_url, short_dir, FakeClock(NOW), settings, host=HOST) as agent:
        yield agent


def _sample(ts: float, **kw) -> dict:
    return {"ts": ts, "device": 0, "source": "torch", "allocated_bytes": 7, **kw}


def test_records_outside_the_window_are_refused_alone_and_counted(live_agent):
    batch = [_sample(NOW - 10), _sample(-0.0), _sample(NOW - 601), _sample(NOW + 301),
             _sample(NOW + 299)]
    pm = PostMortem(NOW - 5000, 0, 1, Phase.DECODE, 1, 1, 1, 1, 1, 1, 0.5)
    with AgentConnection(live_agent.socket_path) as conn:
        conn.hello("t", devices=[0])
        conn.send(proto.frame({"type": "records", "records": batch}))
        conn.send(proto.postmortem_message(pm))
        status = conn.status()
    assert status["rejected"] == {"ts": 4}  # three records, the post-mortem
    live_agent.writer.flush()
    assert sorted(s.ts_s for s in live_agent.store.samples(device=None)) == [NOW - 10, NOW + 299]
    assert live_agent.store.postmortems() == []


def test_the_prometheus_source_refuses_records_outside_the_agents_window():
    """The source stamps records with its clock; one that is not the agent's (stepped between
    two reads) is refused and counted like a client's."""
    got: list = []
    page = "vllm:num_requests_running 2 99999999999999\nvllm:num_requests_waiting 0\n"
    agent_clock = FakeClock(NOW)
    source = PrometheusSource(["http://x/metrics"], "vllm", got.extend,
                              clock=FakeClock(NOW + 3600), fetch=lambda url, t: page,
                              window=TimeWindow(600, 300, agent_clock))
    assert source.run_once() == 0 and got == [] and source.rejected_ts_total == 3
    config = parse_config({"sources": {"prometheus": {"targets": "http://x/metrics"}}}, None, {})
    made = PrometheusSource.from_config(config, got.extend, agent_clock)
    assert made is not None and made.window is not None
    assert made.window.bounds() == (NOW - 86400, NOW + 300)


# --- NUL in strings ---------------------------------------------------------------------------
NUL_RECORDS = [_sample(NOW, source="to\x00rch"), _sample(NOW, host="no\x00de"),
               {"ts": NOW, "event": "re\x00quest_start"},
               {"ts": NOW, "event": "request_start", "request_id": "r\x00"},
               {"ts": NOW, "event": "x", "note": "a\x00b"}]


@pytest.mark.parametrize("record", NUL_RECORDS)
def test_a_nul_in_any_string_is_refused_at_ingest_and_nothing_is_lost(live_agent, record):
    with AgentConnection(live_agent.socket_path) as conn:
        conn.hello("t", devices=[0])
        conn.send(proto.frame({"type": "records", "records": [record]}))
        conn.send(proto.frame({"type": "records", "records": [_sample(NOW - 1)]}))
        status = conn.status()
    assert status["rejected"] == {"schema": 1}
    live_agent.writer.flush()
    wait_for(lambda: live_agent.writer.stats.written_total >= 1, 5)
    assert [s.ts_s for s in live_agent.store.samples(device=None)] == [NOW - 1]
    assert live_agent.store.events(None) == []
    assert live_agent.writer.stats.refused_total == 0


def test_a_hello_with_a_nul_is_refused():
    with pytest.raises(proto.ProtocolError, match="'process' .* NUL character"):
        proto.parse_hello({"type": "hello", "protocol": 1, "pid": 1, "process": "py\x00"})
