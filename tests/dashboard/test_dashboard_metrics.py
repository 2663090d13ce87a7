"""``/metrics`` parsed by Prometheus' own parser, with exact values from the seeded database."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from vramscope.agent.store import Store
from vramscope.dashboard.app import create_app
from vramscope.dashboard.metrics import DEVICE_COUNTERS, DEVICE_GAUGES

from tests.support import dashboard_fixtures as F

seeded, dash_app, client = F.seeded, F.dash_app, F.client  # shared fixtures

ALLOWED_LABELS = {"host", "device", "process", "phase", "source"}
LAST_T = F.T0 + (F.STEPS - 1) * F.STEP_S


def scrape(client) -> dict[str, list]:
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.mimetype == "text/plain"
    families = text_string_to_metric_families(r.get_data(as_text=True))
    return {f.name: f.samples for f in families}


def value(samples, **labels) -> float:
    found = [s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (labels, samples)
    return found[0]


def test_every_documented_metric_is_exposed_with_bounded_labels(client):
    got = scrape(client)
    names = {n for n, _, _ in DEVICE_GAUGES} | {n for n, _, _ in DEVICE_COUNTERS}
    assert names <= set(got)
    for name, samples in got.items():
        for s in samples:
            assert set(s.labels) <= ALLOWED_LABELS, (name, s.labels)


def test_device_values_are_the_newest_readings(client):
    got = scrape(client)
    d0 = {"host": F.HOST, "device": "0"}
    torch_last, nvml_last = F.torch_sample(LAST_T, 0), F.nvml_sample(LAST_T, 0)
    assert value(got["vramscope_allocated_bytes"], **d0) == torch_last.allocated_bytes
    assert value(got["vramscope_device_limit_bytes"], **d0) == F.LIMIT_BYTES
    assert value(got["vramscope_device_used_bytes"], **d0) == nvml_last.device_used_bytes
    assert value(got["vramscope_kv_blocks_total"], **d0) == F.KV_BLOCKS_TOTAL
    assert value(got["vramscope_alloc_retries"], **d0) == 2  # counter family; sample *_total
    assert value(got["vramscope_ooms"], **d0) == 1
    assert value(got["vramscope_alerts_active"], **d0) == 1
    assert value(got["vramscope_risk_level"], **d0) == 1
    assert value(got["vramscope_risk_level"], host=F.HOST, device="1") == 0
    assert value(got["vramscope_phase"], **d0, phase="idle") == 1
    assert value(got["vramscope_phase"], **d0, phase="decode") == 0
    assert value(got["vramscope_last_sample_age_seconds"], **d0, source="nvml") == F.NOW_S - LAST_T
    assert value(got["vramscope_agent_dropped_records"], host=F.HOST) == 7
    assert value(got["vramscope_up"]) == 1


def test_process_names_are_labels_not_pids(client):
    got = scrape(client)
    seen = got["vramscope_process_last_seen_timestamp_seconds"]
    assert sorted(s.labels["process"] for s in seen) == sorted([F.XSS_NAME, "vllm-serve"])
    assert value(seen, process="vllm-serve") == F.T0 + F.DURATION_S


def test_counters_end_in_total(client):
    text = client.get("/metrics").get_data(as_text=True)
    assert 'vramscope_alloc_retries_total{device="0",host="gpu-node-1"} 2.0' in text


def test_a_broken_database_gives_up_0_not_a_500(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 'x.db'}", host_name="h")
    app = create_app(None, store)
    with store.engine.begin() as c:
        c.exec_driver_sql("DROP TABLE devices")
    got = scrape(app.test_client())
    assert value(got["vramscope_up"]) == 0
    assert "vramscope_allocated_bytes" not in got


def test_two_apps_have_separate_registries(seeded, tmp_path):
    empty = create_app(None, Store.open(f"sqlite:///{tmp_path / 'e.db'}", host_name="h"))
    full = create_app(None, seeded.store, clock=seeded.clock)
    assert scrape(empty.test_client())["vramscope_allocated_bytes"] == []
    assert len(scrape(full.test_client())["vramscope_allocated_bytes"]) == 2


def test_promtool_parses_the_exposition_and_lints_only_the_known_name(client):
    """Prometheus' own parser and linter (Debian's promtool), when installed.

    Exit 1 is a parse error; exit 3 means lint notes. The one accepted note is the ``_total``
    suffix of the gauge ``vramscope_kv_blocks_total`` (the KV pool's size), a name the
    Prometheus rules and the Grafana board already query.
    """
    import shutil
    import subprocess

    import pytest

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    text = client.get("/metrics").get_data(as_text=True)
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode in (0, 3), out.stdout + out.stderr
    notes = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert all(n.startswith("vramscope_kv_blocks_total non-counter") for n in notes), notes
