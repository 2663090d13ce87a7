"""Alert sinks: a real store, a real local HTTP server for the webhook, the log."""

import http.server
import json
import logging
import threading

import pytest
from vramscope.agent.alerts.engine import AlertChange
from vramscope.agent.alerts.sinks import LogSink, StoreSink, WebhookSink, sinks_from_config
from vramscope.agent.clock import FakeClock
from vramscope.agent.config import parse_config

FIRED = AlertChange("fired", "oom_risk", "warning", 0, 100.0, 0.5, "low headroom",
                    {"team": "a"}, 100.0)
RESOLVED = FIRED._replace(kind="resolved", ts_s=160.0)


def test_store_sink_opens_and_resolves_one_row(store):
    sink = StoreSink(store)
    sink.send(FIRED)
    [row] = store.alerts()
    assert (row["rule"], row["severity"], row["fired_ts_s"], row["resolved_ts_s"], row["value"],
            row["labels"], row["device"]) == ("oom_risk", "warning", 100.0, None, 0.5,
                                              {"team": "a"}, 0)
    sink.send(RESOLVED)
    [row] = store.alerts()
    assert row["resolved_ts_s"] == 160.0
    assert store.alerts(active_only=True) == []


def test_store_sink_never_raises(store, caplog):
    store.close()
    sink = StoreSink(object())  # no open_alert at all
    with caplog.at_level(logging.ERROR, logger="vramscope.alerts"):
        sink.send(FIRED)
    assert "could not store alert oom_risk" in caplog.text


class _Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        server = self.server
        server.bodies.append(json.loads(body))
        status = server.statuses.pop(0) if server.statuses else 200
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def hook_server():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    server.bodies, server.statuses = [], []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_webhook_posts_the_documented_body(hook_server):
    url = f"http://127.0.0.1:{hook_server.server_port}/hook"
    sink = WebhookSink(url, clock=FakeClock())
    sink.send(FIRED)
    sink.close()
    assert hook_server.bodies == [{
        "format": "vramscope.alert/1", "kind": "fired", "rule": "oom_risk",
        "severity": "warning", "device": 0, "host": None, "ts": 100.0, "fired_ts": 100.0,
        "value": 0.5, "message": "low headroom", "labels": {"team": "a"}}]
    assert (sink.sent, sink.failed, sink.dropped) == (1, 0, 0)


def test_webhook_retries_with_backoff_on_the_injected_clock(hook_server):
    hook_server.statuses = [500, 503]
    clock = FakeClock(0.0)
    sink = WebhookSink(f"http://127.0.0.1:{hook_server.server_port}/", retries=3,
                       backoff_s=0.5, clock=clock)
    sink.send(FIRED)
    sink.close()
    assert len(hook_server.bodies) == 3
    assert clock.monotonic_s() == 1.5  # waited 0.5 then 1.0
    assert (sink.sent, sink.failed) == (1, 0)


def test_webhook_gives_up_after_its_retries_and_logs(caplog):
    calls = []

    def refuse(url, body, timeout_s):
        calls.append(timeout_s)
        raise OSError("connection refused")

    sink = WebhookSink("http://x/", retries=2, timeout_s=1.5, clock=FakeClock(), post=refuse)
    with caplog.at_level(logging.ERROR, logger="vramscope.alerts"):
        sink.send(FIRED)
        sink.close()
    assert calls == [1.5, 1.5, 1.5]
    assert sink.failed == 1
    assert "failed after 3 tries: connection refused" in caplog.text


def test_a_full_webhook_queue_drops_instead_of_blocking():
    gate = threading.Event()

    def slow(url, body, timeout_s):
        gate.wait(10)
        return 200

    sink = WebhookSink("http://x/", queue_max=1, clock=FakeClock(), post=slow)
    for _ in range(5):
        sink.send(FIRED)  # one in flight, one queued, three dropped; never blocks
    gate.set()
    sink.close()
    assert sink.dropped >= 3
    assert sink.sent + sink.dropped == 5


def test_log_sink(caplog):
    with caplog.at_level(logging.INFO, logger="vramscope.alerts"):
        LogSink().send(FIRED)
    assert ("alert fired oom_risk [warning] device 0 at 1970-01-01T00:01:40.000Z: low headroom"
            in caplog.text)  # ISO 8601 UTC in the log, not raw Unix seconds


def test_sinks_from_config(store):
    plain = sinks_from_config(parse_config({}, None, {}), store)
    assert [type(s).__name__ for s in plain] == ["LogSink", "StoreSink"]
    hooked = sinks_from_config(parse_config({"alerts": {"webhook_url": "http://x/"}}, None, {}))
    assert [type(s).__name__ for s in hooked] == ["LogSink", "WebhookSink"]
    hooked[1].close()
