"""Two hook clients in processes of their own, one in a PID namespace of its own (``unshare
--pid --fork --mount-proc``, as a container runtime makes one), and a real agent with a fake
8-GPU node: every record lands on the right device (by UUID) and the right process (by the
kernel's pid, not the one the client calls itself), and /metrics, /api/v1 and the dashboard's
overview figure agree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from vramscope.agent.config import parse_config
from vramscope.agent.daemon import Agent
from vramscope.agent.ingest.peer import ns_pids
from vramscope.agent.sources.nvml import FakeNvmlSource, fake_uuid
from vramscope.dashboard.app import create_app

from tests.support.waiting import wait_for

GiB = 2**30
ROOT = Path(__file__).resolve().parents[2]
needs_unshare = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a PID namespace needs root and util-linux's unshare")


def _client(socket_path: str, name: str, physical: str, reserved_gib: float,
            namespace: bool) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tests.support.hook_client", socket_path, name, physical,
           str(reserved_gib)]
    if namespace:
        cmd = ["unshare", "--pid", "--fork", "--mount-proc", *cmd]
    return subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _host_pid_of_namespaced(unshare: subprocess.Popen) -> int:
    """unshare forks the client, which is pid 1 in the new namespace: its host pid."""
    def child():
        path = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children")
        kids = path.read_text().split() if path.exists() else []
        return int(kids[0]) if kids else None
    return wait_for(child, 10)


@needs_unshare
def test_clients_across_pid_namespaces_land_on_their_device_and_host_pid(store, tmp_path):
    source = FakeNvmlSource(8, 80 * GiB, used_fn=lambda d, t: 40 * GiB if d == 3 else GiB)
    config = parse_config({"sampling": {"device_interval_s": 0.1, "process_interval_s": 0.1}},
                          None)
    sock = str(tmp_path / "run" / "agent.sock")
    agent = Agent(config, store=store, source=source, socket_path=sock, alerts=False)
    agent.start()
    try:
        a = _client(sock, "server-a", "3,5", 20, namespace=False)  # CUDA_VISIBLE_DEVICES=3,5
        b = _client(sock, "server-b", "3", 12, namespace=True)  # in a container, on GPU 3
        b_host = _host_pid_of_namespaced(b)
        assert ns_pids(b_host)[-1] == 1  # the kernel's view: host pid ..., pid 1 inside
        source.processes = {3: [(a.pid, 21 * GiB), (b_host, 13 * GiB)], 5: [(a.pid, 21 * GiB)]}
        wait_for(lambda: {a.pid, b_host} <= {e.pid for e in store.events(
            names=["nvml_process"])}, 20)  # both connected while NVML lists them
        out_a, err_a = a.communicate(input="", timeout=60)
        out_b, err_b = b.communicate(input="", timeout=60)
        assert a.returncode == 0 and b.returncode == 0, err_a + err_b
        assert out_b.split()[0] == "1"  # what client B calls itself
        agent.writer.flush()
    finally:
        agent.stop()

    torch_rows = sorted((s.device, s.device_uuid, s.pid, s.reserved_bytes)
                        for s in store.samples(source="torch"))
    assert torch_rows == sorted([(3, fake_uuid(3), a.pid, 20 * GiB),
                                 (5, fake_uuid(5), a.pid, 20 * GiB),
                                 (3, fake_uuid(3), b_host, 12 * GiB)])
    assert sorted((e.device, e.pid) for e in store.events(names=["phase"])) == sorted(
        [(3, a.pid), (5, a.pid), (3, b_host)])
    procs = {p["pid"]: p for p in store.processes()}
    assert (procs[b_host]["name"], procs[b_host]["ns_pid"]) == ("server-b", 1)
    assert (procs[a.pid]["name"], procs[a.pid]["ns_pid"]) == ("server-a", None)
    assert 1 not in procs  # the namespace's pid 1 is no process of this host
    assert {e.pid for e in store.events(names=["nvml_process"])} == {a.pid, b_host}
    assert store.unjoined_total == 0
    _views_agree(store, a.pid, b_host)


def _views_agree(store, a_pid: int, b_pid: int) -> None:
    client = create_app(parse_config({}, None, {}), store).test_client()
    metrics = {f.name: f.samples for f in text_string_to_metric_families(
        client.get("/metrics").get_data(as_text=True))}
    reserved = {(s.labels["device"], s.labels["process"]): s.value
                for s in metrics["vramscope_process_reserved_bytes"]}
    assert reserved == {("3", "server-a"): 20 * GiB, ("3", "server-b"): 12 * GiB,
                        ("5", "server-a"): 20 * GiB}
    unexplained = {s.labels["device"]: s.value for s in metrics["vramscope_unexplained_bytes"]}
    assert unexplained["3"] == 40 * GiB - 32 * GiB
    devices = {d["device"]: d for d in client.get("/api/v1/devices").get_json()["devices"]}
    assert devices[3]["uuid"] == fake_uuid(3)
    assert sorted((p["pid"], p["reserved_bytes"]) for p in devices[3]["latest"]["processes"]) \
        == sorted([(a_pid, 20 * GiB), (b_pid, 12 * GiB)])
    assert devices[0]["latest"]["processes"] == []  # nothing of theirs on physical GPU 0
    fig = client.get("/api/v1/figures/processes").get_json()
    row = fig["data"][0]["y"].index(next(y for y in fig["data"][0]["y"] if y.endswith("GPU 3")))
    stacked = {t["name"]: t["x"][row] for t in fig["data"] if t["type"] == "bar"}
    assert stacked == {"server-a": 20.0, "server-b": 12.0, "unexplained": 8.0}
    assert client.get("/").status_code == 200
