"""The demo's pieces: simulated time, keeping servers abreast, the device seam, progress."""

from __future__ import annotations

import io
import threading
import time

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.sim.demo import (
    QUEUE_SHARE,
    Pacer,
    Progress,
    SimDeviceSource,
    advance,
    make_servers,
)
from vramscope.hooks.sink import ListSink


def test_pacer_runs_fast_until_now_then_in_real_time():
    clock = FakeClock(start_s=10_000.0)
    pacer = Pacer(clock, history_s=1000.0, speed=10.0)
    assert pacer.sim0_s == 9_000.0 and pacer.target_s() == 9_000.0
    clock.advance(50)
    assert pacer.target_s() == 9_500.0  # 50 s x 10
    clock.advance(100)  # 150 s x 10 would be past now
    assert pacer.target_s() == clock.time_s() == 10_150.0


def test_servers_stay_abreast_on_their_own_devices():
    sink = ListSink()
    servers = make_servers(("healthy", "leak", "fragmentation"), sink, 1_700_000_000.0)
    assert [s.spec.device for s in servers] == [0, 1, 2]
    advance(servers, 1_700_000_000.0 + 300)
    assert [s.now_s for s in servers] == [1_700_000_300.0] * 3
    assert {r.device for r in sink.records} == {0, 1, 2}
    source = SimDeviceSource(servers)
    assert [(d.index, d.name) for d in source.devices()] == [
        (0, "Simulated 24 GB GPU (healthy)"), (1, "Simulated 24 GB GPU (leak)"),
        (2, "Simulated 24 GB GPU (fragmentation)")]
    assert source.read() == [] and source.read_processes() == []


def test_pool_scenario_alone_gets_device_3():
    servers = make_servers(("pool",), ListSink(), 0.0)
    assert servers[0].spec.device == 3


def test_progress_prints_lines_when_not_a_terminal():
    out = io.StringIO()
    progress = Progress(out, every_s=3600)
    progress.show("first")
    progress.show("too soon")
    progress.show("forced", force=True)
    assert out.getvalue() == "first\nforced\n"


@pytest.mark.parametrize("share, drops", [(QUEUE_SHARE, False), (1e9, True)])
def test_the_simulation_waits_for_the_agents_writer_instead_of_making_it_drop(
        tmp_path, monkeypatch, share, drops):
    # a queue of 2,000 records, fed 20 simulated minutes of three servers as fast as the CPU
    # goes: waiting while it is over half full, nothing is dropped; not waiting, it drops
    import vramscope.agent.sim.demo as demo
    from vramscope.agent.config import load_config
    from vramscope.agent.embedded import EmbeddedAgent

    monkeypatch.setattr(demo, "QUEUE_SHARE", share)
    config = load_config(environ={}).replace(agent__queue_max_records=2000)
    servers = make_servers(("healthy", "leak", "fragmentation"), None, 1_700_000_000.0)
    agent = EmbeddedAgent(config, db_url=f"sqlite:///{tmp_path}/d.db",
                          source=SimDeviceSource(servers))
    for s in servers:
        s.sink = agent.sink
    with agent:
        clock = FakeClock(start_s=1_700_000_000.0 + 1200.0)
        pacer = Pacer(clock, history_s=1200.0, speed=1e9)
        clock.advance(1.0)  # the whole 20 minutes are due at once
        done = threading.Event()
        threading.Thread(target=_stop_at, args=(servers, clock.time_s(), done),
                         daemon=True).start()
        demo.run_simulation(servers, pacer, agent, 120.0, Progress(io.StringIO()), done)
    assert [s.now_s for s in servers] == [clock.time_s()] * 3  # all 20 minutes ran
    stats = agent.agent.writer.stats
    assert stats.written_total + stats.dropped_total == 8939  # every record the servers sent
    assert (stats.dropped_total > 0) is drops


def _stop_at(servers, end_s, stop):
    while not all(s.now_s >= end_s for s in servers):
        time.sleep(0.02)
    time.sleep(0.5)  # let the loop come round once more
    stop.set()
