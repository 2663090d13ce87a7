"""The agent on a real GPU (marked ``gpu``; skipped without CUDA). On the H200, from the repo root:

    PYTHONPATH=.:.whl python -m pytest -m gpu -s tests/gpu/test_agent_gpu.py

(``.whl`` holds sqlalchemy, alembic and mako from ``/work/shared/tools/gpu-wheels.sh``; torch,
transformers, nvidia-ml-py and pytest are on the machine.) ``-s`` shows the figures for
``docs/gpu-verification.md``: the NVML read cost, the memory-info version, and the rows of each
kind in the one database.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

from vramscope.agent.sources.nvml import open_nvml  # noqa: E402

from tools.agent_process import REPO_ROOT, AgentProcess  # noqa: E402

SERVER = textwrap.dedent("""
    import sys, time, torch
    import vramscope
    from vramscope.agent.config import parse_config
    from tools.bench.hooks import build_llama
    config = parse_config({"agent": {"socket_path": sys.argv[1]}}, None)
    report = vramscope.install(config)
    print(report, flush=True)
    model = build_llama(torch, layers=4, hidden=1024)
    ids = torch.randint(0, model.config.vocab_size, (4, 256), device="cuda")
    deadline = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < deadline:  # long enough for several 1 Hz NVML process reads
        with vramscope.phase("prefill"):
            model(ids)
        with vramscope.phase("decode"):
            model.generate(ids, max_new_tokens=8, do_sample=False)
        torch.cuda.synchronize()
    vramscope.uninstall()  # closes the socket client after a last drain
""")


def test_nvml_source_reads_the_real_devices():
    source = open_nvml()
    assert source is not None, "NVML should be available on the GPU machine"
    try:
        devices = source.devices()
        assert len(devices) == torch.cuda.device_count()
        for d in devices:
            assert d.uuid.startswith(("GPU-", "MIG-")) and d.name and d.total_bytes > 0
        samples = source.read()
        for s, d in zip(samples, devices, strict=True):
            assert s.source == "nvml" and s.device_total_bytes == d.total_bytes
            assert 0 < s.device_used_bytes <= s.device_total_bytes
        costs = []
        for _ in range(2000):
            t0 = time.perf_counter()
            source.read()
            costs.append(time.perf_counter() - t0)
        per_device_us = statistics.median(costs) / len(devices) * 1e6
        print(f"\nNVML: {devices[0].name}, memory info "
              f"{'v2' if source._memory_v2 is not None else 'v1'}, read() "
              f"{per_device_us:.1f} us per device (median of 2000)")
        assert per_device_us < 100  # NVML, not a process (nvidia-smi is ~20 ms)
    finally:
        source.close()


def test_agent_samples_nvml_next_to_a_hooked_transformers_process(short_dir):
    from vramscope.agent.store import Store

    agent = AgentProcess(f"sqlite:///{short_dir}/vramscope.db", f"{short_dir}/run/agent.sock",
                         nvml=True,
                         log_path=f"{short_dir}/agent.log").start()
    try:
        server = subprocess.run([sys.executable, "-c", SERVER, agent.socket_path, "6"],
                                cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                    [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])},
                                capture_output=True, text=True, timeout=300)
        assert server.returncode == 0, server.stderr[-3000:]
        status = agent.status()
    finally:
        agent.stop()
    with Store.open(agent.db_url) as st:
        nvml = st.samples(source="nvml")
        torch_rows = st.samples(source="torch")
        proc_rows = st.events(names=["nvml_process"])
        events = st.events()
        processes = st.processes()
    pids = {s.pid for s in torch_rows}
    print(f"\none database: {len(nvml)} nvml rows, {len(torch_rows)} torch rows (pids {pids}), "
          f"{len(proc_rows)} nvml_process events, {len(events)} events, processes "
          f"{[(p['pid'], p['name'], p['devices']) for p in processes]}; agent status: "
          f"rejected {status['rejected_total']}, dropped {status['dropped_total']}")
    print(server.stdout[-2000:])
    assert len(nvml) >= 30 and all(s.device_used_bytes > 0 for s in nvml)
    assert torch_rows and len(pids) == 1
    assert {s.phase.value for s in torch_rows} >= {"prefill", "decode"}
    assert max(s.allocated_bytes for s in torch_rows) > 0
    assert status["rejected_total"] == 0
    server_pid = pids.pop()
    if not proc_rows:  # NVML reports pids of another PID namespace (some containers)
        warnings.warn("no nvml_process events: NVML's pids did not match the client's pid",
                      stacklevel=1)
        return
    assert {s.pid for s in proc_rows} == {server_pid}  # NVML's rows mapped to the client
    assert all(e.data["used_bytes"] > 0 for e in proc_rows)
    assert [p["devices"] for p in processes if p["pid"] == server_pid] == ["0"]
