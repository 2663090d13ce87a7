"""A real ``vramscope agent`` process on a temporary socket and database."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vramscope.agent.errors import VramscopeError
from vramscope.agent.ingest import protocol as proto
from vramscope.agent.ingest.connection import AgentConnection
from vramscope.agent.records import Phase
from vramscope.agent.store import Store

from tests.support.waiting import wait_for as _wait_for
from tools.agent_process import REPO_ROOT, AgentProcess


@pytest.fixture(scope="module")
def agent_proc():
    root = tempfile.mkdtemp(prefix="vs-agent-", dir="/tmp")  # short: AF_UNIX paths <= 107 bytes
    db_url = f"sqlite:///{root}/vramscope.db"
    proc = AgentProcess(db_url, f"{root}/run/agent.sock", fake_devices=2,
                        log_path=f"{root}/agent.log").start()
    yield proc
    proc.stop()
    shutil.rmtree(root, ignore_errors=True)



CLIENT = textwrap.dedent("""
    import sys, time
    from vramscope.agent.config import parse_config
    from vramscope.agent.records import Phase, Sample
    from vramscope.hooks.client import SocketSink
    path, name, phase = sys.argv[1], sys.argv[2], sys.argv[3]
    sink = SocketSink(path, process=name, devices=(1,))
    now = time.time()  # recent: old timestamps would be rolled up and deleted by retention
    for i in range(50):
        sink.put(Sample(now + i, 1, Phase(phase), "torch", allocated_bytes=i))
    sink.close(timeout_s=5.0)
    print(sink.sent_total, sink.dropped_total)
""")


def test_records_from_two_clients_arrive_with_their_process_and_phase(agent_proc):
    procs = [subprocess.Popen([sys.executable, "-c", CLIENT, agent_proc.socket_path, name, ph],
                              cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                              stdout=subprocess.PIPE, text=True)
             for name, ph in (("server-a", "prefill"), ("server-b", "decode"))]
    outputs = [p.communicate(timeout=30)[0].split() for p in procs]
    assert outputs == [["50", "0"], ["50", "0"]]
    with Store.open(agent_proc.db_url) as st_:
        rows = _wait_for(lambda: len(st_.samples(source="torch")) == 100
                         and st_.samples(source="torch"))
        by_pid = {}
        for s in rows:
            by_pid.setdefault(s.pid, set()).add((s.phase, s.device))
        assert by_pid == {procs[0].pid: {(Phase.PREFILL, 1)}, procs[1].pid: {(Phase.DECODE, 1)}}
        # a hello's process row is a writer task, run after the batch being committed, so it
        # may land just after the samples

        def both_processes():
            names = {p["pid"]: (p["name"], p["devices"]) for p in st_.processes()}
            return {procs[0].pid, procs[1].pid} <= names.keys() and names
        names = _wait_for(both_processes)
    assert names[procs[0].pid] == ("server-a", "1")
    assert names[procs[1].pid] == ("server-b", "1")


def test_a_wrong_protocol_version_is_refused_with_a_message(agent_proc):
    with AgentConnection(agent_proc.socket_path) as conn, \
            pytest.raises(VramscopeError) as err:
        conn.hello(protocol=2)
    assert str(err.value) == ("the agent refused the connection: protocol version 2 is not "
                              "supported; this agent speaks version 1 (an integer)")
    assert agent_proc.status()["rejected"]["version"] >= 1


def test_socket_and_directory_permissions(agent_proc):
    dir_mode = os.stat(os.path.dirname(agent_proc.socket_path)).st_mode
    sock_mode = os.stat(agent_proc.socket_path).st_mode
    assert stat.S_IMODE(dir_mode) == 0o700
    assert stat.S_ISSOCK(sock_mode) and stat.S_IMODE(sock_mode) == 0o600


def test_nvml_samples_and_agent_stats_are_stored(agent_proc):
    with Store.open(agent_proc.db_url) as st_:
        nvml = _wait_for(lambda: st_.samples(source="nvml"))
        assert {s.device for s in nvml} == {0, 1}
        assert all(s.device_total_bytes == 80 * 2**30 for s in nvml)
        devices = {d["device_index"]: d["uuid"] for d in st_.devices()}
        assert devices[0] == "GPU-fake-0000" and devices[1] == "GPU-fake-0001"
        stats = _wait_for(st_.latest_agent_stats, timeout_s=12)
        assert stats["queue_depth"] >= 0 and stats["db_size_bytes"] > 0


# --- malformed input: the agent must neither crash nor hang ---------------------------------
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids,
                                                               max_size=4), max_leaves=12)
_bad_records = st.dictionaries(
    st.sampled_from(["ts", "device", "phase", "pid", "event", "allocated_bytes", "source"]),
    _json_values, max_size=5)
_payload_objects = st.one_of(
    _json_values,
    st.fixed_dictionaries({"type": st.sampled_from(sorted(proto.CLIENT_TYPES))}, optional={
        "records": st.lists(_bad_records, max_size=4) | _json_values,
        "protocol": _json_values, "count": _json_values, "postmortem": _json_values,
        "devices": _json_values, "pid": _json_values}),
)


def _framed(obj) -> bytes:
    data = proto.json.dumps(obj).encode()
    return proto.HEADER.pack(len(data)) + data


_messages = st.one_of(
    st.binary(max_size=64),  # raw garbage, no framing
    st.binary(max_size=64).map(lambda b: proto.HEADER.pack(len(b)) + b),  # framed garbage
    _payload_objects.map(_framed),  # framed JSON of the wrong shape
    st.integers(2**20 + 1, 2**32 - 1).map(lambda n: proto.HEADER.pack(n) + b"{}"),  # oversized
    _payload_objects.map(lambda o: _framed(o)[:-1]),  # truncated
)


def _send_malformed(path: str, with_hello: bool, data: bytes) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5.0)
    sock.connect(path)
    if with_hello:
        sock.sendall(proto.hello(os.getpid(), "fuzz"))
    try:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):  # until the agent closes (or answers and closes)
            pass
    except (BrokenPipeError, ConnectionResetError):
        pass  # the agent dropped us mid-send: fine
    finally:
        sock.close()


def _fuzz(agent_proc, examples: int):
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(with_hello=st.booleans(), data=_messages)
    def check(with_hello, data):
        _send_malformed(agent_proc.socket_path, with_hello, data)
        assert agent_proc.status()["type"] == "status"  # still answering, within 5 s

    before = agent_proc.status()["rejected_total"]
    check()
    after = agent_proc.status()
    assert agent_proc.proc.poll() is None
    assert after["rejected_total"] > before
    with AgentConnection(agent_proc.socket_path) as conn:  # a good client is still served
        conn.hello("after-fuzz")
        assert conn.status()["type"] == "status"


def test_malformed_messages_never_crash_or_hang_the_agent(agent_proc):
    _fuzz(agent_proc, 500)


@pytest.mark.slow
def test_malformed_messages_many(agent_proc):
    _fuzz(agent_proc, 20_000)


def test_replay_and_status_commands(agent_proc, tmp_path, capsys):
    from vramscope.agent.cli import main

    trace = tmp_path / "t.jsonl"
    # recent: retention rolls up and deletes week-old rows, and the agent refuses records
    # more than 5 minutes ahead of its clock
    now = time.time() - 1300
    lines = [f'{{"ts": {now + i}, "device": 0, "phase": "idle", "source": "replayed", '
             f'"pid": 77, "reserved_bytes": {i}}}' for i in range(1200)]
    lines.append(f'{{"ts": {now + 1300}, "event": "request_end", "request_id": "r9", '
                 f'"pid": 77}}')
    trace.write_text("\n".join(lines) + "\n")
    assert main(["replay", str(trace), "--socket", agent_proc.socket_path,
                 "--as-fast-as-possible"]) == 0
    assert capsys.readouterr().out == f"replayed 1201 records from {trace}\n"
    with Store.open(agent_proc.db_url) as st_:
        rows = _wait_for(lambda: len(st_.samples(source="replayed")) == 1200
                         and st_.samples(source="replayed"))
        assert [s.reserved_bytes for s in rows] == list(range(1200))
        assert {s.pid for s in rows} == {77}
        _wait_for(lambda: st_.events(names=["request_end"]))
    assert main(["status", "--socket", agent_proc.socket_path, "--json"]) == 0
    status = proto.json.loads(capsys.readouterr().out)
    assert "ts" not in status["rejected"]  # the trace was inside the agent's time window
    assert status["running"] is True and len(status["devices"]) == 2
    assert status["records_received_total"] >= 1201
    assert main(["status", "--socket", agent_proc.socket_path]) == 0
    text = capsys.readouterr().out
    assert "devices: 2" in text and "queue depth:" in text and "rejected messages:" in text


def test_status_without_an_agent_shows_the_stored_state_and_exits_1(agent_proc, capsys):
    from vramscope.agent.cli import main

    assert main(["status", "--socket", "/tmp/vs-nowhere/agent.sock", "--db",
                 agent_proc.db_url]) == 1
    out = capsys.readouterr().out
    assert out.startswith("agent: not running (cannot connect to the agent at "
                          "/tmp/vs-nowhere/agent.sock")
    assert "last report" in out and "devices: 2" in out


def test_an_old_trace_is_refused_unless_replayed_with_retime(agent_proc, tmp_path, capsys):
    """Issue 32, item 9: last week's incident replayed into a live agent was rolled up and
    deleted as soon as it landed. Without ``--retime`` the agent refuses it (its time window)
    and the output says what to do; with it, the trace is stamped as ending now."""
    from vramscope.agent.cli import main

    trace = tmp_path / "week-old.jsonl"
    week_ago = time.time() - 7 * 86400
    trace.write_text("".join(f'{{"ts": {week_ago + i}, "device": 1, "source": "old-incident", '
                             f'"pid": 78, "reserved_bytes": {i}}}\n' for i in range(100)))
    assert main(["replay", str(trace), "--socket", agent_proc.socket_path,
                 "--as-fast-as-possible"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"replayed 100 records from {trace}",
                   "the agent refused 100 records as outside its time window (older than "
                   "agent.max_record_age_s or ahead of its clock; counted as rejected 'ts'): "
                   "replay with --retime to stamp the trace as ending now, or use `vramscope "
                   "import` to keep its times"]
    before = time.time()
    assert main(["replay", str(trace), "--socket", agent_proc.socket_path,
                 "--as-fast-as-possible", "--retime"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"replayed 100 records from {trace}, re-timed to end at ")
    with Store.open(agent_proc.db_url) as st_:
        rows = _wait_for(lambda: len(st_.samples(1, source="old-incident")) == 100
                         and st_.samples(1, source="old-incident"))
    assert [s.reserved_bytes for s in rows] == list(range(100))
    assert before <= rows[-1].ts_s <= time.time() and rows[-1].ts_s - rows[0].ts_s == 99.0
