"""``/metrics`` parsed by Prometheus' own parser, with exact values from the seeded database."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from vramscope.agent.config import parse_config
from vramscope.agent.store import Store
from vramscope.dashboard.app import create_app
from vramscope.dashboard.metrics import (
    DEVICE_COUNTERS,
    DEVICE_GAUGES,
    PROCESS_COUNTERS,
    PROCESS_GAUGES,
    VERDICT_GAUGES,
)

from tests.support import dashboard_fixtures as F

seeded, dash_app, client = F.seeded, F.dash_app, F.client  # shared fixtures

ALLOWED_LABELS = {"host", "device", "process", "phase", "source"}
INFO_LABELS = {"host", "device", "uuid", "name", "index", "parent_uuid"}  # device_info only
LAST_T = F.T0 + (F.STEPS - 1) * F.STEP_S
PROCESS_SERIES = ({n for n, _, _ in PROCESS_GAUGES} | {n for n, _, _ in PROCESS_COUNTERS}
                  | {n for n, _ in VERDICT_GAUGES})


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
        allowed = INFO_LABELS if name == "vramscope_device_info" else ALLOWED_LABELS
        if name in PROCESS_SERIES:  # one series a running process: its pid too
            allowed = allowed | {"pid"}
        for s in samples:
            assert set(s.labels) <= allowed, (name, s.labels)


def test_device_values_are_the_newest_readings(client):
    got = scrape(client)
    d0 = {"host": F.HOST, "device": "0"}
    torch_last, nvml_last = F.torch_sample(LAST_T, 0), F.nvml_sample(LAST_T, 0)
    assert value(got["vramscope_allocated_bytes"], **d0) == torch_last.allocated_bytes
    assert value(got["vramscope_device_limit_bytes"], **d0) == F.LIMIT_BYTES
    assert value(got["vramscope_device_used_bytes"], **d0) == nvml_last.device_used_bytes
    assert value(got["vramscope_kv_blocks_capacity"], **d0) == F.KV_BLOCKS_TOTAL
    assert "vramscope_kv_blocks_total" not in got  # renamed: a gauge may not end in _total
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


def test_each_process_is_a_series_under_its_device(client):
    got = scrape(client)
    p0 = {"host": F.HOST, "device": "0", "process": F.XSS_NAME}
    torch_last, nvml_last = F.torch_sample(LAST_T, 0), F.nvml_sample(LAST_T, 0)
    assert value(got["vramscope_process_reserved_bytes"], **p0) == torch_last.reserved_bytes
    assert value(got["vramscope_process_kv_blocks_capacity"], **p0) == F.KV_BLOCKS_TOTAL
    assert value(got["vramscope_process_reserved_bytes"], host=F.HOST, device="1",
                 process="vllm-serve") == 22 * F.GIB
    assert value(got["vramscope_unexplained_bytes"], host=F.HOST, device="0") == (
        nvml_last.device_used_bytes - torch_last.reserved_bytes)


def test_device_info_names_uuid_name_and_index(client):
    info = scrape(client)["vramscope_device_info"]
    assert sorted((s.labels["device"], s.labels["uuid"], s.labels["index"], s.value)
                  for s in info) == [("0", "GPU-0000", "0", 1.0), ("1", "GPU-0001", "1", 1.0)]
    assert {s.labels["name"] for s in info} == {"NVIDIA H100 80GB HBM3"}


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


def test_promtool_checks_the_exposition_clean(client):
    """Prometheus' own parser and linter (Debian's promtool), when installed: no parse error
    (exit 1) and no lint note (exit 3), with no exception list."""
    import subprocess

    from tests.support.tools import require_tool

    promtool = require_tool("promtool")
    text = client.get("/metrics").get_data(as_text=True)
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (out.stdout + out.stderr).strip() == ""


def _same_rows(store, config, now_s):
    """``current_rows`` (every device at once, for /metrics) against ``device_rows`` (each
    device by its own reads): the same rows, keys and order."""
    from vramscope.dashboard.queries import current_rows, device_rows

    fleet = current_rows(store, now_s)
    each = device_rows(store, config, now_s)
    assert fleet == [{k: r[k] for k in fleet[0]} for r in each]
    return fleet


def test_the_fleet_read_gives_each_device_what_its_own_reads_give(seeded):
    rows = _same_rows(seeded.store, seeded.config(), seeded.clock.time_s())
    assert [(r["device"], r["risk"], r["active_alerts"], len(r["latest"]["processes"]))
            for r in rows] == [(0, "warning", 1, 1), (1, "ok", 0, 1)]
    assert rows[0]["latest"]["allocated_bytes"] == F.torch_sample(LAST_T, 0).allocated_bytes


def test_the_fleet_read_leaves_out_samples_ahead_of_now(tmp_path):
    """A row from a wrong clock, ahead of now, is not the device's newest on either read;
    a device with no sample has no current values."""
    from vramscope.agent.records import Phase, Sample

    store = Store.open(f"sqlite:///{tmp_path / 'clock.db'}", host_name="h")
    store.write([Sample(100.0, 0, Phase.IDLE, "torch", 7, allocated_bytes=1),
                 Sample(125.0, 0, Phase.DECODE, "torch", 7, allocated_bytes=2),
                 Sample(900.0, 0, Phase.PREFILL, "torch", 7, allocated_bytes=3)], [])
    store.describe_device(1, uuid="GPU-1", name="spare", total_bytes=8)
    rows = _same_rows(store, parse_config({}, None, {}), 130.0)
    assert [(r["device"], r["latest"] and (r["latest"]["last_ts_s"], r["latest"]["phase"],
                                           r["latest"]["allocated_bytes"])) for r in rows] == [
        (0, (125.0, "decode", 2)), (1, None)]
    store.close()
