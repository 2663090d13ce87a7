"""A seeded dashboard database, written through the real ``Store`` API, shared by the dashboard
tests (Flask client, metrics, schemathesis, browser).

Two hours of one host, two devices, 2 s apart:

- device 0 (80 GiB limit) serves a request every 30 s (2 s prefill, 20 s decode, 8 s idle) while
  its idle floor rises by 2 GiB an hour (a leak), with allocator retries late on and one OOM
  with a post-mortem;
- device 1 is healthy and flat.

Everything the tests assert is derived from the constants below, never re-measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vramscope.agent.alerts.engine import AlertEngine
from vramscope.agent.clock import FakeClock
from vramscope.agent.config import parse_config
from vramscope.agent.records import Event, Holder, Phase, PostMortem, Sample
from vramscope.agent.store import Store
from vramscope.agent.store import verdicts as stored_verdicts

GIB = 2**30
T0 = 1_700_000_000.0
DURATION_S = 7200
STEP_S = 2
HOST = "gpu-node-1"
LIMIT_BYTES = 80 * GIB
WEIGHTS_BYTES = 14 * GIB
LEAK_BYTES_PER_S = 2 * GIB / 3600
KV_BLOCKS_TOTAL = 4096
REQUEST_EVERY_S = 30
RETRY_TS = (T0 + 6000, T0 + 6600)
OOM_TS = T0 + 7100
XSS_NAME = "<img src=x onerror=alert(1)>"
STEPS = DURATION_S // STEP_S  # samples per source per device
NOW_S = T0 + DURATION_S + 5


def phase_at(t: float) -> Phase:
    into = (t - T0) % REQUEST_EVERY_S
    if into < 2:
        return Phase.PREFILL
    return Phase.DECODE if into < 22 else Phase.IDLE


def torch_sample(t: float, device: int) -> Sample:
    phase = phase_at(t)
    if device == 1:
        return Sample(t, 1, phase, "torch", 4242, allocated_bytes=20 * GIB,
                      reserved_bytes=22 * GIB, inactive_split_bytes=GIB // 4,
                      num_alloc_retries=0, num_ooms=0)
    floor = WEIGHTS_BYTES + int(LEAK_BYTES_PER_S * (t - T0))
    into = (t - T0) % REQUEST_EVERY_S
    kv = int(min(into, 22) / 22 * 6 * GIB) if phase is not Phase.IDLE else 0
    spike = 3 * GIB if phase is Phase.PREFILL else 0
    allocated = floor + kv + spike
    retries = sum(1 for r in RETRY_TS if t >= r)
    snapshot = int(t - T0) % 60 == 0
    return Sample(t, 0, phase, "torch", 4141, allocated_bytes=allocated,
                  reserved_bytes=allocated + 4 * GIB, inactive_split_bytes=GIB + kv // 8,
                  largest_free_block_bytes=GIB // 2 if snapshot else None,
                  num_alloc_retries=retries, num_ooms=1 if t >= OOM_TS else 0)


def nvml_sample(t: float, device: int) -> Sample:
    used = 23 * GIB if device == 1 else torch_sample(t, 0).reserved_bytes + GIB
    return Sample(t, device, Phase.UNKNOWN, "nvml", None, device_used_bytes=used,
                  device_total_bytes=LIMIT_BYTES)


def kv_sample(t: float) -> Sample:
    into = (t - T0) % REQUEST_EVERY_S
    used = int(min(into, 22) / 22 * 3000) if phase_at(t) is not Phase.IDLE else 0
    return Sample(t, 0, phase_at(t), "kv", 4141, kv_blocks_used=used, kv_blocks_cached=500,
                  kv_blocks_total=KV_BLOCKS_TOTAL, kv_tokens_used=used * 14)


def samples() -> list[Sample]:
    out = []
    for i in range(STEPS):
        t = T0 + i * STEP_S
        out += [torch_sample(t, 0), nvml_sample(t, 0), kv_sample(t), torch_sample(t, 1),
                nvml_sample(t, 1)]
    return out


def events() -> list[Event]:
    out = []
    for k, start in enumerate(range(0, DURATION_S, REQUEST_EVERY_S)):
        t = T0 + start
        rid = f"req-{k}"
        out += [Event(t, "request_start", 0, 4141, Phase.PREFILL, rid),
                Event(t, "phase", 0, 4141, Phase.PREFILL),
                Event(t + 2, "phase", 0, 4141, Phase.DECODE),
                Event(t + 22, "phase", 0, 4141, Phase.IDLE),
                Event(t + 22, "request_end", 0, 4141, Phase.DECODE, rid)]
    out.append(Event(OOM_TS, "oom", 0, 4141, Phase.PREFILL, None,
                     {"message": "CUDA out of memory. Tried to allocate 2.00 GiB"}))
    out.append(Event(T0 + 3000, "kv_orphaned_blocks", 0, 4141, None, "req-100",
                     {"blocks": 12}))
    return out


def postmortem(snapshot_path: str | None) -> PostMortem:
    # hooks.oom.segment_map's shape; segment i has 2*(i % 5) MiB free, its largest hole half
    segments = tuple({"address": i * 20 * 2**20, "total_size_bytes": 20 * 2**20,
                      "allocated_bytes": (20 - 2 * (i % 5)) * 2**20,
                      "largest_free_block_bytes": (i % 5) * 2**20, "segment_type": "large"}
                     for i in range(12))
    holders = (Holder(6 * GIB, ("model.py:88:forward", "engine.py:310:step"), Phase.PREFILL),
               Holder(2 * GIB, ("kv_cache.py:41:grow",), Phase.DECODE),
               Holder(GIB, (), None))
    return PostMortem(OOM_TS, 0, 4141, Phase.PREFILL, 2 * GIB, GIB, LIMIT_BYTES,
                      60 * GIB, 66 * GIB, GIB // 2, 0.92, ("req-236", "<b>req-237</b>"),
                      holders, segments, "CUDA out of memory. Tried to allocate 2.00 GiB",
                      "fragmentation", ("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                                        "use a paged KV pool"), snapshot_path)


@dataclass
class Seeded:
    url: str
    store: Store
    clock: FakeClock
    snapshot_path: Path
    postmortem_id: int
    active_alert_id: int

    def config(self, **raw):
        """Defaults, ``hooks.snapshot_dir`` where the snapshot is, and ``section={...}`` tables."""
        raw.setdefault("hooks", {}).setdefault("snapshot_dir", str(self.snapshot_path.parent))
        return parse_config(raw, None, {})


def seed(db_path: Path, with_snapshot: bool = True, url: str | None = None,
         agent_config: Mapping[str, Any] | None = None) -> Seeded:
    """Seed a SQLite file at ``db_path`` (or the database at ``url``; the snapshot file still
    goes beside ``db_path``). ``agent_config``: the settings the agent's alert engine ran with
    (its ``[server]`` section, its thresholds); the defaults when None."""
    url = url or f"sqlite:///{db_path}"
    store = Store.open(url, host_name=HOST)
    store.describe_device(0, uuid="GPU-0000", name="NVIDIA H100 80GB HBM3",
                          total_bytes=LIMIT_BYTES)
    store.describe_device(1, uuid="GPU-0001", name="NVIDIA H100 80GB HBM3",
                          total_bytes=LIMIT_BYTES)
    store.write(samples(), events())
    # the alert engine's verdicts, as the agent (or ``vramscope import``) stores them
    engine = AlertEngine.from_config(agent_config)
    engine.feed([*samples(), *events()])
    stored_verdicts.write(store, engine.verdicts.take())
    store.upsert_process(4141, T0 + DURATION_S, name=XSS_NAME, model="llama-<script>",
                         device_indexes=[0])
    store.upsert_process(4242, T0 + DURATION_S, name="vllm-serve", model="qwen2-7b",
                         device_indexes=[1])
    snap = db_path.parent / "oom-snapshot.pickle"
    snap.write_bytes(b"\x80\x04snapshot")
    pm_id = store.write_postmortem(postmortem(str(snap) if with_snapshot else None))
    active = store.open_alert("idle_floor_leak", "warning", T0 + 5400, device=0,
                              value=2.5, message="idle floor rising <b>2 GiB/h</b>",
                              labels={"server": "<i>api</i>"})
    resolved = store.open_alert("headroom", "critical", T0 + 7000, device=0, value=0.02,
                                message="headroom 2 % of the limit")
    store.resolve_alert(resolved, T0 + 7150)
    store.write_agent_stats(NOW_S - 1, clients=2, rows_per_s=2.5, queue_depth=3,
                            dropped_total=7, rejected_total=1, db_size_bytes=12_345_678)
    return Seeded(url, store, FakeClock(NOW_S), snap, pm_id, active)


class ServedApp:
    """A Flask app served by waitress on a free loopback port, in a daemon thread."""

    def __init__(self, app) -> None:
        import threading

        from waitress.server import create_server

        self.server = create_server(app, host="127.0.0.1", port=0, threads=4)
        self.port = self.server.effective_port
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.run, name="dashboard-test-server",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.close()


# --- pytest fixtures (import them into a test module to use them) -----------------------------
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def seeded(tmp_path_factory) -> Seeded:
    """The seeded database, shared read-only by the dashboard tests of a session."""
    return seed(tmp_path_factory.mktemp("dashboard") / "seed.db")


@pytest.fixture
def dash_app(seeded):
    from vramscope.dashboard.app import create_app

    return create_app(seeded.config(), seeded.store, clock=seeded.clock)


@pytest.fixture
def client(dash_app):
    return dash_app.test_client()
