"""The issue's acceptance test: ``vramscope demo --duration 20 --no-browser`` exits 0 and leaves
a database with both phases from the allocator, KV and device sources, a leak alert from the
leak server and an OOM post-mortem from the fragmenting one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from vramscope.agent.records import Phase
from vramscope.agent.store import Store

REPO = Path(__file__).resolve().parents[2]
HEALTHY, LEAK, FRAGMENTATION = 0, 1, 2


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory):
    folder = tmp_path_factory.mktemp("demo")
    url = f"sqlite:///{folder}/demo.db"
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CONFIG_HOME": str(folder),
           "XDG_RUNTIME_DIR": str(folder), "XDG_DATA_HOME": str(folder)}
    proc = subprocess.run(
        [sys.executable, "-m", "vramscope", "demo", "--duration", "20", "--no-browser", "--db", url,
         "--port", "0"], cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = Store.open(url)
    yield store, proc.stdout
    store.close()


def test_prints_the_dashboard_url_and_a_summary(demo_db):
    _, out = demo_db
    assert "vramscope demo: dashboard at http://127.0.0.1:" in out
    assert "demo finished:" in out
    assert "device 2 (fragmentation)" in out


def test_samples_in_both_phases_from_allocator_kv_and_device_sources(demo_db):
    store, _ = demo_db
    for source in ("torch", "kv", "nvml"):
        phases = {s.phase for s in store.iter_samples(device=HEALTHY, source=source)}
        assert {Phase.PREFILL, Phase.DECODE} <= phases, (source, phases)


def test_allocator_samples_carry_real_counters(demo_db):
    store, _ = demo_db
    torch = store.samples(device=HEALTHY, source="torch")
    weights = 16_060_522_496  # the Llama-3-8B shape in bf16, allocated first
    assert min(s.allocated_bytes for s in torch) >= weights
    assert all(s.reserved_bytes >= s.allocated_bytes for s in torch)
    assert any(s.largest_free_block_bytes is not None for s in torch)


def test_leak_alert_from_the_leak_server_only(demo_db):
    store, _ = demo_db
    leaks = [a for a in store.alerts() if a["rule"] == "memory_leak"]
    assert {a["device"] for a in leaks} == {LEAK}


def test_fragmentation_server_wrote_an_oom_postmortem(demo_db):
    store, _ = demo_db
    pms = [pm for _, pm in store.postmortems(device=FRAGMENTATION)]
    assert pms, "no post-mortem from the fragmentation server"
    pm = pms[0]
    assert pm.cause == "fragmentation"
    free_in_reserved = pm.reserved_bytes - pm.allocated_bytes
    assert pm.largest_free_block_bytes < pm.failed_alloc_bytes < free_in_reserved
    assert pm.segments and pm.requests_in_flight
    assert store.postmortems(device=HEALTHY) == [] and store.postmortems(device=LEAK) == []


def test_bad_flags_are_usage_errors(capsys):
    from vramscope.agent.cli import main

    assert main(["demo", "--duration", "0"]) == 2
    assert "--duration must be > 0" in capsys.readouterr().err
    assert main(["demo", "--speed", "0.5"]) == 2


def test_gpu_flag_without_cuda_is_a_clear_error(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    from vramscope.agent.cli import main

    assert main(["demo", "--gpu", "--duration", "1", "--no-browser"]) == 1
    assert "--gpu needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_gpu_demo_records_real_allocator_samples(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    url = f"sqlite:///{tmp_path}/gpu.db"
    paths = [str(REPO), os.environ.get("PYTHONPATH", "")]  # keep the GPU machine's wheels
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    proc = subprocess.run([sys.executable, "-m", "vramscope", "demo", "--gpu", "--duration", "20",
                           "--no-browser", "--port", "0", "--db", url], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with Store.open(url) as store:
        torch_samples = store.samples(source="torch")
        assert torch_samples and max(s.allocated_bytes for s in torch_samples) > 0
        assert store.samples(source="nvml")


def test_demo_keeps_the_dashboards_bind_rule(tmp_path, capsys):
    from vramscope.agent.cli import main

    url = f"sqlite:///{tmp_path}/bind.db"
    assert main(["demo", "--host", "0.0.0.0", "--duration", "1", "--no-browser", "--db", url]) == 1
    assert "refusing to listen on '0.0.0.0' without a token" in capsys.readouterr().err
