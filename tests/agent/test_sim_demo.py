"""The demo's pieces: simulated time, keeping servers abreast, the device seam, progress."""

from __future__ import annotations

import io

from vramscope.agent.clock import FakeClock
from vramscope.agent.sim.demo import Pacer, Progress, SimDeviceSource, advance, make_servers
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
