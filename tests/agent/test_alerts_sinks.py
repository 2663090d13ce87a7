"""Alert sinks: a real store, a real local HTTP server for the webhook, the log."""

import http.server
import json
import logging
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vramscope.agent.alerts.delivery import DeliveryQueue
from vramscope.agent.alerts.engine import AlertChange
from vramscope.agent.alerts.sinks import LogSink, StoreSink, WebhookSink, sinks_from_config
from vramscope.agent.clock import FakeClock
from vramscope.agent.config import parse_config

from tests.support.waiting import wait_for

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
    for device in range(5):  # five alerts: one in flight, one queued, three dropped
        sink.send(FIRED._replace(device=device))  # never blocks
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


# --- issue 45: delivery that never loses what matters ----------------------------------------

class _Receiver:
    """A fake webhook receiver: records each body it accepts; ``gate`` holds every POST."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def post(self, url, body, timeout_s):
        self.entered.set()
        self.gate.wait(10)
        self.bodies.append(json.loads(body))
        return 200

    def seen(self) -> list[tuple[str, str, int]]:
        return [(b["severity"], b["kind"], b["device"]) for b in self.bodies]


WARN = FIRED._replace(rule="flappy", message="flaps")
OOM = FIRED._replace(rule="oom", severity="critical", message="OOM")


def _blocked_sink(receiver: _Receiver, **kwargs) -> WebhookSink:
    """A sink whose first POST (a warning on device 999) is in flight, held by the gate."""
    receiver.gate.clear()
    sink = WebhookSink("http://x/", clock=FakeClock(), post=receiver.post, **kwargs)
    sink.send(WARN._replace(device=999))
    assert receiver.entered.wait(5)
    return sink


def test_a_critical_alert_never_waits_behind_warnings():
    receiver = _Receiver()
    sink = _blocked_sink(receiver)
    for device in range(500):
        sink.send(WARN._replace(device=device))
    sink.send(OOM)
    receiver.gate.set()
    wait_for(lambda: len(receiver.bodies) == 502)
    sink.close()
    assert receiver.seen()[:3] == [("warning", "fired", 999), ("critical", "fired", 0),
                                   ("warning", "fired", 0)]


def test_a_full_queue_drops_the_oldest_least_severe_and_never_a_critical_alert(caplog):
    receiver = _Receiver()
    sink = _blocked_sink(receiver, queue_max=3)
    with caplog.at_level(logging.ERROR, logger="vramscope.alerts"):
        for change in (WARN._replace(severity="info", device=1), WARN._replace(device=2),
                       WARN._replace(device=3), OOM._replace(device=4),
                       WARN._replace(device=5)):
            sink.send(change)
    receiver.gate.set()
    wait_for(lambda: len(receiver.bodies) == 4)
    sink.close()
    assert [d for _, _, d in receiver.seen()] == [999, 4, 3, 5]  # info 1, then warning 2 dropped
    assert sink.counts()["dropped"] == 2
    assert "queue of 3 alerts is full, 1 changes dropped so far" in caplog.text


def test_critical_alerts_are_kept_beyond_the_queue_bound():
    receiver = _Receiver()
    sink = _blocked_sink(receiver, queue_max=2)
    for device in range(10):
        sink.send(OOM._replace(device=device))
    receiver.gate.set()
    wait_for(lambda: len(receiver.bodies) == 11)
    sink.close()
    assert sink.dropped == 0


def test_a_flapping_alert_is_damped_to_its_hourly_cap_and_its_last_state_delivered():
    """One alert fired and resolved 6,000 times in an hour: at most its cap of deliveries
    that hour (one per flap before), and its final state once the hour allows."""
    receiver, clock = _Receiver(), FakeClock(0.0)
    sink = WebhookSink("http://x/", clock=clock, post=receiver.post)  # 20 an hour
    for k in range(6000):
        sink.send(WARN._replace(kind="fired" if k % 2 == 0 else "resolved", ts_s=k * 0.6))
        if k < 20:  # a receiver that keeps up: each of these is delivered at once
            wait_for(lambda k=k: len(receiver.bodies) == k + 1)
        clock.advance(0.6)
    time.sleep(0.5)  # what the sink would send now, it has sent
    assert len(receiver.bodies) <= 21  # 20 in the first hour, one more as the hour rolls on
    sink.send(WARN._replace(kind="fired", ts_s=3600.0))
    clock.advance(3600.0)
    wait_for(lambda: sink.queued == 0 and receiver.bodies[-1]["ts"] == 3600.0)
    sink.close()
    assert receiver.bodies[-1]["kind"] == "fired"
    assert sink.counts()["coalesced"] >= 5900


def test_a_critical_alert_firing_again_is_not_held_by_its_cap():
    receiver, clock = _Receiver(), FakeClock(0.0)
    sink = WebhookSink("http://x/", clock=clock, post=receiver.post, max_per_hour=2)
    for k in range(10):
        sink.send(OOM._replace(kind="fired" if k % 2 == 0 else "resolved", ts_s=float(k)))
        wait_for(lambda k=k: len(receiver.bodies) >= min(k + 1, 3))
    time.sleep(0.3)  # what the sink would send now, it has sent
    sink.close()
    # fired, resolved (the cap), fired again at once; the receiver holds "fired" from then on
    assert [b["kind"] for b in receiver.bodies] == ["fired", "resolved", "fired"]


def test_a_change_that_failed_is_delivered_when_the_target_answers_again():
    clock, answers = FakeClock(0.0), [OSError("refused")] * 4
    bodies: list[dict] = []

    def post(url, body, timeout_s):
        if answers:
            raise answers.pop()
        bodies.append(json.loads(body))
        return 200

    sink = WebhookSink("http://x/", clock=clock, post=post, retries=3)
    sink.send(OOM)
    wait_for(lambda: sink.failed == 1)
    sink.send(WARN)
    clock.advance(2.0)  # the next try while down
    wait_for(lambda: len(bodies) == 2)
    sink.close()
    assert [b["rule"] for b in bodies] == ["oom", "flappy"]
    assert (sink.sent, sink.failed) == (2, 1)


def test_the_delivery_settings_come_from_the_config():
    config = parse_config({"alerts": {"webhook_url": "http://x/", "webhook_queue_max": 7,
                                      "webhook_max_per_alert_per_hour": 3}}, None, {})
    sink = WebhookSink.from_config(config)
    assert (sink._queue.max_changes, sink._queue.max_per_hour) == (7, 3)
    sink.close()


def test_a_change_the_receiver_refuses_is_not_tried_again_and_blocks_nothing(caplog):
    statuses = {"oom": 400, "flappy": 200}
    posted: list[str] = []

    def post(url, body, timeout_s):
        rule = json.loads(body)["rule"]
        posted.append(rule)
        return statuses[rule]

    sink = WebhookSink("http://x/", clock=FakeClock(), post=post)
    with caplog.at_level(logging.ERROR, logger="vramscope.alerts"):
        sink.send(OOM)
        sink.send(WARN)
        wait_for(lambda: sink.sent == 1)
        sink.close()
    assert posted == ["oom", "flappy"] and (sink.failed, sink.queued) == (1, 0)
    assert "refused the fired change of oom: HTTP 400; not tried again" in caplog.text


def test_each_alert_waits_with_its_newest_state_but_a_critical_fire_is_never_coalesced():
    receiver = _Receiver()
    sink = _blocked_sink(receiver)
    for kind in ("fired", "resolved", "fired", "resolved"):
        sink.send(WARN._replace(kind=kind, device=1))
        sink.send(OOM._replace(kind=kind))
    receiver.gate.set()
    wait_for(lambda: len(receiver.bodies) == 4)
    time.sleep(0.3)  # nothing more comes
    sink.close()
    assert receiver.seen() == [("warning", "fired", 999), ("critical", "fired", 0),
                               ("critical", "resolved", 0), ("warning", "resolved", 1)]
    assert sink.counts()["coalesced"] == 5  # 2 of the OOM alert's states, 3 of the warning's


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "take_ok", "take_fail"]),
                          st.integers(0, 5), st.floats(0, 600)), max_size=300))
def test_the_delivery_queue_never_drops_a_critical_alert_and_ends_at_each_newest_state(ops):
    """Random puts, deliveries and failures: no critical change is dropped, the queue holds at
    most its bound beside critical alerts, and drained, the receiver holds each alert's
    newest state (unless that alert, not critical, was dropped)."""
    queue, now, newest, held = DeliveryQueue(max_changes=3, max_per_hour=2), 0.0, {}, {}
    kinds: dict[int, str] = {}
    dropped: list[AlertChange] = []
    lost: set[str] = set()  # alerts whose newest state was dropped

    def drop(changes: list[AlertChange]) -> None:
        dropped.extend(changes)
        lost.update(c.rule for c in changes)

    for op, alert, wait in ops:
        now += wait
        if op == "put":
            kinds[alert] = "resolved" if kinds.get(alert) == "fired" else "fired"
            change = FIRED._replace(rule=f"r{alert}", kind=kinds[alert],
                                    severity=("info", "warning", "critical")[alert % 3])
            newest[alert] = change
            lost.discard(change.rule)
            drop(queue.put(change))
        elif (taken := queue.take(now)) is not None:
            ok = op == "take_ok"
            drop(queue.done(taken, ok, now))
            if ok:
                held[taken.change.rule] = taken.change.kind
        critical = sum(1 for e in queue._pending.values() if e.rank == 2)
        assert len(queue) <= 3 + critical
    assert all(c.severity != "critical" for c in dropped)
    while (taken := queue.take(now)) is not None or len(queue):
        if taken is None:
            now += 3600.0  # the hourly budget frees
            continue
        queue.done(taken, True, now)
        held[taken.change.rule] = taken.change.kind
    for alert, change in newest.items():
        if change.rule not in lost:
            assert held.get(change.rule) == change.kind, (alert, change)
