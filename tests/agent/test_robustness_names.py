"""Bounded names (issue 32, item 3): one client sending 3,000 host names, 2,000 device indexes
and 2,000 pids made 3,001 host and device rows, a 4 MB ``/metrics`` and 5 s pages. Clients may
create at most a few names each and a bounded number together; the rest is refused and
counted, and the pages stay fast at the limits."""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.config import parse_config
from vramscope.agent.ingest import protocol as proto
from vramscope.agent.ingest.connection import AgentConnection
from vramscope.agent.ingest.names import CLIENT_LIMITS, ClientNames, Counts, NameLimits
from vramscope.agent.records import Phase, Sample
from vramscope.agent.store import Store

from tests.support.live_agent import running_agent

NOW = 1_700_000_000.0
HOST = "agent-host"
LIMITS = Counts(hosts=6, devices=40, processes=300)


def _s(host: str | None = None, device: int = 0, pid: int | None = None) -> Sample:
    return Sample(NOW, device, Phase.DECODE, "torch", pid, allocated_bytes=1, host=host)


def test_a_client_creates_at_most_its_share_and_known_names_stay_open():
    limits = NameLimits(Counts(3, 100, 100), Counts(2, 64, 256))
    a, b = ClientNames(), ClientNames()
    kept, refused = limits.admit([_s(f"h{i}") for i in range(5)], a)
    assert [r.host for r in kept] == ["h0", "h1"]
    assert refused is not None and (refused.records, refused.kind, refused.scope) == (
        3, "hosts", "client")
    kept, refused = limits.admit([_s("h1"), _s("h4"), _s("h5")], b)  # h1 known: free
    assert [r.host for r in kept] == ["h1", "h4"] and refused is not None
    assert (refused.kind, refused.limit, refused.scope) == ("hosts", 3, "live")
    assert limits.describe(refused) == (
        "1 record(s) refused: 3 hosts are live already (each sent in the last 300 s by an open "
        "connection), the most clients may keep (agent.max_hosts, agent.name_idle_s)")
    assert limits.counts == Counts(3, 3, 0)  # each new host brought its device 0


def test_a_record_is_refused_whole_when_one_of_its_names_is_over_a_bound():
    limits = NameLimits(Counts(10, 2, 100), Counts(10, 10, 10))
    client = ClientNames()
    kept, refused = limits.admit([_s(device=0, pid=1), _s(device=1, pid=2),
                                  _s(device=2, pid=3)], client)
    assert [(r.device, r.pid) for r in kept] == [(0, 1), (1, 2)]
    assert refused is not None and refused.kind == "devices"
    assert limits.processes == {(None, 1), (None, 2)}  # pid 3 was not created either


@pytest.fixture
def agent(any_url, short_dir):
    settings = {"agent": {"max_hosts": LIMITS.hosts, "max_devices": LIMITS.devices,
                          "max_processes": LIMITS.processes}}
    with running_agent(any_url, short_dir, FakeClock(NOW), settings, host=HOST) as a:
        yield a


def _send(path: str, records: list[Sample], open_: ExitStack) -> dict:
    """Send from a new connection, left open (its names stay live) until ``open_`` closes."""
    conn = open_.enter_context(AgentConnection(path))
    conn.hello("flood", devices=[0])
    for i in range(0, len(records), 1000):
        conn.send(proto.records_message(records[i:i + 1000]))
    return conn.status()


def test_a_flood_of_new_names_is_refused_counted_and_logged(agent, caplog):
    """Every flooding connection stays open, so its names stay live: the bounds hold."""
    path = agent.socket_path
    caplog.set_level(logging.WARNING, "vramscope.ingest")
    with ExitStack() as open_:
        # the three frames, one client each: 3,000 hosts, 2,000 devices, 2,000 pids
        hosts = _send(path, [_s(host=f"h{i}", pid=7) for i in range(3000)], open_)
        assert hosts["rejected"] == {"names": 3000 - CLIENT_LIMITS.hosts}
        devices = _send(path, [_s(device=i, pid=7) for i in range(2000)], open_)
        assert devices["rejected"]["names"] == (hosts["rejected"]["names"] + 2000
                                                - CLIENT_LIMITS.devices)
        pids = _send(path, [_s(pid=100 + i) for i in range(2000)], open_)
        assert pids["rejected"]["names"] == (devices["rejected"]["names"] + 2000
                                             - CLIENT_LIMITS.processes)
        # more clients: the totals hold whoever asks
        for k in range(4):
            _send(path, [_s(host=f"x{k}-{i}", device=i, pid=i) for i in range(8)], open_)
            _send(path, [_s(device=1000 + 16 * k + i, pid=5000 + i) for i in range(16)], open_)
        agent.writer.flush()
    store = agent.store
    made_hosts = {d["host"] for d in store.devices(host="*")} - {HOST}
    assert len(made_hosts) == LIMITS.hosts
    assert len(store.devices(host="*")) == LIMITS.devices
    pids_stored = {(s.host, s.pid) for s in store.samples(device=None)}
    assert len(pids_stored) <= LIMITS.processes
    assert any("this client already holds 2 new hosts it created" in r.message
               for r in caplog.records)
    assert any("40 devices are live already" in r.message and "(agent.max_devices, "
               "agent.name_idle_s)" in r.message for r in caplog.records)


def test_metrics_and_overview_stay_bounded_at_the_limits(tmp_path):
    """A store filled to the default limits (32 devices on 4 hosts, 256 processes): the
    pages read a bounded number of rows, and their cost is a small multiple of one device's
    (a ratio, not a timing: the machine may be shared)."""
    from vramscope.dashboard.app import create_app

    def timed(store: Store) -> tuple[float, int]:
        app = create_app(parse_config({}, None, {}), store, clock=FakeClock(NOW + 1))
        client = app.test_client()
        client.get("/metrics")  # warm: imports, the first query plans
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            metrics = client.get("/metrics")
            overview = client.get("/api/v1/overview")
            best = min(best, time.perf_counter() - start)
        assert metrics.status_code == 200 and overview.status_code == 200
        return best, len(metrics.get_data())

    one = Store.open(f"sqlite:///{tmp_path / 'one.db'}", host_name=HOST)
    one.write([_s(device=0, pid=1)])
    full = Store.open(f"sqlite:///{tmp_path / 'full.db'}", host_name=HOST)
    limits = NameLimits()
    for d in range(limits.limits.devices):  # a client per device, 8 processes each
        records = [Sample(NOW - k, d, Phase.DECODE, "torch", 1000 + 8 * d + p,
                          allocated_bytes=2**30, host=None if d < 8 else f"h{d // 8}")
                   for p in range(8) for k in range(3)]
        kept, refused = limits.admit(records, ClientNames())
        assert refused is None
        full.write(list(kept))
    assert limits.counts == Counts(3, 32, 256)
    small, _ = timed(one)
    large, size = timed(full)
    print(f"/metrics + /api/v1/overview: {small * 1e3:.0f} ms at one device, "
          f"{large * 1e3:.0f} ms at the limits; /metrics {size} bytes")
    assert size < 400_000
    assert large < max(20 * small, 0.3)
