"""Limits on live names, not names ever seen (issue 45, item 1): 260 short-lived processes of
one uid, one record each, spent ``agent.max_processes`` for the agent's whole life, and a new
server then had 0 of 100 records stored until the agent restarted. A name frees its slot when
the connections that sent it close, or when it has been silent for ``agent.name_idle_s``."""

from __future__ import annotations

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.ingest.connection import AgentConnection
from vramscope.agent.ingest.names import EVER_FACTOR, ClientNames, Counts, NameLimits
from vramscope.agent.records import Phase, Sample
from vramscope.agent.store import Store

from tests.support.live_agent import running_agent

NOW = 1_700_000_000.0
IDLE_S = 300.0


def _s(pid: int, device: int = 0, host: str | None = None, ts: float = NOW) -> Sample:
    return Sample(ts, device, Phase.DECODE, "torch", pid, allocated_bytes=1, host=host)


@pytest.fixture
def clock():
    return FakeClock(NOW)


@pytest.fixture
def agent(any_url, short_dir, clock):
    """SQLite and PostgreSQL: the new server's records are stored, not only admitted."""
    with running_agent(any_url, short_dir, clock, {"agent": {"name_idle_s": IDLE_S}}) as a:
        yield a


def _short_lived(path: str, records: list[Sample]) -> dict:
    """A process that connects, sends its records and exits (its connection closes). The
    records name their pid, as a replay's do: this test is one process."""
    with AgentConnection(path) as conn:
        conn.hello("short-lived")
        conn.send_records(records)
        return conn.status()


def _stored(store: Store, pid: int) -> int:
    return sum(1 for s in store.samples(device=None) if s.pid == pid)


def test_short_lived_processes_free_their_slots_and_a_new_server_stores_everything(agent):
    """1,000 servers that came and went (restarts, replays): a new one stores 100 %."""
    path = agent.socket_path
    for i in range(1000):
        _short_lived(path, [_s(10_000 + i)])
    new_server = [_s(99_999, ts=NOW + k * 0.01) for k in range(100)]
    status = _short_lived(path, new_server)
    agent.writer.flush()
    assert _stored(agent.store, 99_999) == 100
    assert "names" not in status["rejected"]
    assert status["names"]["live"]["processes"] == 1  # its own: the 1,000 others closed


def test_a_long_connection_frees_the_names_it_stopped_sending(agent, clock):
    """One open connection (a supervisor that reports for its workers, a long replay) sends
    for 256 pids, which then go silent: after agent.name_idle_s a new pid is admitted."""
    with AgentConnection(agent.socket_path) as conn:
        conn.hello("supervisor")
        for base in range(0, 256, 64):  # the client's own bound: 64 new processes at a time
            conn.send_records([_s(20_000 + base + i) for i in range(64)])
            conn.status()  # handled before the clock moves
            clock.advance(IDLE_S)  # those 64 fall silent; the next 64 may be created
        clock.advance(1.0)
        conn.send_records([_s(30_000)])
        status = conn.status()
    assert "names" not in status["rejected"]
    assert status["names"]["live"]["processes"] == 1


def test_a_live_name_keeps_its_slot_and_a_full_table_still_refuses(clock):
    """Live names hold: at the bound, a new name is refused until one goes silent; each
    refusal is counted by kind."""
    limits = NameLimits(Counts(8, 32, 4), Counts(2, 16, 64), idle_s=IDLE_S, clock=clock)
    holder = ClientNames()
    kept, refused = limits.admit([_s(p) for p in range(4)], holder)
    assert len(kept) == 4 and refused is None
    clock.advance(IDLE_S - 1)
    kept, _ = limits.admit([_s(0)], holder)  # pid 0 still sends; 1-3 are silent
    _, refused = limits.admit([_s(9)], ClientNames())
    assert refused is not None and refused.reason == "processes"
    clock.advance(1.0)
    kept, refused = limits.admit([_s(13), _s(14), _s(15), _s(16)], ClientNames())
    assert [r.pid for r in kept] == [13, 14, 15] and refused is not None  # 1-3 freed, 0 held
    assert limits.processes == {(None, 0), (None, 13), (None, 14), (None, 15)}
    assert limits.status()["refused"] == {"processes": 2}


def test_closing_frees_only_the_names_no_other_open_connection_sends(clock):
    limits = NameLimits(idle_s=IDLE_S, clock=clock)
    a, b = ClientNames(), ClientNames()
    limits.admit([_s(1), _s(2)], a)
    limits.admit([_s(2), _s(3)], b)  # pid 2 is sent by both
    limits.release(a)
    assert limits.processes == {(None, 2), (None, 3)}
    limits.release(b)
    assert limits.counts == Counts(0, 0, 0)


def test_device_and_host_churn_stays_bounded_per_agent_run(clock):
    """Devices and hosts are store rows every page reads: live limits let churn through, so
    one agent run creates at most EVER_FACTOR x the bound of distinct ones; known ones are
    always free."""
    limits = NameLimits(Counts(8, 4, 256), Counts(2, 16, 64), idle_s=IDLE_S, clock=clock)
    created = 0
    for round_ in range(10):
        client = ClientNames()
        kept, _ = limits.admit([_s(1, device=100 * round_ + d) for d in range(4)], client)
        created += len(kept)
        limits.release(client)
    assert created == EVER_FACTOR * 4
    client = ClientNames()
    kept, refused = limits.admit([_s(1, device=0), _s(1, device=999)], client)
    assert [r.device for r in kept] == [0] and refused is not None
    assert refused.reason == "devices_per_run"
    assert "16 distinct devices were created since the agent started" in limits.describe(refused)


def test_bad_idle_setting_is_refused_with_its_value():
    with pytest.raises(ValueError, match="agent.name_idle_s must be > 0 s, got 0"):
        NameLimits(idle_s=0)


def test_status_shows_the_live_names_and_what_was_refused(agent):
    from vramscope.agent.cli.cmd_status import render

    with AgentConnection(agent.socket_path) as conn:
        conn.hello("many pids")
        conn.send_records([_s(50_000 + i) for i in range(70)])  # 6 over the client's 64
        status = conn.status()
        assert status["names"]["live"] == {"hosts": 0, "devices": 1, "processes": 64}
        assert status["names"]["refused"] == {"processes_per_client": 6}
        text = render({**status, "running": True, "socket": agent.socket_path})
    assert ("live names: 0/8 hosts, 1/32 devices, 64/256 processes (idle after 300 s); "
            "refused records: processes_per_client 6") in text


def test_each_refused_record_is_counted_under_its_own_bound(clock):
    limits = NameLimits(Counts(8, 1, 256), Counts(2, 16, 3), idle_s=IDLE_S, clock=clock)
    kept, refused = limits.admit([_s(1), _s(2), _s(3), _s(4), _s(1, device=1)], ClientNames())
    assert [(r.device, r.pid) for r in kept] == [(0, 1), (0, 2), (0, 3)] and refused is not None
    assert limits.status()["refused"] == {"processes_per_client": 1, "devices": 1}
