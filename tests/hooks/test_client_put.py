"""The socket client's lock-free put: drops counted exactly, from several threads at once."""

from __future__ import annotations

import sys
import threading

from vramscope.agent.ingest.server import IngestServer
from vramscope.agent.records import Phase, Sample
from vramscope.hooks.client import SocketSink

from tests.support.waiting import wait_for as _wait_for


def _sample(i: int) -> Sample:
    return Sample(float(i), 0, Phase.DECODE, "torch", allocated_bytes=i)


def test_reading_the_drop_count_does_not_change_it():
    sink = SocketSink("/nonexistent/vs.sock", buffer_records=4, start=False)
    for i in range(7):
        sink.put(_sample(i))
    assert [sink.dropped_total for _ in range(3)] == [3, 3, 3]  # reads tick the counter too
    sink.put(_sample(7))
    assert (sink.dropped_total, sink.buffered) == (4, 4)
    assert [r.allocated_bytes for r in sink._take()] == [4, 5, 6, 7]  # the oldest went first
    sink.put(_sample(8))
    assert (sink.dropped_total, sink.buffered) == (4, 1)  # taken records are not drops


def test_threads_putting_at_once_while_the_drain_sends_lose_no_count(short_dir):
    """4 threads put 5,000 records each into a 64-record buffer while the drain thread sends
    and a fifth thread reads the drop count: it never goes down, and at the end every record
    was either received by the agent or counted as dropped, exactly once."""
    received: list = []
    srv = IngestServer(f"{short_dir}/run/agent.sock",
                       on_records=lambda recs, _c: received.extend(recs))
    srv.start()
    sink = SocketSink(srv.path, buffer_records=64, poll_s=0.001)
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: more interleavings
    try:
        seen, stop = [], threading.Event()
        reader = threading.Thread(target=lambda: _read_until(sink, stop, seen))
        reader.start()
        putters = [threading.Thread(target=_put_many, args=(sink, k * 5000, 5000))
                   for k in range(4)]
        for t in putters:
            t.start()
        for t in putters:
            t.join()
        stop.set()
        reader.join()
    finally:
        sys.setswitchinterval(old_interval)
    _wait_for(lambda: sink.buffered == 0)
    sink.close()
    _wait_for(lambda: len(received) == sink.sent_total)
    srv.stop()
    assert seen == sorted(seen) and sink.dropped_total > 0
    assert len(received) + sink.dropped_total == 20_000
    assert len({r.allocated_bytes for r in received}) == len(received)  # none twice


def _put_many(sink: SocketSink, first: int, n: int) -> None:
    for i in range(first, first + n):
        sink.put(_sample(i))


def _read_until(sink: SocketSink, stop: threading.Event, seen: list) -> None:
    while not stop.is_set():
        seen.append(sink.dropped_total)

