"""The built-in ``kv_saturation`` rule (issue 47, item 4) on scripted records through the live
alert engine: a KV pool at least 95 % used with requests waiting for 30 s, or a preemption,
fires with its numbers; a full pool with no queue, a queue under a roomy pool and a short
burst do not. The dashboard's ``/metrics`` reads the same figures from the stored events."""

from __future__ import annotations

from vramscope.agent.alerts.engine import AlertEngine
from vramscope.agent.records import Event, Phase, Sample

A, B = 100, 200  # pids


def kv(t: float, used: int, total: int, pid: int = A) -> Sample:
    return Sample(float(t), 0, Phase.DECODE, "kv", pid, kv_blocks_used=used,
                  kv_blocks_total=total)


def load(t: float, running: int, waiting: int, pid: int = A) -> Event:
    return Event(float(t), "server_load", 0, pid, data={"running": running, "waiting": waiting})


def preempted(t: float, count: int = 1, pid: int = A) -> Event:
    return Event(float(t), "kv_preempted", 0, pid, data={"count": count})


def saturation_changes(records: list) -> list[tuple[str, float, str]]:
    engine = AlertEngine.from_config(None)
    return [(c.kind, c.ts_s, c.message) for c in engine.feed(records)
            if c.rule == "kv_saturation"]


def test_a_full_pool_with_a_queue_fires_after_30_s_with_its_numbers():
    """62 of 63 blocks (98.4 %) from t=0 with 3 waiting, 4 running; the queue empties at 40 s:
    fired at 30 s (for 30 s), resolved at 100 s (a minute below)."""
    records = [load(0, 4, 3), load(40, 4, 0)] + [kv(t, 62, 63) for t in range(0, 111)]
    assert saturation_changes(records) == [
        ("fired", 30.0, "KV pool saturated: 98.4 % of 63 blocks used, 3 requests waiting "
                        "(4 running), 0 preemptions in the last 60 s"),
        ("resolved", 100.0, "KV pool saturated: not saturated"),
    ]


def test_a_preemption_fires_it_even_under_a_roomy_pool():
    """One preemption at 5 s, the pool half used: saturated until 65 s (the minute after it),
    fired at 35 s, resolved at 125 s."""
    records = [preempted(5)] + [kv(t, 50, 100) for t in range(0, 131)]
    assert saturation_changes(records) == [
        ("fired", 35.0, "KV pool saturated: 50.0 % of 100 blocks used, 1 preemption in the "
                        "last 60 s"),
        ("resolved", 125.0, "KV pool saturated: not saturated"),
    ]


def test_preemptions_of_two_servers_and_their_queues_add_up():
    """Two servers on one GPU: 2 and 3 waiting, 5 + 1 preemptions within the minute."""
    records = ([load(0, 8, 2, A), load(0, 1, 3, B), preempted(1, 5, A), preempted(2, 1, B)]
               + [kv(t, 99, 100, A) for t in range(0, 31)])
    assert saturation_changes(records) == [
        ("fired", 30.0, "KV pool saturated: 99.0 % of 100 blocks used, 5 requests waiting "
                        "(9 running), 6 preemptions in the last 60 s")]


def test_a_healthy_server_stays_quiet():
    """A full pool with nobody waiting (vLLM keeps its pool busy by design), a queue under a
    pool 90 % used, and a 20-second burst of a full pool with a queue: no alert."""
    full_no_queue = [load(0, 16, 0)] + [kv(t, 63, 63) for t in range(0, 200)]
    queue_roomy = [load(0, 16, 9)] + [kv(t, 90, 100) for t in range(0, 200)]
    burst = [load(0, 16, 4), load(20, 16, 0)] + [kv(t, 63, 63) for t in range(0, 200)]
    for records in (full_no_queue, queue_roomy, burst):
        assert saturation_changes(records) == []


def test_metrics_export_the_same_figures_from_the_stored_events(store):
    """The dashboard's /metrics, on the database the agent wrote: the rule's value, the
    queue and the preemptions of the last minute, read with the agent's own tracker; the
    exported rule (``vramscope_kv_saturated >= 1``) judges that value."""
    from prometheus_client.parser import text_string_to_metric_families
    from vramscope.agent.clock import FakeClock
    from vramscope.agent.config import parse_config
    from vramscope.dashboard.app import create_app

    now = 1_800_000_000.0
    store.write([kv(now - 10 + i, 62, 63) for i in range(10)],
                [load(now - 300, 4, 3), preempted(now - 90, 7),  # out of the last minute
                 preempted(now - 30, 2), preempted(now - 20, 1)])
    store.upsert_process(A, now - 1, name="vllm engine core (port 8000)")
    app = create_app(parse_config({}, None, {}), store, clock=FakeClock(now))
    text = app.test_client().get("/metrics").get_data(as_text=True)
    got = {f.name: [(s.labels, s.value) for s in f.samples]
           for f in text_string_to_metric_families(text)}
    device = {"host": store.host_name, "device": "0"}
    assert got["vramscope_kv_saturated"] == [(device, 1.0)]
    assert got["vramscope_requests_waiting"] == [(device, 3.0)]
    assert got["vramscope_requests_running"] == [(device, 4.0)]
    assert got["vramscope_kv_preemptions_recent"] == [(device, 3.0)]
