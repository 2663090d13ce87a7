"""The agent's loops on a FakeClock with the FakeNvmlSource, a real SQLite store, no sleeping."""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

import pytest
from vramscope.agent.config import parse_config
from vramscope.agent.daemon import PROCESS_EVENT, Agent
from vramscope.agent.embedded import EmbeddedAgent
from vramscope.agent.ingest import protocol as proto
from vramscope.agent.ingest.peer import ClientInfo
from vramscope.agent.records import Event, Phase, PostMortem, Sample
from vramscope.agent.sources.nvml import FakeNvmlSource, open_nvml
from vramscope.agent.store.store import integrity_wait_s

from tests.support.rollup_rows import read_rollups

GiB = 2**30


def _config(**sampling):
    return parse_config({"sampling": {"device_interval_s": 0.25, "process_interval_s": 1.0,
                                      **sampling}}, None)


@pytest.fixture
def agent(store, fake_clock):
    source = FakeNvmlSource(2, 80 * GiB, clock=fake_clock,
                            used_fn=lambda d, t: (d + 1) * GiB,
                            processes={0: [(111, 5 * GiB), (222, GiB)], 1: [(111, 2 * GiB)]})
    a = Agent(_config(), store=store, source=source, listen=False, clock=fake_clock,
              alerts=False)
    yield a
    a.writer.flush()


def test_tick_samples_every_device_at_its_interval(agent, fake_clock, store):
    for _ in range(9):  # t = 0, 0.25, ..., 2.0: nine device ticks, three process ticks
        agent.tick()
        fake_clock.advance(0.25)
    agent.writer.flush()
    nvml = store.samples(source="nvml")
    assert len(nvml) == 18
    assert {(s.device, s.device_used_bytes, s.device_total_bytes) for s in nvml} == {
        (0, GiB, 80 * GiB), (1, 2 * GiB, 80 * GiB)}
    assert [s.ts_s - 1_700_000_000.0 for s in nvml if s.device == 0] == [
        i * 0.25 for i in range(9)]


def test_process_rows_become_events_for_connected_clients_only(agent, store, fake_clock):
    client = ClientInfo(peer_pid=111, peer_uid=0, hello=proto.Hello(1, 7, "srv", (0,), None))
    agent.server = SimpleNamespace(clients=[client])  # one connected hook client
    agent.sample_processes()
    agent.writer.flush()
    rows = store.events(names=[PROCESS_EVENT])
    # the kernel's pid (111, NVML's too), not the one the client calls itself (7: a container)
    assert [(e.device, e.pid, e.data) for e in rows] == [(0, 111, {"used_bytes": 5 * GiB}),
                                                         (1, 111, {"used_bytes": 2 * GiB})]
    assert store.samples() == []  # never mixed into the device's samples
    assert [(p["pid"], p["devices"]) for p in store.processes()] == [(111, "0,1")]


def test_run_once_writes_the_agents_own_stats(agent, store):
    agent.writer.put(Sample(1.0, 0, Phase.IDLE, "torch", allocated_bytes=1))
    agent.run_once()
    stats = store.latest_agent_stats()
    assert stats["clients"] == 0 and stats["dropped_total"] == 0
    assert stats["rejected_total"] == 0 and stats["queue_depth"] >= 0
    assert stats["db_size_bytes"] > 0
    status = agent.status()
    assert status["written_total"] == 1 + 2  # the sample and two NVML rows (no clients)
    assert [d["uuid"] for d in status["devices"]] == ["GPU-fake-0000", "GPU-fake-0001"]


def test_bad_allowed_uids_is_a_config_error_naming_the_key(store):
    from vramscope.agent.errors import ConfigError

    # refused where the config is read (the one validator `config check` runs too)
    with pytest.raises(ConfigError, match="agent.allowed_uids = '1000, bob': 'bob' is not a uid"):
        parse_config({"agent": {"allowed_uids": "1000, bob"}}, None)


def test_embedded_agent_stores_what_its_sink_receives(sqlite_url, fake_clock):
    emb = EmbeddedAgent(_config(), sqlite_url, source=FakeNvmlSource(1, clock=fake_clock),
                        clock=fake_clock)
    emb.start()
    pm = PostMortem(3.0, 0, 9, Phase.PREFILL, 1, 2, 3, 4, 5, 6, 0.5, message="boom")
    emb.sink.put(Sample(1.0, 0, Phase.DECODE, "torch", allocated_bytes=42))
    emb.sink.put(Event(2.0, "phase", 0, None, Phase.DECODE))
    emb.sink.put(pm)
    emb.stop()

    st = emb.store
    torch_rows = st.samples(source="torch")
    assert [(s.allocated_bytes, s.pid) for s in torch_rows] == [(42, os.getpid())]
    assert [(e.name, e.pid) for e in st.events()] == [("phase", os.getpid())]
    assert [p._replace(host=None) for _, p in st.postmortems()] == [pm]
    assert st.samples(source="nvml")  # the sampler ran too


def test_nvml_absent_gives_none_and_one_log_line(caplog):
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML is present here; tests/gpu/test_agent_gpu.py covers it")
    except Exception:  # noqa: BLE001 - no driver: the case under test
        pass
    with caplog.at_level(logging.WARNING, logger="vramscope.nvml"):
        assert open_nvml() is None
    assert len(caplog.records) == 1
    assert caplog.records[0].getMessage().startswith("NVML sampling is off: cannot initialise "
                                                     "NVML")


def test_agent_metrics_port_serves_its_counters(store, fake_clock):
    import socket
    import urllib.request

    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = parse_config({"agent": {"metrics_port": port}}, None)
    a = Agent(config, store=store, source=None, listen=False, clock=fake_clock, alerts=False)
    a.writer.put_many([Sample(1.0, 0, Phase.IDLE, "torch", allocated_bytes=1)] * 3)
    a.start()
    try:
        a.writer.stop()  # flush: three rows committed
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    finally:
        a.stop()
    lines = text.decode().splitlines()
    assert "vramscope_agent_written_total 3.0" in lines
    assert "vramscope_agent_queue_depth 0.0" in lines


def test_agent_metrics_bind_the_configured_address(store, fake_clock):
    import socket
    import urllib.error
    import urllib.request

    with socket.socket() as probe:  # a free port on another loopback address
        probe.bind(("127.0.0.2", 0))
        port = probe.getsockname()[1]
    config = parse_config({"agent": {"metrics_port": port, "metrics_host": "127.0.0.2"}}, None)
    a = Agent(config, store=store, source=None, listen=False, clock=fake_clock, alerts=False)
    a.start()
    try:
        text = urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=5).read()
        assert b"vramscope_agent_clients 0.0" in text
        with pytest.raises(urllib.error.URLError):  # not on the default address
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
    finally:
        a.stop()


def test_late_samples_through_the_writer_are_rolled_up_again(agent, store, fake_clock):

    minute = (fake_clock.time_s() // 60) * 60 - 600  # ten minutes ago: past the grace
    agent.writer.put_many([Sample(minute + i, 0, source="torch", allocated_bytes=10)
                           for i in range(3)])
    agent.writer.flush()
    agent._retention_task(store)

    def allocated():
        return [(r["max_value"], r["count"]) for r in read_rollups(store)
                if r["bucket_s"] == minute and r["metric"] == "allocated_bytes"]
    assert allocated() == [(10, 3)]
    agent.writer.put(Sample(minute + 30, 0, source="torch", allocated_bytes=99))  # the backlog
    agent.writer.flush()
    agent._retention_task(store)
    assert allocated() == [(99, 4)]


def test_integrity_checks_are_spaced_to_keep_within_their_cpu_budget(store, fake_clock):
    """SQLite's quick_check reads the whole file: its next run waits 100 / max_cpu_percent
    times the CPU it took, when that is longer than the interval (a week-old file: hourly)."""
    assert integrity_wait_s(900.0, 0.5, 0.25) == 900.0  # 0.5 s a quarter-hour: 0.06 %
    assert integrity_wait_s(900.0, 9.0, 0.25) == 3600.0  # 9 s checks: hourly for 0.25 %
    config = parse_config({"database": {"integrity_check_interval_s": 1,
                                        "integrity_check_max_cpu_percent": 0.01}}, None)
    a = Agent(config, store=store, source=None, listen=False, clock=fake_clock, alerts=False)
    store.write([Sample(fake_clock.time_s() + i / 10, 0, source="torch", allocated_bytes=i)
                 for i in range(1000)])
    a._integrity_task(store)
    result = a.status()["db_integrity"]
    assert result["ok"] is True and result["cpu_s"] > 0
    # 0.01 % of a core: 10,000 times the check's CPU, well over the 1 s interval
    assert result["next_in_s"] == 10_000 * result["cpu_s"] > 1.0
    assert a._integrity_schedule.next_s == fake_clock.monotonic_s() + result["next_in_s"]
    submitted = []
    a.writer.submit = submitted.append  # what tick() hands the writer
    fake_clock.advance(result["next_in_s"] - 0.001)
    a.tick()
    assert a._integrity_task not in submitted
    fake_clock.advance(0.002)
    a.tick()
    assert submitted.count(a._integrity_task) == 1


def test_status_says_while_retention_catches_up(store, fake_clock):
    """A store whose raw rows passed the cutoff while no agent ran (a copied or restored store):
    retention deletes them a budget a step and says so, until it has caught up."""
    config = parse_config({"retention": {"raw_s": 60, "step_rows": 100}}, None)
    a = Agent(config, store=store, source=None, listen=False, clock=fake_clock, alerts=False)
    minute = (fake_clock.time_s() // 60) * 60 - 600  # ten minutes ago: old, and past the grace
    store.write([Sample(minute + i / 10, 0, source="torch", allocated_bytes=i)
                 for i in range(250)])
    assert a.status()["retention_backlog"] is None  # no step yet
    states = []
    for _ in range(4):
        a._retention_task(store)
        states.append((a.status()["retention_backlog"], store.count("samples")))
    assert states == [(True, 150), (True, 50), (False, 0), (False, 0)]
