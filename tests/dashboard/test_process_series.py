"""Several server processes on one GPU stay apart (docs/architecture.md rule 6): on a fake 8-GPU
node, two processes on GPU 0 show two series, the device total is their reserved bytes plus the
unexplained band, and a process's per-process cap is the limit of its own risk model.
Real SQLite store, the real dashboard app, Prometheus' own parser."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from vramscope.agent.analysis.merge import by_series, is_device_wide
from vramscope.agent.analysis.risk import device_points, risk_timeline
from vramscope.agent.clock import FakeClock
from vramscope.agent.config import parse_config
from vramscope.agent.daemon import Agent
from vramscope.agent.records import Phase, Sample
from vramscope.agent.sources.nvml import FakeNvmlSource, fake_uuid
from vramscope.dashboard.app import create_app
from vramscope.dashboard.latest import latest_values

GiB = 2**30
T0 = 1_700_000_000.0
A, B = 100, 200  # pids: A capped at 40 GiB (set_per_process_memory_fraction(0.5)), B not


def _proc(t: float, pid: int, allocated: int, reserved: int, limit: int) -> Sample:
    return Sample(t, 0, Phase.DECODE, "torch", pid, allocated_bytes=allocated,
                  reserved_bytes=reserved, device_total_bytes=limit,
                  device_uuid=fake_uuid(0))


def records() -> list[Sample]:
    out = []
    for i in range(10):
        t = T0 + i
        out += [_proc(t, A, 28 * GiB, 30 * GiB, 40 * GiB), _proc(t, B, GiB, 2 * GiB, 80 * GiB)]
    return out


@pytest.fixture
def node(store):
    return _node(store, {A: {"name": "vllm", "rank": 0}, B: {"name": "embedder"}})


@pytest.fixture
def twins(store):
    """Two servers of one name on GPU 0 (two ``vllm serve`` on one device, no rank)."""
    return _node(store, {A: {"name": "vllm-serve"}, B: {"name": "vllm-serve"}})


def _node(store, names: dict[int, dict]):
    clock = FakeClock(T0 + 9)
    source = FakeNvmlSource(8, 80 * GiB, clock=clock,
                            used_fn=lambda d, t: 35 * GiB if d == 0 else GiB)
    agent = Agent(parse_config({}, None), store=store, source=source, listen=False,
                  clock=clock, alerts=False)
    agent.writer.submit(agent._describe_devices(source.devices()))
    agent.writer.put_many(records())
    agent.sample_devices()
    agent.writer.flush()
    for pid, row in names.items():
        store.upsert_process(pid, T0 + 9, **row)
    app = create_app(parse_config({}, None, {}), store, clock=clock)
    return app.test_client()


def test_two_processes_are_two_series_and_the_device_adds_up(node, store):
    latest = latest_values(store, 0, None, {p["pid"]: p for p in store.processes()})
    by_pid = {p["pid"]: p for p in latest["processes"]}
    assert {pid: (p["process"], p["reserved_bytes"], p["limit_bytes"])
            for pid, p in by_pid.items()} == {A: ("vllm/rank0", 30 * GiB, 40 * GiB),
                                              B: ("embedder", 2 * GiB, 80 * GiB)}
    assert latest["reserved_bytes"] == 32 * GiB and latest["allocated_bytes"] == 29 * GiB
    assert latest["device_used_bytes"] == 35 * GiB and latest["device_total_bytes"] == 80 * GiB
    assert latest["unexplained_bytes"] == 3 * GiB
    assert latest["device_used_bytes"] == latest["reserved_bytes"] + latest["unexplained_bytes"]


def _scrape(client) -> dict[str, list]:
    text = client.get("/metrics").get_data(as_text=True)
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _one(samples, **labels) -> float:
    found = [s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (labels, samples)
    return found[0]


def test_metrics_api_and_pages_agree(node):
    got = _scrape(node)
    host = node.application.extensions["vramscope"].store.host_name
    d0 = {"host": host, "device": "0"}
    assert _one(got["vramscope_allocated_bytes"], **d0) == 29 * GiB  # not the newest process's
    assert _one(got["vramscope_device_limit_bytes"], **d0) == 80 * GiB
    assert _one(got["vramscope_unexplained_bytes"], **d0) == 3 * GiB
    assert _one(got["vramscope_process_limit_bytes"], **d0, process="vllm/rank0") == 40 * GiB
    assert _one(got["vramscope_process_reserved_bytes"], **d0, process="embedder") == 2 * GiB
    api = node.get("/api/v1/devices").get_json()["devices"]
    [row] = [r for r in api if r["device"] == 0]
    assert row["uuid"] == fake_uuid(0) and row["latest"]["unexplained_bytes"] == 3 * GiB
    assert sorted(p["reserved_bytes"] for p in row["latest"]["processes"]) == [2 * GiB, 30 * GiB]
    fig = node.get("/api/v1/figures/processes").get_json()  # what the overview page plots
    gpu0 = fig["data"][0]["y"].index(f"{host} · GPU 0")
    assert {t["name"]: t["x"][gpu0] for t in fig["data"]} == {
        "vllm/rank0": 30.0, "embedder": 2.0, "unexplained": 3.0, "device used (NVML)": 35.0,
        "device total": 80.0}
    assert node.get("/").status_code == 200


def test_two_servers_of_one_name_are_two_series_by_pid(twins):
    """The pid keeps them apart: each its own reserved bytes and cap, not one summed series
    with the larger cap (issue 47: two servers of one name collided)."""
    got = _scrape(twins)
    host = twins.application.extensions["vramscope"].store.host_name
    same = {"host": host, "device": "0", "process": "vllm-serve"}
    reserved = got["vramscope_process_reserved_bytes"]
    assert _one(reserved, **same, pid=str(A)) == 30 * GiB
    assert _one(reserved, **same, pid=str(B)) == 2 * GiB
    assert _one(got["vramscope_process_limit_bytes"], **same, pid=str(A)) == 40 * GiB
    assert _one(got["vramscope_process_limit_bytes"], **same, pid=str(B)) == 80 * GiB
    assert _one(got["vramscope_process_allocated_bytes"], **same, pid=str(B)) == GiB
    assert len(reserved) == 2  # no third, summed series
    # the device series still add both up
    assert _one(got["vramscope_reserved_bytes"], host=host, device="0") == 32 * GiB


def test_promtool_passes_two_servers_of_one_name(twins):
    import subprocess

    from tests.support.tools import require_tool

    promtool = require_tool("promtool")
    text = twins.get("/metrics").get_data(as_text=True)
    host = twins.application.extensions["vramscope"].store.host_name
    for name in ("allocated", "reserved", "limit"):  # the families these samples fill
        for pid in (A, B):
            assert (f'vramscope_process_{name}_bytes{{device="0",host="{host}",pid="{pid}",'
                    'process="vllm-serve"}') in text
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and (out.stdout + out.stderr).strip() == "", out.stdout + out.stderr


def test_a_per_process_cap_is_the_limit_of_that_process_risk_model():
    nvml = [Sample(T0 + i, 0, Phase.UNKNOWN, "nvml", device_used_bytes=35 * GiB,
                   device_total_bytes=80 * GiB) for i in range(10)]
    points = risk_timeline(sorted(records() + nvml, key=lambda s: s.ts_s))
    last = {p.pid: p for p in points}
    # A: 40 GiB cap, 28 GiB allocated, nothing else counts under a cap -> 12 GiB of headroom
    assert last[A].headroom_bytes == 12 * GiB
    # B: the device's 80 GiB, its 1 GiB plus what it does not own (35 - 2 GiB) -> 46 GiB
    assert last[B].headroom_bytes == 46 * GiB
    assert {p.pid for p in device_points(points, 0)} == {A}  # the chart follows the tighter


def test_by_series_gives_each_process_the_device_wide_samples():
    nv1 = Sample(1.0, 0, source="nvml", device_used_bytes=5)
    a1 = Sample(2.0, 0, source="torch", pid=A, allocated_bytes=1)
    b1 = Sample(3.0, 0, source="torch", pid=B, allocated_bytes=2)
    nv2 = Sample(4.0, 0, source="nvml", device_used_bytes=6)
    other = Sample(4.0, 1, source="nvml", device_used_bytes=7)
    assert is_device_wide(nv1) and not is_device_wide(a1)
    series = by_series([nv1, a1, b1, nv2, other])
    assert series == {(0, None): [nv1], (0, A): [nv1, a1, nv2], (0, B): [nv1, b1, nv2],
                      (1, None): [other]}


def test_the_live_alert_engine_judges_each_process_by_its_own_cap_and_names_its_rank():
    """A at 39.5 of its 40 GiB cap is critical although the GPU has 38 GiB free; B at 1 GiB
    would hide it from a per-device model whose limit flipped to B's 80 GiB."""
    from vramscope.agent.alerts.engine import AlertEngine
    from vramscope.agent.alerts.rules import Rule
    from vramscope.agent.records import RANK_EVENT, Event

    rule = Rule("oom_risk", "risk_level", ">=", 2, severity="critical", message="OOM risk")
    engine = AlertEngine([rule])
    recs: list = [Event(T0 - 1, RANK_EVENT, 0, A, data={"rank": 3, "world_size": 4})]
    for i in range(5):
        t = T0 + i
        recs += [Sample(t, 0, Phase.UNKNOWN, "nvml", device_used_bytes=42 * GiB,
                        device_total_bytes=80 * GiB),
                 _proc(t, A, 39 * GiB + GiB // 2, 39 * GiB + 3 * GiB // 4, 40 * GiB),
                 _proc(t, B, GiB, 2 * GiB, 80 * GiB)]
    fired = [c for c in engine.feed(recs) if c.kind == "fired"]
    assert [(c.rule, c.device) for c in fired] == [("oom_risk", 0)]
    assert "[rank 3 (pid 100)]" in fired[0].message
    d = engine.devices[0]
    assert d.risk_pid == A and d.risk.limit_bytes == 40 * GiB
    assert d.risks[B].limit_bytes == 80 * GiB and d.risks[B].level_index == 0


def test_a_leak_in_one_of_two_processes_is_found_in_that_process():
    """B's idle floor rises 10 kB/s; A's stays flat below it. One detector fed both would see
    A's flat floor (the minimum) and nothing else."""
    from vramscope.agent.alerts.engine import AlertEngine

    engine = AlertEngine([])
    recs = []
    for t in range(2200):
        recs += [Sample(float(t), 0, Phase.IDLE, "torch", A, allocated_bytes=GiB,
                        device_total_bytes=8_000_000_000),
                 Sample(float(t), 0, Phase.IDLE, "torch", B,
                        allocated_bytes=2 * GiB + 10_000 * t, device_total_bytes=8_000_000_000)]
    engine.feed(recs)
    d = engine.devices[0]
    assert d.leaks[B].result.detected and not d.leaks[A].result.detected
    assert d.leak is d.leaks[B]
    assert d.leak.result.slope_bytes_per_s == pytest.approx(10_000)


def test_two_kv_pools_on_one_gpu_are_tracked_apart():
    from vramscope.agent.alerts.engine import AlertEngine

    engine = AlertEngine([])
    recs = []
    for t in range(3):
        recs += [Sample(float(t), 0, Phase.DECODE, "kv", A, kv_blocks_used=900,
                        kv_blocks_total=1000),
                 Sample(float(t), 0, Phase.DECODE, "kv", B, kv_blocks_used=10,
                        kv_blocks_total=4000)]
    engine.feed(recs)
    d = engine.devices[0]
    assert {pid: k.usage_ratio for pid, k in d.kvs.items()} == {A: 0.9, B: 0.0025}
    assert d.kv is d.kvs[A]  # the fullest pool is the one kv_usage_ratio rules read
