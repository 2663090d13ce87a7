"""Protocol edges and access, against a real agent process on a real socket: the hello's types,
`vramscope status` meeting an error frame, `agent.allowed_uids` as documented (another user
connecting through a mode-710 directory), and drops at a client's shutdown reaching the agent.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from vramscope.agent.ingest import protocol as proto
from vramscope.agent.ingest.connection import AgentConnection
from vramscope.agent.records import Phase, Sample

from tests.support.waiting import wait_for
from tools.agent_process import AgentProcess


@pytest.fixture
def agent(short_dir):
    proc = AgentProcess(f"sqlite:///{short_dir}/vs.db", f"{short_dir}/run/agent.sock",
                        log_path=f"{short_dir}/agent.log").start()
    yield proc
    proc.stop()


def _refusal(path: str, hello: dict) -> str:
    with AgentConnection(path) as conn:
        conn.send(proto.frame(hello))
        reply = conn.read()
    assert reply["type"] == "error"
    return reply["message"]


@pytest.mark.parametrize("protocol", [1.0, True, "1"])
def test_a_hello_whose_protocol_is_not_the_integer_1_is_refused(agent, protocol):
    message = _refusal(agent.socket_path, {"type": "hello", "protocol": protocol, "pid": 5})
    assert message == (f"protocol version {protocol!r} is not supported; this agent speaks "
                       "version 1 (an integer)")


@pytest.mark.parametrize("pid", [-1, 2**31, 2**63])
def test_a_hello_with_an_impossible_pid_is_refused(agent, pid):
    message = _refusal(agent.socket_path, {"type": "hello", "protocol": 1, "pid": pid})
    assert message == f"'pid' must be a process id from 0 to 2147483647, got {pid}"


def test_status_reports_an_error_frame_instead_of_crashing(short_dir):
    """An agent (here a real socket that answers like a refusing agent) replies `error`:
    `vramscope status` says so and exits 1, no KeyError traceback."""
    path = f"{short_dir}/fake.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def answer() -> None:
        conn, _ = listener.accept()
        conn.recv(1024)
        conn.sendall(proto.frame({"type": "error", "message": "too many clients (limit 256)"}))
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    done = subprocess.run([sys.executable, "-m", "vramscope", "status", "--socket", path,
                           "--db", f"sqlite:///{short_dir}/none.db"], capture_output=True,
                          text=True, timeout=60)
    listener.close()
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert (f"agent: not running (the agent at {path} answered: too many clients (limit 256))"
            in done.stdout)


def test_allowed_uids_work_as_documented_through_a_710_directory(short_dir):
    """The docs' setup: the socket directory lets the other user through with a group (mode
    710, as an ACL also shows it); that user's process connects and its rows are stored."""
    if os.getuid() != 0:
        pytest.skip("needs root to run a client as another user")
    nobody = 65534
    os.chmod(short_dir, 0o711)
    run_dir = f"{short_dir}/run"
    os.mkdir(run_dir)
    os.chown(run_dir, 0, nobody)
    os.chmod(run_dir, 0o710)
    proc = AgentProcess(f"sqlite:///{short_dir}/vs.db", f"{run_dir}/agent.sock",
                        log_path=f"{short_dir}/agent.log",
                        env={"VRAMSCOPE_AGENT_ALLOWED_UIDS": str(nobody)}).start()
    try:
        assert _as_user(nobody, proc.socket_path) == 0
        assert os.stat(proc.socket_path).st_mode & 0o777 == 0o666
    finally:
        proc.stop()
    import sqlite3

    with sqlite3.connect(f"{short_dir}/vs.db") as c:
        assert c.execute("SELECT count(*) FROM samples WHERE source='nobody'").fetchone() == (1,)


def _as_user(uid: int, path: str) -> int:
    """Fork a real process that drops to ``uid`` and sends one sample; its exit code."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.setgid(uid)
            os.setuid(uid)
            with AgentConnection(path) as conn:
                conn.hello("other-user", pid=77)
                conn.send_records([Sample(time.time(), 0, Phase.IDLE, "nobody", 77)])
                code = 0 if conn.status()["type"] == "status" else 2
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_without_allowed_uids_a_710_directory_is_still_refused(short_dir):
    os.mkdir(f"{short_dir}/run", 0o710)
    os.chmod(f"{short_dir}/run", 0o710)
    proc = AgentProcess(f"sqlite:///{short_dir}/vs.db", f"{short_dir}/run/agent.sock",
                        log_path=f"{short_dir}/agent.log")
    with pytest.raises(RuntimeError, match="needs a private directory .mode 700"):
        proc.start()


def test_drops_at_client_shutdown_reach_the_agent(short_dir):
    """The agent restarts under a connected client; the client's next batch fails as it
    closes. The drops of that batch are reported over a fresh connection before it exits."""
    from vramscope.hooks.client import SocketSink

    path = f"{short_dir}/run/agent.sock"
    first = AgentProcess(f"sqlite:///{short_dir}/vs.db", path).start()
    sink = SocketSink(path, poll_s=60.0)  # the drain thread wakes only when close() asks
    wait_for(lambda: sink.connected)
    first.stop(signal.SIGKILL)
    second = AgentProcess(f"sqlite:///{short_dir}/vs.db", path).start()
    try:
        for i in range(50):
            sink.put(Sample(1e9 + i, 0, Phase.IDLE, "late", 5))
        sink.close(timeout_s=10)
        assert sink.dropped_total == 50
        assert second.status()["client_dropped_total"] == 50
    finally:
        second.stop()


def test_status_json_has_the_robustness_counters(agent):
    status = agent.status()
    for key in ("accept_errors", "loop_errors", "log_suppressed", "db_refused_total",
                "at_risk_records"):
        assert status[key] == 0
    json.dumps(status)
