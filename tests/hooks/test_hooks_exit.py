"""``uninstall()`` says the process exits: one ``process_exit`` per device it sent samples of,
after its last sample, through the sink every record takes; an exiting interpreter runs it
(atexit), and it never raises or hangs when the agent is gone (issue 44, item 4)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.config import parse_config
from vramscope.agent.ingest.server import IngestServer
from vramscope.agent.records import EXIT_EVENT, Event, Phase, Sample
from vramscope.hooks import install as inst
from vramscope.hooks.phase import active_sink
from vramscope.hooks.sink import ListSink

import vramscope
from tests.support.waiting import wait_for
from tools.agent_process import REPO_ROOT

T = 1_800_000_000.0


@pytest.fixture(autouse=True)
def clean():
    inst.uninstall()
    yield
    inst.uninstall()


def _config(socket_path: str = "/nonexistent/agent.sock"):
    return parse_config({"agent": {"socket_path": socket_path}}, None, {})


def _kv_sample(ts: float, device: int) -> Sample:
    return Sample(ts, device, Phase.IDLE, "kv", kv_blocks_used=3, kv_blocks_total=10)


def test_uninstall_says_exit_once_per_sampled_device_after_the_last_sample():
    sink, clock = ListSink(), FakeClock(T)
    vramscope.install(_config(), sink=sink, clock=clock)
    ours = active_sink()
    assert ours is not None
    for device in (1, 0, 1):  # as a KV source or the sampler puts them
        ours.put(_kv_sample(T, device))
    ours.put(Event(T, "phase", 3, os.getpid(), Phase.DECODE))  # an event is no sample
    clock.advance(5.0)
    vramscope.uninstall()
    vramscope.uninstall()  # the second has nothing left to say
    pid = os.getpid()
    assert sink.records[-2:] == [Event(T + 5.0, EXIT_EVENT, 0, pid),
                                 Event(T + 5.0, EXIT_EVENT, 1, pid)]
    assert [e.name for e in sink.events()].count(EXIT_EVENT) == 2


def test_a_process_that_sampled_nothing_says_nothing():
    sink = ListSink()
    vramscope.install(_config(), sink=sink)
    vramscope.set_phase("decode")
    vramscope.uninstall()
    assert EXIT_EVENT not in [e.name for e in sink.events()]


class _BrokenSink(ListSink):
    def put(self, record):  # a sink that breaks its contract: uninstall still goes on
        if isinstance(record, Event) and record.name == EXIT_EVENT:
            raise OSError("gone")
        super().put(record)


def test_uninstall_never_raises_from_a_broken_sink():
    sink = _BrokenSink()
    vramscope.install(_config(), sink=sink)
    active_sink().put(_kv_sample(time.time(), 0))  # type: ignore[union-attr]
    vramscope.uninstall()
    assert not inst.installed()


def test_uninstall_never_raises_or_hangs_when_the_agent_is_gone(short_dir):
    """The socket never was, or the agent stopped under a connected client: uninstall
    returns within the client's close (a second), the exit said into the void."""
    path = f"{short_dir}/run/agent.sock"
    got: list = []
    srv = IngestServer(path, on_records=lambda recs, _c: got.extend(recs))
    srv.start()
    vramscope.install(_config(path))
    active_sink().put(_kv_sample(time.time(), 0))  # type: ignore[union-attr]
    wait_for(lambda: got)
    srv.stop()
    started = time.monotonic()
    vramscope.uninstall()
    assert time.monotonic() - started < 3.0
    assert EXIT_EVENT not in [r.name for r in got if isinstance(r, Event)]
    vramscope.install(_config(f"{short_dir}/none.sock"))  # never there
    active_sink().put(_kv_sample(time.time(), 0))  # type: ignore[union-attr]
    started = time.monotonic()
    vramscope.uninstall()
    assert time.monotonic() - started < 3.0


SERVER = textwrap.dedent("""
    import sys, time
    from vramscope.agent.records import Phase, Sample
    from vramscope.hooks.phase import active_sink
    import vramscope
    report = vramscope.install()
    assert report.active("sink"), str(report)
    for device in (0, 1):
        active_sink().put(Sample(time.time(), device, Phase.IDLE, "kv", kv_blocks_used=1,
                                 kv_blocks_total=8))
    print(time.time(), flush=True)
    how = sys.argv[1]
    if how == "oom":  # an unhandled error ends the interpreter, atexit still runs
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    if how == "exit":
        sys.exit(3)
""")


@pytest.mark.parametrize(("how", "code"), [("end", 0), ("exit", 3), ("oom", 1)])
def test_an_exiting_interpreter_says_it_through_the_socket(short_dir, how, code):
    """No uninstall() in the server's code: the interpreter's exit runs it (atexit)."""
    path = f"{short_dir}/run/agent.sock"
    got: list = []
    srv = IngestServer(path, on_records=lambda recs, _c: got.extend(recs))
    srv.start()
    try:
        env = {**os.environ, "VRAMSCOPE_AGENT_SOCKET_PATH": path,
               "PYTHONPATH": str(REPO_ROOT)}
        proc = subprocess.run([sys.executable, "-c", SERVER, how], env=env, cwd=str(REPO_ROOT),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == code, proc.stderr
        wait_for(lambda: len(got) >= 4)
    finally:
        srv.stop()
    put_s = float(proc.stdout.split()[0])
    samples = [r for r in got if isinstance(r, Sample)]
    exits = [r for r in got if isinstance(r, Event) and r.name == EXIT_EVENT]
    assert [(e.device, e.pid) for e in exits] == [(0, samples[0].pid), (1, samples[0].pid)]
    assert got[-2:] == exits  # after the samples
    assert put_s <= exits[0].ts_s < put_s + 5.0
