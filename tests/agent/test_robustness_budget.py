"""A write budget per client (issue 45, item 5): one client writing custom events got 12.7 MB/s
accepted (about 1 TB a day, kept with the rollups for 90 days). Each connection may write
``agent.client_max_rows_per_s`` rows and ``agent.client_max_bytes_per_s`` bytes a second, in
bursts of ``agent.client_budget_burst_s``; beyond, records are refused and counted by reason,
and other clients are unaffected. On the agent's clock (a FakeClock here)."""

from __future__ import annotations

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.ingest import protocol as proto
from vramscope.agent.ingest.budget import STORED_ROW_BYTES, Overdraft, WriteBudget
from vramscope.agent.ingest.connection import AgentConnection
from vramscope.agent.records import Event, Phase, Sample

from tests.support.live_agent import OTHER_PID, OtherProcess, running_agent

NOW = 1_700_000_000.0
ROWS_PER_S = 1000.0
BYTES_PER_S = 256 * 1024.0
BURST_S = 2.0
BLOB = "x" * 60_000  # a custom event's data: the flood sent events this fat


def test_a_bucket_gives_its_burst_then_its_rate():
    budget = WriteBudget(rows_per_s=10, bytes_per_s=1000, burst_s=2)
    bucket = budget.bucket(0.0)
    assert budget.take(bucket, 25, 250, 0.0) == (20, Overdraft(5, "budget_rows"))
    assert budget.take(bucket, 1, 10, 0.0) == (0, Overdraft(1, "budget_rows"))
    assert budget.take(bucket, 10, 100, 0.5) == (5, Overdraft(5, "budget_rows"))  # 0.5 s: 5
    assert budget.take(bucket, 5, 5000, 100.0) == (2, Overdraft(3, "budget_bytes"))  # 1000 B each
    assert budget.take(bucket, 0, 0, 100.0) == (0, None)


def test_a_bad_budget_is_refused_with_its_values():
    with pytest.raises(ValueError, match="rows_per_s, bytes_per_s and burst_s > 0, got 0"):
        WriteBudget(rows_per_s=0)


@pytest.fixture
def clock():
    return FakeClock(NOW)


@pytest.fixture
def agent(any_url, short_dir, clock):
    """SQLite and PostgreSQL: what the budget keeps is what the database grows by."""
    settings = {"agent": {"client_max_rows_per_s": ROWS_PER_S,
                          "client_max_bytes_per_s": BYTES_PER_S,
                          "client_budget_burst_s": BURST_S}}
    with running_agent(any_url, short_dir, clock, settings) as a:
        yield a


def _fat_events(n: int, pid: int) -> list[Event]:
    return [Event(NOW, "custom", 0, pid, data={"blob": BLOB}) for _ in range(n)]


def _samples(n: int, pid: int, start: float = NOW) -> list[Sample]:
    return [Sample(start + i * 1e-3, 0, Phase.DECODE, "torch", pid, allocated_bytes=i)
            for i in range(n)]


def test_a_flooding_client_is_held_to_its_budget_and_a_neighbour_is_not_touched(agent, clock):
    """Fat custom events for 5 s of the agent's clock: the flooder keeps its burst plus 5 s of
    its rate in bytes; the neighbour, sending samples at the same time, keeps all of them; the
    database grows by no more than the documented bound (``growth_bound_bytes``: the flooder's
    budget, each row at most its bytes plus ``STORED_ROW_BYTES``; the neighbour's rows at
    that cost). Before the budget the flooder's 19 MB were all kept."""
    agent.writer.flush()
    size_before = agent.store.size_bytes()
    # the neighbour: another process (a budget is per process: the test's own connections
    # share one), connected throughout
    with OtherProcess(agent.socket_path, "good") as good, \
            AgentConnection(agent.socket_path) as flood:
        flood.hello("flood")
        for second in range(5):
            for _ in range(4):  # 4 x 16 events x 60 kB: about 3.8 MB a second, 15x the budget
                flood.send(proto.records_message(_fat_events(16, 7001)))
            good.send("samples", 500, NOW + second)
            flood.status()
            clock.advance(1.0)
        status = flood.status()
    agent.writer.flush()
    events = agent.store.events(None, names=["custom"])
    kept_bytes = sum(len(BLOB) for _ in events)
    allowed = BYTES_PER_S * (BURST_S + 5)
    print(f"flooder: {len(events)} of 320 events kept ({kept_bytes} bytes; budget {allowed:g})")
    assert 0 < kept_bytes <= allowed
    assert status["rejected"]["budget_bytes"] == 320 - len(events)
    assert sum(1 for s in agent.store.samples(device=None) if s.pid == OTHER_PID) == 2500
    grown = agent.store.size_bytes() - size_before
    bound = (WriteBudget(ROWS_PER_S, BYTES_PER_S, BURST_S).growth_bound_bytes(5.0)
             + 2500 * STORED_ROW_BYTES)
    print(f"database grew {grown} bytes; bound {bound:g}")
    assert grown <= bound


def test_reconnecting_or_a_second_connection_does_not_multiply_the_budget(agent, clock):
    """A budget is its process's: a flooder that spent its burst and connects again, or opens a
    second connection beside the first, gets no fresh burst (before, each connection had one:
    reconnecting after each burst multiplied it); after ``burst_s`` its bucket is full again.
    Another process has its own."""
    burst = int(ROWS_PER_S * BURST_S)

    def send(n: int, start: float) -> dict:
        with AgentConnection(agent.socket_path) as conn:
            conn.hello("flood")
            conn.send_records(_samples(n, 7005, start))
            return conn.status()["rejected"]

    assert send(burst, NOW) == {}  # the burst, all kept
    assert send(100, NOW + 3) == {"budget_rows": 100}  # connected again: nothing left
    with AgentConnection(agent.socket_path) as first, \
            AgentConnection(agent.socket_path) as second:
        for i, conn in enumerate((first, second)):
            conn.hello(f"flood-{i}")
            conn.send_records(_samples(50, 7005, NOW + 4 + i))
        assert second.status()["rejected"] == {"budget_rows": 200}
    with OtherProcess(agent.socket_path, "good") as other:  # its own burst: all kept
        assert other.send("samples", burst, NOW + 5) == {"budget_rows": 200}  # the flooder's
    clock.advance(BURST_S)  # the flooder's bucket is full again
    assert send(burst, NOW + 6) == {"budget_rows": 200}
    agent.writer.flush()
    stored = agent.store.samples(device=None)
    assert (sum(s.pid == 7005 for s in stored), sum(s.pid == OTHER_PID for s in stored)) == (
        2 * burst, burst)


def test_rows_beyond_the_rate_are_refused_and_counted(agent, clock):
    with AgentConnection(agent.socket_path) as conn:
        conn.hello("fast")
        conn.send_records(_samples(int(ROWS_PER_S * BURST_S) + 300, 7003))
        first = conn.status()
        clock.advance(1.0)
        conn.send_records(_samples(int(ROWS_PER_S), 7003, NOW + 10))
        second = conn.status()
    assert first["rejected"] == {"budget_rows": 300}
    assert second["rejected"] == {"budget_rows": 300}  # a second's rate refilled: all kept


def test_metrics_count_the_refusals_by_reason(sqlite_url, short_dir, clock):
    """``/metrics`` says which limit is hit (the Overview's health table shows the total)."""
    import socket
    import urllib.request

    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = {"agent": {"metrics_port": port, "client_max_rows_per_s": 100.0,
                          "client_budget_burst_s": 1.0}}
    with running_agent(sqlite_url, short_dir, clock, settings) as a:
        with AgentConnection(a.socket_path) as conn:
            conn.hello("fast")
            conn.send_records(_samples(130, 7004))
            conn.status()
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    assert ('vramscope_agent_rejected_by_reason_total{reason="budget_rows"} 30.0'
            in text.decode().splitlines())
