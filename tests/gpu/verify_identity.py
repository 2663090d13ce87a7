"""GPU verification of device identity and per-process series (issue 17), on the GPU machine.

    python3 tests/gpu/verify_identity.py --out $OUT/identity.json

One agent (in this process, real NVML, SQLite in a temporary directory, its socket there too)
and two inference-server processes with the hooks installed (``install()``, the socket client):
``server-visible`` started with ``CUDA_VISIBLE_DEVICES=0``, ``server-all`` without it. Each
server puts a different amount of memory in torch's caching allocator, reports its own
``torch.cuda.memory_reserved()`` and the UUID torch gives its ``cuda:0``, then holds still.
With both holding, the script reads NVML's used bytes and the store at the same moment and
checks that:

- each server's samples landed on the device whose UUID NVML reports for GPU 0 (the H200),
- each process's stored reserved bytes equal its own ``torch.cuda.memory_reserved()``,
- the device total the store shows equals NVML's used bytes read at the same moment, and it is
  the processes' reserved bytes plus the unexplained band (CUDA contexts, ...),
- ``/metrics`` and ``/api/v1/devices`` say the same.

Writes every figure and check to ``--out`` (JSON) and exits 1 if a check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

GiB = 2**30
SERVERS = (("server-visible", {"CUDA_VISIBLE_DEVICES": "0"}, 3), ("server-all", {}, 5))


# --- the server processes ------------------------------------------------------------------
def serve(name: str, socket_path: str, gib: int, state_dir: str) -> int:
    """One inference server stand-in: hooks on, ``gib`` GiB held, its own figures written."""
    import torch
    from vramscope.agent.config import parse_config
    from vramscope.agent.records import format_uuid
    from vramscope.hooks.client import make_default_sink
    from vramscope.hooks.install import install

    config = parse_config({"agent": {"socket_path": socket_path},
                           "sampling": {"allocator_interval_s": 0.1, "snapshot_interval_s": 0},
                           "hooks": {"history": "off"}}, None, {})
    # install()'s own socket client, named per server (both would be "python3 <script>")
    report = install(config, sink=make_default_sink(config, process=name))
    held = [torch.empty(GiB // 4, dtype=torch.uint8, device="cuda:0") for _ in range(4 * gib)]
    torch.cuda.synchronize()
    props = torch.cuda.get_device_properties(0)
    mine = {"name": name, "pid": os.getpid(), "torch_uuid": format_uuid(props.uuid),
            "torch_uuid_raw": repr(props.uuid),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "reserved_bytes": torch.cuda.memory_reserved(0),
            "allocated_bytes": torch.cuda.memory_allocated(0), "held_tensors": len(held),
            "install": report.to_json()}
    state = Path(state_dir)
    (state / f"{name}.json").write_text(json.dumps(mine))
    while not (state / "stop").exists():
        time.sleep(0.05)
    mine["reserved_bytes_at_stop"] = torch.cuda.memory_reserved(0)
    (state / f"{name}.json").write_text(json.dumps(mine))
    return 0


# --- the orchestrator ----------------------------------------------------------------------
def nvml_gpu0() -> dict[str, Any]:
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    uuid = pynvml.nvmlDeviceGetUUID(h)
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    return {"uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
            "used_bytes": int(mem.total) - int(mem.free), "total_bytes": int(mem.total),
            "device_count": pynvml.nvmlDeviceGetCount()}


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"{what}: not within {timeout_s} s")


def start_servers(socket_path: str, state: Path) -> list[subprocess.Popen]:
    procs = []
    for name, env_extra, gib in SERVERS:
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        env.update(env_extra)
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--serve", name, "--socket", socket_path,
             "--gib", str(gib), "--state", str(state)], env=env))
    return procs


def check(results: dict[str, Any], name: str, ok: bool, detail: Any) -> None:
    results["checks"].append({"check": name, "ok": bool(ok), "detail": detail})


def measure(agent: Any, store: Any, servers: dict[str, dict], results: dict[str, Any]) -> None:
    """Both servers hold still: NVML now, the newest stored rows right after."""
    from vramscope.agent.config import parse_config
    from vramscope.dashboard import latest
    from vramscope.dashboard.app import create_app

    time.sleep(2.0)  # several allocator (0.1 s) and device (0.1 s) samples of the still state
    agent.writer.flush()
    nvml = nvml_gpu0()
    agent.sample_devices()  # one more NVML row, taken now, written before reading back
    agent.writer.flush()
    nvml_after = nvml_gpu0()
    results["nvml"] = {"before": nvml, "after": nvml_after}
    procs = {p["pid"]: p for p in store.processes()}
    devices = store.devices()
    results["devices"] = [{k: d.get(k) for k in ("device_index", "uuid", "name", "total_bytes",
                                                 "parent_uuid", "physical_index")}
                          for d in devices]
    [gpu0] = [d for d in devices if d["uuid"] == nvml["uuid"]] or [None]
    check(results, "NVML's GPU 0 is a stored device with its UUID", gpu0 is not None,
          nvml["uuid"])
    latest = latest.latest_values(store, gpu0["device_index"], None, procs) if gpu0 else None
    results["latest"] = latest
    by_pid = {p["pid"]: p for p in (latest or {}).get("processes", [])}
    for name, mine in servers.items():
        stored = by_pid.get(mine["pid"], {})
        samples = [s for s in store.samples(source="torch") if s.pid == mine["pid"]]
        landed = sorted({(s.device, s.device_uuid) for s in samples})
        # the GPU torch calls cuda:0 in that server; on the one-GPU machine, NVML's GPU 0
        theirs = mine["torch_uuid"]  # format_uuid(torch.cuda.get_device_properties(0).uuid)
        check(results, f"{name}: every sample on its GPU's UUID (the H200's)",
              bool(samples) and theirs == nvml["uuid"]
              and landed == [(gpu0["device_index"], nvml["uuid"])],
              {"landed": landed, "torch_uuid": theirs, "samples": len(samples)})
        check(results, f"{name}: stored reserved == its torch.cuda.memory_reserved()",
              stored.get("reserved_bytes") == mine["reserved_bytes"],
              {"stored": stored.get("reserved_bytes"), "torch": mine["reserved_bytes"]})
    used = (latest or {}).get("device_used_bytes")
    check(results, "device total == NVML used at that moment",
          used is not None and used == nvml_after["used_bytes"],
          {"stored": used, "nvml_before": nvml["used_bytes"],
           "nvml_after": nvml_after["used_bytes"]})
    reserved_sum = sum(p.get("reserved_bytes") or 0 for p in by_pid.values())
    unexplained = (latest or {}).get("unexplained_bytes")
    check(results, "device used == sum of processes' reserved + unexplained",
          used is not None and unexplained is not None and used == reserved_sum + unexplained,
          {"used": used, "reserved_sum": reserved_sum, "unexplained": unexplained})
    views_agree(create_app(parse_config({}, None, {}), store).test_client(), gpu0, servers,
                results)


def views_agree(client: Any, gpu0: dict, servers: dict[str, dict],
                results: dict[str, Any]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    text = client.get("/metrics").get_data(as_text=True)
    fams = {f.name: f.samples for f in text_string_to_metric_families(text)}
    device = str(gpu0["device_index"])
    reserved = {s.labels["process"]: s.value for s in fams["vramscope_process_reserved_bytes"]
                if s.labels["device"] == device}
    info = [s.labels for s in fams["vramscope_device_info"] if s.labels["device"] == device]
    want = {name: float(m["reserved_bytes"]) for name, m in servers.items()}
    check(results, "/metrics: one process series per server with its reserved bytes",
          reserved == want, {"metrics": reserved, "torch": want})
    check(results, "/metrics: vramscope_device_info names the UUID",
          [i["uuid"] for i in info] == [gpu0["uuid"]], info)
    api = {d["device"]: d for d in client.get("/api/v1/devices").get_json()["devices"]}
    api_reserved = {p["process"]: p["reserved_bytes"]
                    for p in api[gpu0["device_index"]]["latest"]["processes"]}
    check(results, "/api/v1/devices agrees with /metrics",
          {k: float(v) for k, v in api_reserved.items()} == reserved, api_reserved)


def run(out: Path) -> int:
    from vramscope.agent.config import parse_config
    from vramscope.agent.daemon import Agent

    results: dict[str, Any] = {"checks": [], "started": time.time()}
    tmp = Path(tempfile.mkdtemp(prefix="vramscope-identity-"))
    socket_path = str(tmp / "run" / "agent.sock")
    state = tmp / "state"
    state.mkdir()
    config = parse_config({"database": {"url": f"sqlite:///{tmp / 'db.sqlite'}"},
                           "sampling": {"device_interval_s": 0.1,
                                        "process_interval_s": 0.5}}, None, {})
    agent = Agent(config, socket_path=socket_path, alerts=False)
    procs: list[subprocess.Popen] = []
    try:
        agent.start()
        results["agent_devices"] = [d._asdict() for d in agent.source.devices()] \
            if agent.source else None
        procs = start_servers(socket_path, state)
        servers = wait_for(lambda: _ready(state), 180, "both servers holding memory")
        results["servers"] = servers
        pids = {m["pid"] for m in servers.values()}
        wait_for(lambda: pids <= {p["pid"] for p in agent.store.processes()}, 30,
                 "both hellos stored")
        measure(agent, agent.store, servers, results)
        nvml_pids = {e.pid for e in agent.store.events(names=["nvml_process"])}
        results["nvml_process_pids"] = sorted(p for p in nvml_pids if p is not None)
        results["status"] = {k: v for k, v in agent.status().items()
                             if k in ("clients", "written_total", "dropped_total",
                                      "rejected_total")}
        results["unjoined_total"] = agent.store.unjoined_total
    except Exception:  # noqa: BLE001 - recorded, then the exit code says it
        results["error"] = traceback.format_exc()
    finally:
        (state / "stop").write_text("")
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        agent.stop()
    results["ok"] = "error" not in results and all(c["ok"] for c in results["checks"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str))
    for c in results["checks"]:
        print(("PASS " if c["ok"] else "FAIL ") + c["check"])
    if "error" in results:
        print(results["error"])
    return 0 if results["ok"] else 1


def _ready(state: Path) -> dict[str, dict] | None:
    files = {name: state / f"{name}.json" for name, _, _ in SERVERS}
    if not all(f.exists() for f in files.values()):
        return None
    return {name: json.loads(f.read_text()) for name, f in files.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="identity.json", help="results JSON file")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ap.add_argument("--gib", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--state", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.serve, args.socket, args.gib, args.state)
    return run(Path(args.out))


if __name__ == "__main__":
    sys.exit(main())
