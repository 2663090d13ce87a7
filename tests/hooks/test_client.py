"""The in-server socket client: never blocks, never raises, counts drops, reconnects."""

from __future__ import annotations

import os
import signal
import time

from vramscope.agent.config import parse_config
from vramscope.agent.ingest.server import IngestServer
from vramscope.agent.records import Event, Phase, PostMortem, Sample
from vramscope.hooks.client import SocketSink, make_default_sink

from tests.support.waiting import wait_for as _wait_for
from tools.agent_process import AgentProcess


class _Collector:
    def __init__(self):
        self.records, self.postmortems = [], []

    def server(self, path: str, **kw) -> IngestServer:
        srv = IngestServer(path, on_records=lambda recs, _c: self.records.extend(recs),
                           on_postmortem=lambda pm, _c: self.postmortems.append(pm), **kw)
        srv.start()
        return srv



def _sample(i: int) -> Sample:
    return Sample(float(i), 0, Phase.DECODE, "torch", allocated_bytes=i)


def test_without_an_agent_put_never_raises_and_drops_the_oldest_beyond_the_bound(short_dir):
    sink = SocketSink(f"{short_dir}/none.sock", buffer_records=10, max_backoff_s=0.05)
    for i in range(25):
        sink.put(_sample(i))
    sink.put(object())  # not even a record: still no exception
    assert sink.buffered == 10 and sink.dropped_total == 16
    sink.close()
    assert not sink.connected


def test_records_and_postmortems_arrive_with_the_clients_pid(short_dir):
    got = _Collector()
    srv = got.server(f"{short_dir}/run/agent.sock")
    sink = SocketSink(srv.path, poll_s=0.01)
    pm = PostMortem(5.0, 0, None, Phase.PREFILL, 1, 2, 3, 4, 5, 6, 0.5)
    for i in range(300):
        sink.put(_sample(i))
    sink.put(Event(9.0, "request_start", request_id="r1"))
    sink.put(pm)
    _wait_for(lambda: len(got.records) == 301 and got.postmortems)
    sink.close()
    srv.stop()
    assert [r.allocated_bytes for r in got.records[:300]] == list(range(300))
    assert {r.pid for r in got.records} == {os.getpid()}
    assert got.postmortems == [pm._replace(pid=os.getpid())]
    assert sink.sent_total == 302 and sink.dropped_total == 0


def test_messages_above_the_cap_are_split(short_dir):
    got = _Collector()
    srv = got.server(f"{short_dir}/run/agent.sock", max_message_bytes=2048)
    sink = SocketSink(srv.path, max_message_bytes=2048, batch_records=200, poll_s=0.01)
    for i in range(200):
        sink.put(_sample(i))
    _wait_for(lambda: len(got.records) == 200)
    sink.close()
    srv.stop()
    # a hello, then 200 records halved until a message fits in 2 KiB: 8 messages of 25
    assert srv.stats.messages_total == 1 + 8 and srv.stats.rejected_total == 0


def test_reconnects_after_an_agent_restart_and_reports_what_it_dropped(short_dir):
    path = f"{short_dir}/run/agent.sock"
    got = _Collector()
    srv = got.server(path)
    sink = SocketSink(path, buffer_records=5, poll_s=0.01, max_backoff_s=0.05)
    sink.put(_sample(0))
    _wait_for(lambda: len(got.records) == 1)
    srv.stop()
    sink.put(_sample(-1))  # the send of this one fails: the client learns the agent is gone
    _wait_for(lambda: not sink.connected)
    for i in range(1, 13):
        sink.put(_sample(i))  # 12 records into a bound of 5 while away: 7 more dropped
    assert sink.dropped_total == 8 and sink.buffered == 5
    srv = got.server(path)
    _wait_for(lambda: len(got.records) == 6 and srv.stats.client_dropped_total == 8)
    sink.close()
    srv.stop()
    assert [r.allocated_bytes for r in got.records[1:]] == list(range(8, 13))


def test_make_default_sink_reads_the_config(short_dir):
    config = parse_config({"agent": {"socket_path": f"{short_dir}/x.sock"},
                           "hooks": {"buffer_records": 123}}, None)
    sink = make_default_sink(config)
    try:
        assert sink.socket_path == f"{short_dir}/x.sock" and sink.buffer_records == 123
    finally:
        sink.close()


def test_server_keeps_its_loop_timing_while_the_agent_is_stopped_then_killed(short_dir):
    """A 200 Hz loop sending 20 records a tick; the agent is SIGSTOPped for 3 s, then killed."""
    agent = AgentProcess(f"sqlite:///{short_dir}/db.sqlite", f"{short_dir}/run/agent.sock",
                         log_path=f"{short_dir}/agent.log").start()
    bound = 2000
    sink = SocketSink(agent.socket_path, buffer_records=bound, send_timeout_s=0.5)
    period_s, ticks, put_costs, max_buffered = 0.005, 0, [], 0
    start = time.monotonic()
    next_s = start
    stopped = killed = False
    try:
        while (now := time.monotonic()) < start + 4.5:
            if not stopped and now > start + 0.5:
                agent.send_signal(signal.SIGSTOP)
                stopped = True
            if not killed and now > start + 3.5:
                agent.send_signal(signal.SIGKILL)
                killed = True
            t0 = time.perf_counter()
            for k in range(20):
                sink.put(_sample(ticks * 20 + k))
            put_costs.append(time.perf_counter() - t0)
            max_buffered = max(max_buffered, sink.buffered)
            ticks += 1
            next_s += period_s
            time.sleep(max(0.0, next_s - time.monotonic()))
    finally:
        agent.stop(signal.SIGKILL)
        sink.close()
    expected = 4.5 / period_s
    assert ticks >= 0.97 * expected, f"{ticks} ticks of {expected:.0f}"
    put_costs.sort()
    assert put_costs[int(0.99 * len(put_costs))] < 0.001  # p99 of 20 puts under 1 ms
    assert max_buffered <= bound
    assert sink.dropped_total > 0  # the stopped agent did not make the buffer grow instead
    assert sink.sent_total + sink.dropped_total + sink.buffered == ticks * 20


def test_a_forked_child_gets_its_own_connection_and_pid(short_dir):
    got = _Collector()
    srv = got.server(f"{short_dir}/run/agent.sock")
    sink = SocketSink(srv.path, poll_s=0.01)
    sink.put(_sample(1))
    _wait_for(lambda: len(got.records) == 1)
    child = os.fork()
    if child == 0:  # the child: put, wait for the drain, exit without running pytest's atexit
        sink.put(_sample(2))
        deadline = time.monotonic() + 5
        while sink.sent_total < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        os._exit(0 if sink.sent_total == 1 else 1)
    _, status = os.waitpid(child, 0)
    _wait_for(lambda: len(got.records) == 2)
    sink.close()
    srv.stop()
    assert os.waitstatus_to_exitcode(status) == 0
    assert [(r.allocated_bytes, r.pid) for r in got.records] == [(1, os.getpid()), (2, child)]


def test_install_ships_phase_events_through_the_socket_to_the_agent(short_dir):
    from vramscope.agent.daemon import Agent

    import vramscope

    config = parse_config({"agent": {"socket_path": f"{short_dir}/run/agent.sock"},
                           "database": {"url": f"sqlite:///{short_dir}/db.sqlite"}}, None)
    agent = Agent(config, source=None, alerts=False)
    agent.start()
    try:
        report = vramscope.install(config)
        with vramscope.phase("prefill"):
            pass
        vramscope.uninstall()  # closes the socket client after a last drain
        _wait_for(lambda: agent.status()["records_received_total"] >= 2)
    finally:
        vramscope.uninstall()
        agent.stop()
    assert "agent socket" in str(report)
    events = agent.store.events(names=["phase"])
    assert len(events) >= 2 and {e.pid for e in events} == {os.getpid()}
    assert Phase.PREFILL in {e.phase for e in events}


def test_a_quiet_client_sends_heartbeats_and_a_busy_one_none(short_dir):
    """Nothing to send for ``heartbeat_s``: the client says it is alive (a ``heartbeat``,
    which keeps its slot at the agent: tests/agent/test_robustness_fairness.py); while records
    flow, it sends none. Each heartbeat follows the client's previous frame by at least
    ``heartbeat_s``, so every one counts at an agent whose minimum gap is below it."""
    got = _Collector()
    srv = got.server(f"{short_dir}/run/agent.sock")
    sink = SocketSink(srv.path, poll_s=0.01, heartbeat_s=0.3)
    try:
        end = time.monotonic() + 1.0
        i = 0
        while time.monotonic() < end:  # busy: a record every 0.1 s
            sink.put(_sample(i))
            i += 1
            time.sleep(0.1)
        _wait_for(lambda: len(got.records) == i)
        assert srv.stats.heartbeats_total == 0
        time.sleep(1.05)  # quiet for 1.05 to 1.15 s: a heartbeat every 0.3 s
        beats = srv.stats.heartbeats_total
    finally:
        sink.close()
        srv.stop()
    assert 3 <= beats <= 4  # not one a poll (100), nor none
