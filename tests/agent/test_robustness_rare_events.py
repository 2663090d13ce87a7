"""Events kept with the rollups, bounded per client process per UTC day (issue 45, item 5).

The write budget bounds a client's rate, but the events of the kept class (agent/event_kinds.py)
are kept as long as the rollups (90 days): a client writing them at its budget's rate would fill
the disk for 90 days. Names the event table does not list are cheap (deleted after
retention.raw_s), so they are not counted. Each client process may have
``agent.client_max_rare_events_per_day`` of them stored per UTC day of the agent's clock;
beyond, they are refused and counted (``rare_events_day``), its samples and cheap events still
stored, other clients unaffected.
On the agent's clock (a FakeClock here)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.config import parse_config
from vramscope.agent.durations import DAY_S
from vramscope.agent.errors import ConfigError
from vramscope.agent.event_kinds import CHEAP_EVENTS, is_kept
from vramscope.agent.ingest import protocol as proto
from vramscope.agent.ingest.connection import AgentConnection
from vramscope.agent.ingest.rare_events import (
    DEFAULT_MAX_PER_DAY,
    RareEventsPerDay,
    RareRefusal,
)
from vramscope.agent.records import Event, Phase, PostMortem, Sample
from vramscope.agent.settings import SETTINGS_BY_KEY
from vramscope.agent.trace import read_trace

from tests.support.live_agent import OTHER_PID, OtherProcess, running_agent

NOW = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
NEXT_DAY = (NOW // DAY_S + 1) * DAY_S  # 2023-11-15 00:00:00 UTC, 6,400 s later
CAP = 40


def _rare(n: int, pid: int, ts: float, name: str = "server_load") -> list[Event]:
    return [Event(ts + i * 1e-3, name, 0, pid, data={"i": i}) for i in range(n)]


def _postmortem(pid: int, ts: float) -> PostMortem:
    return PostMortem(ts, 0, pid, Phase.DECODE, 1, 1, 1, 1, 1, 1, 0.5)


def _samples(n: int, pid: int, ts: float) -> list[Sample]:
    return [Sample(ts + i * 1e-3, 0, Phase.DECODE, "torch", pid, allocated_bytes=i)
            for i in range(n)]


def test_the_cap_keeps_the_first_rare_events_of_the_day_and_passes_the_rest():
    clock = FakeClock(NOW)
    cap = RareEventsPerDay(3, clock)
    frequent = Event(NOW, "kv_alloc", 0, 1, request_id="r1")
    sample = _samples(1, 1, NOW)[0]
    rare = _rare(4, 1, NOW, "kv_preempted")
    records = [sample, rare[0], frequent, rare[1], rare[2], rare[3], sample]
    assert cap.admit("a", records) == ([sample, rare[0], frequent, rare[1], rare[2], sample],
                                       RareRefusal(1, 3))

    assert cap.admit("a", [rare[0], sample]) == ([sample], RareRefusal(1, 3))
    assert cap.admit("a", [frequent, sample]) == ([frequent, sample], None)
    assert cap.admit("b", rare[:3]) == (rare[:3], None)  # another process: its own count
    clock.advance(NEXT_DAY - NOW - 1)  # 23:59:59: still the same UTC day
    assert cap.admit("a", rare[:1]) == ([], RareRefusal(1, 3))
    clock.advance(1)  # midnight UTC: every count starts again
    assert cap.admit("a", rare) == (rare[:3], RareRefusal(1, 3))
    assert len(cap) == 1  # yesterday's processes are forgotten


def test_a_name_the_event_table_does_not_list_is_cheap_and_never_counted():
    """A client's own name goes with the raw samples (agent/event_kinds.py), so the cap that
    bounds 90 days of kept events lets it pass, however many."""
    cap = RareEventsPerDay(2, FakeClock(NOW))
    custom = _rare(5, 1, NOW, "my_custom_event")
    assert cap.admit("a", custom) == (custom, None)
    assert cap.admit("a", _rare(3, 1, NOW)) == (_rare(2, 1, NOW), RareRefusal(1, 2))
    assert cap.admit("a", custom) == (custom, None)


def test_memory_is_bounded_by_forgetting_the_least_recently_counted():
    cap = RareEventsPerDay(2, FakeClock(NOW), max_kept=3)
    one = _rare(1, 1, NOW)
    for process in ("a", "b", "c"):
        cap.admit(process, one)
    cap.admit("a", one)  # a is at its cap, and the most recently counted
    cap.admit("d", one)  # b, the least recently counted, is forgotten
    assert len(cap) == 3
    assert cap.admit("a", one) == ([], RareRefusal(1, 2))
    assert cap.admit("b", one + one) == (one + one, None)  # forgotten: counted from 0 again


@pytest.mark.parametrize("value", [0, -5, "many", 2.5])
def test_a_bad_cap_is_a_config_error_naming_the_key(value):
    with pytest.raises(ConfigError, match="agent.client_max_rare_events_per_day"):
        parse_config({"agent": {"client_max_rare_events_per_day": value}}, "vramscope.toml", {})


def test_the_class_refuses_a_bad_cap_with_its_value():
    with pytest.raises(ValueError, match="must be an integer >= 1, got 0"):
        RareEventsPerDay(0)


@pytest.fixture
def clock():
    return FakeClock(NOW)


@pytest.fixture
def agent(any_url, short_dir, clock):
    settings = {"agent": {"client_max_rare_events_per_day": CAP}}
    with running_agent(any_url, short_dir, clock, settings) as a:
        yield a


def test_a_client_at_its_cap_keeps_its_samples_and_a_neighbour_and_the_next_day_are_free(
        agent, clock):
    """The client's 40 rare events of the day are stored; from the 41st they are refused and
    counted, while its samples and frequent events in the same messages are all stored;
    another process stores its own 40; after midnight UTC the client has 40 again. A
    post-mortem (kept longer still) counts as one such event."""
    pid = 7001
    with AgentConnection(agent.socket_path) as conn:
        conn.hello("flood")
        conn.send(proto.postmortem_message(_postmortem(pid, NOW - 1)))  # the 1st
        conn.send_records(_rare(CAP - 2, pid, NOW) + _samples(10, pid, NOW))
        conn.send_records(_rare(1, pid, NOW + 1) + _samples(10, pid, NOW + 1))  # the 40th
        assert conn.status()["rejected"] == {}
        conn.send_records(_rare(1, pid, NOW + 2) + _samples(10, pid, NOW + 2)  # the 41st
                          + [Event(NOW + 2, "request_start", 0, pid, request_id="r")])
        assert conn.status()["rejected"] == {"rare_events_day": 1}
        conn.send_records(_rare(25, pid, NOW + 3, "oom") + _samples(10, pid, NOW + 3))
        assert conn.status()["rejected"] == {"rare_events_day": 26}
        conn.send(proto.postmortem_message(_postmortem(pid, NOW + 4)))
        assert conn.status()["rejected"] == {"rare_events_day": 27}
    with OtherProcess(agent.socket_path, "neighbour") as neighbour:  # the cap is per process
        assert neighbour.send("oom", CAP + 2, NOW + 4) == {"rare_events_day": 27 + 2}
    clock.advance(NEXT_DAY - NOW)
    with AgentConnection(agent.socket_path) as conn:
        conn.hello("flood")
        conn.send_records(_rare(CAP + 5, pid, NEXT_DAY))
        status = conn.status()
    assert status["rejected"] == {"rare_events_day": 27 + 2 + 5}
    agent.writer.flush()
    events = agent.store.events(None, names=["server_load", "oom", "request_start"])
    yesterday = [e for e in events if e.pid == pid and e.ts_s < NEXT_DAY]
    assert sorted(e.ts_s for e in yesterday if e.name != "request_start") == sorted(
        e.ts_s for e in _rare(CAP - 2, pid, NOW) + _rare(1, pid, NOW + 1))
    assert [pm.ts_s for _, pm in agent.store.postmortems()] == [NOW - 1]
    assert sum(e.name == "request_start" for e in yesterday) == 1  # frequent: not capped
    assert sum(e.pid == OTHER_PID for e in events) == CAP
    assert sum(e.pid == pid and e.ts_s >= NEXT_DAY for e in events) == CAP
    assert sum(s.pid == pid for s in agent.store.samples(device=None)) == 40


def test_a_recorded_vllm_server_stays_far_below_the_default_cap_a_day():
    """The default is one a real server does not reach: the recorded vLLM run (42 s under
    load, prefix caching on) has 38 events kept with the rollups (17 server_load, 20
    prefix_cache, 1 process_rank), under 80,000 a day at that rate. Its 386 kv_evicted, one a
    step that evicted cached blocks, are frequent: kept with the rollups they alone would be
    about 800,000 a day, over the cap."""
    recording = Path(__file__).resolve().parents[1] / "data" / "vllm_idle_server.jsonl.gz"
    trace = read_trace(str(recording))
    kept = Counter(e.name for e in trace.events if is_kept(e.name))
    assert kept == {"server_load": 17, "prefix_cache": 20, "process_rank": 1}
    times = [r.ts_s for r in [*trace.samples, *trace.events]]
    per_day = sum(kept.values()) / (max(times) - min(times)) * DAY_S
    evicted = sum(e.name == "kv_evicted" for e in trace.events)
    assert evicted == 386 and "kv_evicted" in CHEAP_EVENTS
    assert SETTINGS_BY_KEY["agent.client_max_rare_events_per_day"].default == DEFAULT_MAX_PER_DAY
    assert per_day < 80_000 < DEFAULT_MAX_PER_DAY < evicted / sum(kept.values()) * per_day
