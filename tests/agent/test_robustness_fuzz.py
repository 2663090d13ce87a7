"""One bad client must never cost another its rows: a real agent process, a real socket and a
real SQLite database, a well-behaved client sending throughout, and hostile messages of every
type from Hypothesis (lone surrogates, huge integers, deep nesting, long strings, partial and
oversized frames). Every row of the good client must arrive and the agent must keep answering.
"""

from __future__ import annotations

import json
import shutil
import socket
import sqlite3
import tempfile
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vramscope.agent.ingest import protocol as proto
from vramscope.agent.ingest.connection import AgentConnection
from vramscope.agent.records import Phase, Sample

from tests.support.waiting import wait_for
from tools.agent_process import AgentProcess

GOOD_PID = 4242


class Deep:
    """A value nested ``depth`` lists deep, written as JSON text (json.dumps would recurse)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth


def encode(obj: Any) -> str:
    """JSON text of ``obj``; lone surrogates escaped as JSON does, ``Deep`` written flat."""
    if isinstance(obj, Deep):
        return "[" * obj.depth + "]" * obj.depth
    if isinstance(obj, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{encode(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, list):
        return "[" + ",".join(encode(v) for v in obj) + "]"
    return json.dumps(obj)


def framed(obj: Any) -> bytes:
    payload = encode(obj).encode("ascii")  # ensure_ascii: surrogates travel as \\ud800 escapes
    return proto.HEADER.pack(len(payload)) + payload


# --- strategies -------------------------------------------------------------------------------
SURROGATES = st.sampled_from(["\ud800", "a\udfffb", "\udc00\ud800", "ok\ud83d"])
LONG = st.integers(33, 3000).map(lambda n: "x" * n)
nasty_str = st.one_of(st.text(max_size=12), SURROGATES, LONG, st.none())
HUGE = st.sampled_from([-1, -2**63, 2**31, 2**31 - 1, 2**63 - 1, 2**63, 2**64, 10**400])
nasty_int = st.one_of(st.integers(-10, 10**6), HUGE, st.floats(allow_nan=False), st.booleans(),
                      st.none(), st.text(max_size=3))
deep = st.integers(1, 3000).map(Deep)
nasty_value = st.one_of(nasty_str, nasty_int, deep,
                        st.dictionaries(st.one_of(st.text(max_size=5), SURROGATES), nasty_str,
                                        max_size=3))


def record():
    sample = st.fixed_dictionaries({"ts": st.one_of(st.floats(0, 2e9), HUGE, nasty_int)}, optional={
        "device": nasty_int, "pid": nasty_int, "phase": st.one_of(
            st.sampled_from(["idle", "decode", "lunch"]), nasty_str),
        "source": nasty_str, "host": nasty_str, "allocated_bytes": nasty_int,
        "reserved_bytes": nasty_int, "device_uuid": nasty_str})
    event = st.fixed_dictionaries({"ts": st.floats(0, 2e9), "event": nasty_str}, optional={
        "request_id": st.one_of(nasty_str, nasty_int), "data": nasty_value, "x": nasty_value,
        "host": nasty_str, "pid": nasty_int})
    return st.one_of(sample, event)


hello_msg = st.fixed_dictionaries({"type": st.just("hello"), "protocol": st.one_of(
    st.just(1), st.just(1.0), st.just(True), st.just("1"), nasty_int)}, optional={
    "pid": nasty_int, "process": nasty_str, "model": nasty_str,
    "devices": st.one_of(st.lists(nasty_int, max_size=4), nasty_value)})
records_msg = st.fixed_dictionaries({"type": st.just("records"),
                                     "records": st.lists(record(), max_size=8)})
postmortem_msg = st.fixed_dictionaries({"type": st.just("postmortem"), "postmortem": (
    st.fixed_dictionaries({"ts_s": st.one_of(st.floats(0, 2e9), nasty_int)}, optional={
        "device": nasty_int, "pid": nasty_int, "cause": nasty_str, "message": nasty_str,
        "phase": nasty_str, "segments": st.lists(nasty_value, max_size=2),
        "top_holders": st.lists(st.fixed_dictionaries({"size_bytes": nasty_int, "frames": (
            st.lists(nasty_str, max_size=3))}), max_size=2)}))})
dropped_msg = st.fixed_dictionaries({"type": st.just("dropped"), "count": nasty_int})
status_msg = st.just({"type": "status"})
odd_msg = st.one_of(nasty_value, st.fixed_dictionaries({"type": nasty_str}))

message = st.one_of(records_msg, postmortem_msg, dropped_msg, status_msg, odd_msg, hello_msg)
raw = st.one_of(
    st.binary(max_size=64).map(lambda b: proto.HEADER.pack(len(b)) + b),  # garbage payload
    st.binary(min_size=1, max_size=40),  # a partial frame, or bytes out of sync
    st.integers(2**21, 2**32 - 1).map(lambda n: proto.HEADER.pack(n)),  # oversized length
)
frame_bytes = st.one_of(*[message.map(framed)] * 5, raw)  # raw bytes mostly end the connection
connection_script = st.tuples(
    st.one_of(*[st.just({"type": "hello", "protocol": 1, "pid": 7, "process": "fuzz"})] * 3,
              hello_msg),
    st.lists(frame_bytes, min_size=4, max_size=24))


# --- the agent and the well-behaved client ---------------------------------------------------
class GoodClient(threading.Thread):
    def __init__(self, path: str) -> None:
        super().__init__(name="good-client", daemon=True)
        self.path, self.sent, self.stop_flag = path, 0, threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with AgentConnection(self.path) as conn:
                conn.hello("good", pid=GOOD_PID)
                base = time.time() - 30
                while not self.stop_flag.is_set():
                    conn.send_records([Sample(base + (self.sent + k) * 1e-4, 0, Phase.DECODE,
                                              "good", None, allocated_bytes=self.sent + k)
                                       for k in range(50)])
                    self.sent += 50
                    time.sleep(0.005)
                conn.status()  # everything sent before it was read
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


@pytest.fixture(scope="module")
def agent():
    root = tempfile.mkdtemp(prefix="vs-fuzz-", dir="/tmp")
    proc = AgentProcess(f"sqlite:///{root}/vs.db", f"{root}/run/agent.sock",
                        log_path=f"{root}/agent.log").start()
    proc.db_path = f"{root}/vs.db"
    yield proc
    proc.stop()
    shutil.rmtree(root, ignore_errors=True)


def _rows(db: str, where: str) -> list:
    with sqlite3.connect(db, timeout=10) as c:
        return c.execute(f"SELECT allocated_bytes, pid FROM samples WHERE {where}").fetchall()


def play(path: str, script: tuple[dict, list[bytes]]) -> int:
    """One hostile connection; returns the messages sent before the agent hung up."""
    hello, frames = script
    sent = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(path)
        try:
            for data in [framed(hello), *frames]:
                sock.sendall(data)
                sent += 1
        except OSError:
            pass  # the agent closed a connection it could not trust: expected
    return sent


SENT = {"messages": 0}


def _fuzz(agent: AgentProcess, examples: int) -> None:
    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(script=connection_script)
    def run(script):
        SENT["messages"] += play(agent.socket_path, script)

    run()


def _fuzz_while_a_good_client_sends(agent: AgentProcess, examples: int, minimum: int) -> None:
    before = agent.status()["written_total"]
    good = GoodClient(agent.socket_path)
    good.start()
    SENT["messages"] = 0
    _fuzz(agent, examples)
    good.stop_flag.set()
    good.join(30)
    assert good.error is None, good.error
    assert SENT["messages"] >= minimum, SENT
    status = agent.status()  # still answering
    assert "internal" not in status["rejected"], status["rejected"]  # no validator crashed
    assert status["loop_errors"] == 0
    assert status["written_total"] > before
    rows = wait_for(lambda: (r := _rows(agent.db_path, "source='good'")) and
                    len(r) == good.sent and r, timeout_s=20)
    assert sorted(a for a, _ in rows) == list(range(good.sent))
    assert len({p for _, p in rows}) == 1  # one client's pid (the hello's or the kernel's)
    assert agent.proc.poll() is None


def test_fuzzed_messages_of_every_type_never_cost_a_good_client_a_row(agent):
    _fuzz_while_a_good_client_sends(agent, examples=350, minimum=2000)


@pytest.mark.slow
def test_fuzzed_messages_at_length(agent):
    _fuzz_while_a_good_client_sends(agent, examples=6600, minimum=50_000)


def test_a_bad_client_in_the_same_batch_costs_the_good_client_nothing(agent):
    """The issue's case: hello pid 2**63 (was copied into every record without a pid) and lone
    surrogates in source, host and request_id, interleaved with a good client's 1,000 rows in
    one write batch. The good rows all arrive; the bad ones are refused at the door."""
    before = agent.status()["rejected"]
    with AgentConnection(agent.socket_path) as good, AgentConnection(agent.socket_path) as bad:
        good.hello("good", pid=GOOD_PID + 1)
        with pytest.raises(Exception, match="'pid' must be a process id from 0 to 2147483647"):
            AgentConnection(agent.socket_path).hello("evil", pid=2**63)
        bad.hello("evil", pid=666)
        for i in range(10):
            good.send_records([Sample(time.time() - 20 + i, 0, Phase.IDLE, "good2", None,
                                      allocated_bytes=i * 100 + k) for k in range(100)])
            bad.send(framed({"type": "records", "records": [
                {"ts": 1.0, "source": "\ud800"}, {"ts": 1.0, "host": "\udfff"},
                {"ts": 1.0, "event": "request_start", "request_id": "\ud800"}][i % 3:]}))
        good.status()
        status = bad.status()
    rows = wait_for(lambda: (r := _rows(agent.db_path, "source='good2'")) and len(r) == 1000
                    and r)
    assert len({p for _, p in rows}) == 1 and 666 not in {p for _, p in rows}
    assert status["rejected"].get("schema", 0) - before.get("schema", 0) == 11  # + the hello
    assert status["rejected"].get("schema", 0) >= 10 and status["db_refused_total"] == 0
