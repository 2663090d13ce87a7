"""A fleet on one PostgreSQL: every agent rolls up and compacts its own host's devices; exactly
one agent at a time does the store-wide work (deletion by age, partitions, and the rollups and
compaction of hosts whose agents are gone), the one holding the advisory lock of
vramscope.agent.store.store_wide_lock. When the leader stops, is killed or loses its session,
another agent takes over where it stopped, and the rows of a host that disappeared are rolled
up by the leader and go by age like any other.

Real parts: a real PostgreSQL server, one Store (its own connection pool, so its own sessions)
per agent as each agent process has, and for the killed leader a real second process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import text
from vramscope.agent.clock import FakeClock
from vramscope.agent.records import Phase, Sample
from vramscope.agent.retention import HOST_GONE_S, Retention, StepResult
from vramscope.agent.store import Store
from vramscope.agent.store.store_wide_lock import STORE_WIDE_LOCK_KEY

from tests.support.rollup_rows import read_rollups

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_700_000_040.0  # a minute boundary
MINUTES = 6
NOW = T0 + 20 * 60  # every minute written is past the two minutes' grace
NOTHING = StepResult(0, 0, {}, 0)  # a step of an agent that does not lead, with nothing late
# the documented look-up of the leader's session (docs/agent.md)
# advisory locks are per database: the server's other databases have leaders of their own
LEADER_PID = text("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                  "AND database = (SELECT oid FROM pg_database "
                  "WHERE datname = current_database()) "
                  "AND (classid::bigint << 32 | objid::bigint) = 8534991366535737200")


def _write_minutes(store: Store) -> None:
    store.write([Sample(T0 + 60 * m + 10, d, Phase.UNKNOWN, "nvml", device_used_bytes=m,
                        device_total_bytes=100)
                 for m in range(MINUTES) for d in (0, 1)])


def _retention(clock: FakeClock | None = None) -> Retention:
    return Retention(raw_s=600, rollup_s=86400, step_rows=1000, clock=clock or FakeClock(NOW),
                     minutes_per_step=2)


def _beat(store: Store, ts_s: float = NOW) -> None:
    """The store's host's agent is alive at ``ts_s``: its heartbeat (agent_stats)."""
    store.write_agent_stats(ts_s, clients=0, rows_per_s=0.0, queue_depth=0, dropped_total=0,
                            rejected_total=0, db_size_bytes=None)


def _rolled_up(store: Store) -> dict[float, set[tuple[str, int]]]:
    """minute (from T0) -> the (host, device index) pairs rolled up in it."""
    names = {}
    with store.engine.connect() as c:
        for did, host, index in c.execute(text(
                "SELECT d.id, h.name, d.device_index FROM devices d JOIN hosts h "
                "ON h.id = d.host_id")):
            names[did] = (host, index)
    out: dict[float, set[tuple[str, int]]] = {}
    for r in read_rollups(store):
        out.setdefault(r["bucket_s"] - T0, set()).add(names[r["device_id"]])
    return out


def _leader_pid(store: Store) -> int | None:
    with store.engine.connect() as c:
        return c.execute(LEADER_PID).scalar()


@pytest.fixture
def two_nodes(postgres_url):
    a = Store.open(postgres_url, host_name="node-a")
    b = Store.open(postgres_url, host_name="node-b")
    _write_minutes(a)
    _write_minutes(b)
    _beat(a)  # both agents alive: each rolls up its own host
    _beat(b)
    yield a, b
    a.close()
    b.close()


EVERY_DEVICE = {("node-a", 0), ("node-a", 1), ("node-b", 0), ("node-b", 1)}
NODE_A = {("node-a", 0), ("node-a", 1)}
NODE_B = {("node-b", 0), ("node-b", 1)}


@pytest.mark.postgres
def test_each_agent_rolls_up_its_own_host_and_one_leads_the_store_wide_work(two_nodes):
    a, b = two_nodes
    b_clock = FakeClock(NOW)
    ra, rb = _retention(), _retention(b_clock)
    assert STORE_WIDE_LOCK_KEY == 8534991366535737200  # the key docs/agent.md names

    # each round: each agent rolls up two minutes of its own host's devices; a leads (deletes),
    # b does not
    for minutes in ({0.0, 60.0}, {0.0, 60.0, 120.0, 180.0}):
        led = ra.step(a)
        assert (led.rolled_up_minutes, ra.leading) == (2, True)
        assert "samples" in led.deleted
        follows = rb.step(b)
        assert (follows.rolled_up_minutes, follows.deleted, rb.leading) == (2, {}, False)
        assert _rolled_up(a) == {m: EVERY_DEVICE for m in minutes}
    lock_session = ra.lock._conn
    assert lock_session is not None
    assert _leader_pid(a) == lock_session.execute(text("SELECT pg_backend_pid()")).scalar()
    lock_session.rollback()

    ra.close()  # agent a stops: b takes over the store-wide work at its next step
    assert _leader_pid(a) is None
    took_over = rb.step(b)
    assert rb.leading is True
    # a's heartbeat is fresh still: b rolls up its own host only
    assert took_over.rolled_up_minutes == 2
    assert _rolled_up(b) == {**{60.0 * m: EVERY_DEVICE for m in range(4)},
                             240.0: NODE_B, 300.0: NODE_B}
    # node a wrote no heartbeat for HOST_GONE_S: b, leading, rolls its minutes up too
    b_clock.advance(HOST_GONE_S + 1)
    _beat(b, NOW + HOST_GONE_S + 1)
    assert rb.step(b).rolled_up_minutes == 2
    assert _rolled_up(b) == {60.0 * m: EVERY_DEVICE for m in range(MINUTES)}
    # every raw row, rolled up and older than raw_s, is gone (deleted, or compacted into
    # blocks and those deleted later)
    for _ in range(3):
        rb.step(b)
    assert a.count("samples") == 0
    assert ra.step(a) == NOTHING and ra.leading is False  # a is back: b keeps leading
    rb.close()


@pytest.mark.postgres
def test_a_leader_whose_session_ends_is_replaced_and_knows_it(two_nodes):
    a, b = two_nodes
    ra, rb = _retention(), _retention()
    assert ra.step(a).rolled_up_minutes == 2  # a's minutes 0 and 1
    with a.engine.connect() as c:  # the server ends the leader's session (a restart, a cut link)
        c.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": _leader_pid(a)})
        c.commit()
    deadline = time.monotonic() + 10  # the backend ends a moment after it is told to
    while _leader_pid(a) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert rb.step(b).rolled_up_minutes == 2 and rb.leading is True  # b's minutes 0 and 1
    follows = ra.step(a)  # a saw its lock go, b has it now: a rolls its own minutes 2 and 3
    assert (follows.rolled_up_minutes, follows.deleted, ra.leading) == (2, {}, False)
    assert _rolled_up(a) == {0.0: EVERY_DEVICE, 60.0: EVERY_DEVICE,
                             120.0: NODE_A, 180.0: NODE_A}
    rb.close()


HOLD_AND_WAIT = """
import sys, time
from vramscope.agent.clock import FakeClock
from vramscope.agent.retention import Retention
from vramscope.agent.store import Store
store = Store.open(sys.argv[1], host_name="node-c")
r = Retention(raw_s=600, rollup_s=86400, step_rows=1000, clock=FakeClock(float(sys.argv[2])),
              minutes_per_step=2)
print(r.step(store).rolled_up_minutes, r.leading, flush=True)
time.sleep(600)
"""


@pytest.mark.postgres
def test_an_agent_killed_while_leading_is_replaced(two_nodes, postgres_url):
    _, b = two_nodes
    child = subprocess.Popen([sys.executable, "-c", HOLD_AND_WAIT, postgres_url, str(NOW)],
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert child.stdout is not None
        # node-c has no devices, a and b have live agents: the leader rolls nothing up
        assert child.stdout.readline().split() == ["0", "True"]
        rb = _retention()
        assert rb.step(b).rolled_up_minutes == 2 and rb.leading is False  # its own host
    finally:
        child.kill()  # SIGKILL: no unlock sent; the server ends the session
        child.wait()
    # the server ends the killed session when it notices (sooner or later under load): wait for
    # that without stepping, so each step below is one step whatever the machine's load
    deadline = time.monotonic() + 30
    while _leader_pid(b) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _leader_pid(b) is None, "the killed leader's session still holds the lock"
    assert rb.step(b).deleted and rb.leading is True  # the first step after it takes over
    assert _rolled_up(b) == {60.0 * m: NODE_B for m in range(4)}  # one step each
    rb.close()


def test_on_sqlite_every_step_leads(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 'v.db'}", host_name="node-a")
    _write_minutes(store)
    r = _retention()
    assert [r.step(store).rolled_up_minutes for _ in range(3)] == [2, 2, 2]
    assert r.leading is True
    assert sorted(_rolled_up(store)) == [60.0 * m for m in range(MINUTES)]
    store.close()


@pytest.mark.postgres
def test_an_agent_not_leading_rolls_up_again_only_its_own_late_minutes(two_nodes):
    a, b = two_nodes
    ra, rb = (Retention(raw_s=86400, rollup_s=86400 * 2, step_rows=1000, clock=FakeClock(NOW),
                        minutes_per_step=2) for _ in range(2))
    assert ra.step(a).rolled_up_minutes == 2  # minutes 0 and 1 of node a's devices
    assert rb.step(b).rolled_up_minutes == 2  # and of node b's, by node b's agent
    late = Sample(T0 + 30, 0, Phase.UNKNOWN, "nvml", device_used_bytes=99,
                  device_total_bytes=100)  # node b's link came back: a sample of minute 0
    b.write([late])
    rb.note_written([late])
    again = rb.step(b)  # not leading: its own minutes 2 and 3, and its late minute again
    assert (again.rolled_up_minutes, again.late_minutes, again.deleted) == (2, 1, {})
    used = {(r["device_id"], r["bucket_s"] - T0): (r["max_value"], r["count"])
            for r in read_rollups(b) if r["metric"] == "device_used_bytes"
            and r["bucket_s"] - T0 < 120}
    assert used == {(a.device_id(0), 0.0): (0, 1), (a.device_id(1), 0.0): (0, 1),
                    (a.device_id(0), 60.0): (1, 1), (a.device_id(1), 60.0): (1, 1),
                    (b.device_id(0), 0.0): (99, 2), (b.device_id(1), 0.0): (0, 1),
                    (b.device_id(0), 60.0): (1, 1), (b.device_id(1), 60.0): (1, 1)}
    ra.close()


@pytest.mark.postgres
def test_two_agent_processes_one_leads_and_gives_the_lock_up_when_it_stops(tmp_path,
                                                                           postgres_url):
    """Real ``vramscope agent`` processes (tests/agent/test_fleet.py's): after their first
    retention step (a second after start) exactly one says it leads, and the lock is free once
    that one stopped (SIGTERM), for the other's next step (test above: it takes over)."""
    from vramscope.agent.cli import main
    from vramscope.agent.ingest.connection import AgentConnection

    from tests.agent.test_fleet import AgentProcess

    assert main(["db", "upgrade", "--db", postgres_url]) == 0
    agents = [AgentProcess(tmp_path, host, postgres_url) for host in ("node-a", "node-b")]
    try:
        deadline = time.monotonic() + 60
        for agent in agents:
            agent.wait_listening(deadline)

        def leading() -> list[bool | None]:
            out = []
            for agent in agents:
                with AgentConnection(agent.socket_path) as conn:
                    out.append(conn.status()["retention_leader"])
            return out

        while None in (states := leading()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sorted(states) == [False, True]
        leader = agents[states.index(True)]
        store = Store.open(postgres_url, host_name="test")
        try:
            assert _leader_pid(store) is not None
            assert "now does the store-wide work" in leader.log()
            leader.stop()
            assert _leader_pid(store) is None  # given up at stop, not left to a timeout
        finally:
            store.close()
    finally:
        for agent in agents:
            agent.kill()


WAITING_FOR_A_ROLLUP = text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT "
                            "granted AND classid::bigint = :cls")


def test_two_agents_rolling_up_one_hosts_minutes_take_turns(postgres_url, monkeypatch):
    # the leader rolls up a host it took for gone while the host's agent, back, rolls up the
    # same minutes: the second waits for the first's transaction (a per-device lock) instead
    # of failing on a duplicate key, and the rows are what one rollup writes
    import threading

    from vramscope.agent.store import maintenance

    leader, back = Store.open(postgres_url), Store.open(postgres_url)
    _write_minutes(leader)
    maintenance.rollup_window(leader, T0, T0 + MINUTES * 60)
    once = read_rollups(leader)
    with leader.engine.begin() as c:
        c.execute(text("DELETE FROM rollups"))
    inside, go_on, failed = threading.Event(), threading.Event(), []
    real = maintenance.refresh_ten_minutes

    def held_open(c, ids, start_s, end_s):  # the first rollup stops inside its transaction
        real(c, ids, start_s, end_s)
        if not inside.is_set():
            inside.set()
            go_on.wait(20)

    def roll_up(store):
        try:
            maintenance.rollup_window(store, T0, T0 + MINUTES * 60)
        except Exception as exc:  # noqa: BLE001 - the test reports it
            failed.append(exc)

    monkeypatch.setattr(maintenance, "refresh_ten_minutes", held_open)
    first = threading.Thread(target=roll_up, args=(leader,))
    first.start()
    assert inside.wait(20)
    second = threading.Thread(target=roll_up, args=(back,))
    second.start()
    with leader.engine.connect() as c:  # the second waits on the first's device locks
        deadline = time.monotonic() + 20
        while c.execute(WAITING_FOR_A_ROLLUP,
                        {"cls": maintenance.ROLLUP_LOCK_CLASS}).scalar_one() == 0:
            assert time.monotonic() < deadline, "the second rollup does not wait on locks"
            time.sleep(0.05)
    go_on.set()
    first.join(20)
    second.join(20)
    assert failed == [] and read_rollups(back) == once
    leader.close()
    back.close()
