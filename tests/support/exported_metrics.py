"""The Prometheus series vramscope really exports: scraped from a real dashboard app over a
scripted store, and from a real agent's own ``/metrics`` server (``agent.metrics_port``).

Shared by the tests of the Prometheus rules and the Grafana dashboard: whatever they query must
be a series that a ``/metrics`` serves, not a name someone remembered.
"""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from vramscope.agent.clock import FakeClock
from vramscope.agent.config import parse_config
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS, Event, Phase, Sample

NOW_S = 1_700_000_100.0


def scripted_store(store) -> None:
    """One device with every counter set, a process, and the agent's own stats."""
    values = {name: 1000 + i for i, name in enumerate(SAMPLE_COUNTER_FIELDS)}
    values.update(device_total_bytes=80_000_000_000, device_used_bytes=40_000_000_000)
    store.write([Sample(NOW_S - 5, 0, Phase.DECODE, "torch", 42, **values)],
                [Event(NOW_S - 6, "request_start", 0, 42, Phase.PREFILL, "r1"),
                 Event(NOW_S - 6, "server_load", 0, 42, data={"running": 1, "waiting": 2}),
                 Event(NOW_S - 6, "kv_preempted", 0, 42, data={"count": 1})])
    store.upsert_process(42, NOW_S - 5, name="python", device_indexes=[0])
    store.write_agent_stats(NOW_S - 1, clients=1, rows_per_s=10.0, queue_depth=3,
                            dropped_total=0, rejected_total=0, db_size_bytes=4096)
    # the alert engine's stored verdict of the process: a leak (every verdict gauge has a value)
    from vramscope.agent.alerts.verdicts import Verdict
    from vramscope.agent.analysis.kv_leak import KvLeak
    from vramscope.agent.store import verdicts

    # ...with orphaned KV blocks beside the floor's leak: 40 of them, 2 more a second
    pool = KvLeak(40, 20, NOW_S - 25, NOW_S - 5, 1024, 2.0, 1.9, 2.1, 500, 250.0, 238.0, 263.0,
                  ())
    verdicts.write(store, [Verdict(NOW_S - 5, 0, None, 42, "leak", 1000.0, NOW_S - 3600,
                                   NOW_S - 600, 3600.0, "scripted", "ok", None, (), 10**9,
                                   None, None, None, None, None, leak_kv=pool)])
    # the engine's device answer with its [server] check, made as the agent makes it (the
    # dashboard exports the agent's check, never one of its own config)
    import json
    import tempfile
    from pathlib import Path

    from vramscope.agent.alerts.config_check import check_json, server_from_config
    from vramscope.agent.alerts.verdicts import DeviceVerdict

    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "config.json"
        model.write_text(json.dumps(SERVER_MODEL))
        limits = server_from_config(parse_config(
            {"server": {"model": str(model), "max_num_seqs": 4}}, None, {}))
    assert limits is not None
    verdicts.write(store, [DeviceVerdict(NOW_S - 5, 0, None, "ok", 42, 42,
                                         check_json(limits, values["device_total_bytes"]))])


# A [server] section's model (Llama-3-8B's shape), so the dashboard exports config_oom's value.
SERVER_MODEL = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
                "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                "vocab_size": 128256, "torch_dtype": "bfloat16",
                "max_position_embeddings": 8192}


def dashboard_metrics_text(store) -> str:
    import json
    import tempfile
    from pathlib import Path

    from vramscope.dashboard.app import create_app

    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "config.json"
        model.write_text(json.dumps(SERVER_MODEL))
        config = parse_config({"server": {"model": str(model), "max_num_seqs": 4}}, None, {})
        app = create_app(config, store, clock=FakeClock(NOW_S))
        response = app.test_client().get("/metrics")
    assert response.status_code == 200, response.data[:500]
    return response.get_data(as_text=True)


def agent_metrics_text(store) -> str:
    from vramscope.agent.daemon import Agent, start_metrics

    from tests.support.pgserver import free_port

    agent = Agent(parse_config({}, None, {}), store=store, source=None, listen=False,
                  alerts=False)
    port = free_port()
    server = start_metrics(agent, port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            return resp.read().decode()
    finally:
        server.shutdown()
        server.server_close()


def series_in(text: str) -> dict[str, str]:
    """Every sample name in an exposition, with its family's type (``counter`` gives
    ``..._total`` samples)."""
    out: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = family.type
    return out


def exported_series(store) -> dict[str, str]:
    """Every series of the dashboard's and the agent's ``/metrics``, with its type."""
    scripted_store(store)
    return {**series_in(agent_metrics_text(store)), **series_in(dashboard_metrics_text(store))}
