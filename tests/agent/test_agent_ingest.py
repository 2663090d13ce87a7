"""The ingest server in-process: resync after a bad frame, uid check, directory rules."""

from __future__ import annotations

import os
import time

import pytest
from vramscope.agent.errors import VramscopeError
from vramscope.agent.ingest import protocol as proto
from vramscope.agent.ingest.connection import AgentConnection
from vramscope.agent.ingest.server import MAX_BAD_IN_A_ROW, IngestServer
from vramscope.agent.ingest.socket_dir import prepare_socket_dir
from vramscope.agent.records import Phase, Sample

from tests.support.waiting import wait_for


def _wait_for(predicate, timeout_s=5.0):
    return wait_for(predicate, timeout_s)


@pytest.fixture
def server(short_dir):
    got: list = []
    srv = IngestServer(f"{short_dir}/run/agent.sock", on_records=lambda r, c: got.extend(r))
    srv.got = got
    srv.start()
    yield srv
    srv.stop()



def _s(i):
    return Sample(float(i), 0, Phase.IDLE, "torch", allocated_bytes=i)


def test_a_bad_frame_between_good_ones_is_skipped_and_counted(server):
    with AgentConnection(server.path) as conn:
        conn.hello("t")
        conn.send_records([_s(1)])
        conn.send(proto.HEADER.pack(5) + b"{oops")  # bad JSON, good length: resync
        conn.send(proto.frame({"type": "records", "records": [{"ts": 1, "phase": "x"}]}))
        conn.send_records([_s(2)])
        conn.status()
    assert [r.allocated_bytes for r in server.got] == [1, 2]
    assert server.stats.rejected == {"json": 1, "schema": 1}


def test_records_before_hello_close_the_connection(server):
    with AgentConnection(server.path) as conn:
        conn.send_records([_s(1)])
        reply = conn.read()
    assert reply == {"type": "error", "message": "expected a hello first, got 'records'"}
    assert server.got == [] and server.stats.rejected["order"] == 1


def test_too_many_bad_messages_in_a_row_drop_the_client(server):
    with AgentConnection(server.path) as conn:
        conn.hello("t")
        for _ in range(MAX_BAD_IN_A_ROW):
            conn.send(proto.frame({"type": "nope"}))
        assert conn.read()["message"] == f"{MAX_BAD_IN_A_ROW} bad messages in a row"


def test_eof_inside_a_frame_counts_as_truncated(server):
    conn = AgentConnection(server.path)
    conn.hello("t")
    conn.send(proto.records_message([_s(1)])[:-3])
    conn.close()
    _wait_for(lambda: server.stats.rejected["truncated"] == 1)
    assert server.got == []


def test_a_peer_whose_uid_is_not_allowed_is_refused(server):
    server._allowed_uids = {os.getuid() + 1}  # as if this test ran as another user
    with AgentConnection(server.path) as conn:
        reply = conn.read()
    assert reply["message"] == (f"uid {os.getuid()} is not allowed to connect; add it to "
                                "agent.allowed_uids")
    assert server.stats.rejected["uid"] == 1


def test_a_second_server_on_a_live_socket_is_refused(server):
    other = IngestServer(server.path, on_records=lambda r, c: None)
    with pytest.raises(VramscopeError, match="another agent is listening on"):
        other.bind()


def test_a_stale_socket_is_replaced(short_dir):
    path = f"{short_dir}/run/agent.sock"
    first = IngestServer(path, on_records=lambda r, c: None)
    first.bind()
    first._listener.close()  # dies without cleaning up: the file stays
    second = IngestServer(path, on_records=lambda r, c: None)
    second.bind()
    second.stop()


def test_a_shared_directory_is_refused_not_chmodded(short_dir):
    shared = f"{short_dir}/shared"
    os.mkdir(shared)
    os.chmod(shared, 0o755)
    with pytest.raises(VramscopeError, match="has mode 755 .* needs a private directory"):
        prepare_socket_dir(shared)
    assert os.stat(shared).st_mode & 0o777 == 0o755


def test_while_paused_nothing_is_read_and_then_everything_is(short_dir):
    got, paused = [], [False]
    srv = IngestServer(f"{short_dir}/run/agent.sock", on_records=lambda r, c: got.extend(r),
                       pause=lambda: paused[0])
    srv.start()
    try:
        with AgentConnection(srv.path) as conn:
            conn.hello("t")
            paused[0] = True  # the writer is behind
            _wait_for(lambda: srv.stats.paused_ticks > 0)  # the loop has seen it
            conn.send_records([_s(1), _s(2)])
            time.sleep(0.1)
            assert got == [] and srv.stats.paused_ticks > 0
            paused[0] = False
            assert conn.status()["type"] == "status"
        assert [r.allocated_bytes for r in got] == [1, 2]
    finally:
        srv.stop()


def test_paced_replay_follows_the_trace_timestamps_at_speed(server):
    from vramscope.agent.cli.cmd_replay import replay
    from vramscope.agent.clock import FakeClock

    clock = FakeClock()
    records = [_s(i) for i in (0, 1, 1, 5, 9)]  # spans 9 s of trace time
    assert replay(records, server.path, speed=3.0, clock=clock) == 5
    assert clock.monotonic_s() == pytest.approx(3.0)  # 9 s at 3x
    assert [r.allocated_bytes for r in server.got] == [0, 1, 1, 5, 9]
