"""``vramscope bench dashboard``: the downsampled timeline endpoint against a raw fetch.

A generated store of 1,008,000 samples (8 devices, 24 hours, 126,000 samples per device —
one every 0.686 s) is written through the real ``Store`` and rolled up per minute, as the
agent's retention does while it runs. Then, in the same run and alternating:

- **subject**: ``GET /api/v1/timeline?device=D&start=..&end=..&max_points=2000`` through the
  Flask app (query, shaping and JSON serialisation: the server's whole time);
- **baseline**: the same device and 24 hours fetched raw with ``Store.samples`` and serialised
  to trace-format JSON (what a client would get without server-side downsampling).

Targets: the endpoint's median at most 300 ms, and at least 10x faster than raw. With
``options.quick`` the store is 40,000 samples and the targets are still reported.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING

from vramscope.agent.bench import BenchOptions, Figure, Timing, interleaved
from vramscope.agent.records import Phase, Sample

if TYPE_CHECKING:
    from flask.testing import FlaskClient
    from vramscope.agent.store import Store

T0 = 1_700_000_000.0
DAY_S = 86_400.0
DEVICES = 8
GIB = 2**30
WRITE_BATCH = 20_000


def _sample(t: float, device: int, i: int) -> Sample:
    phase = (Phase.PREFILL, Phase.DECODE, Phase.DECODE, Phase.IDLE)[i % 4]
    allocated = 30 * GIB + (i % 500) * 2**22 + (device << 28)
    return Sample(t, device, phase, "torch", 1000 + device, allocated_bytes=allocated,
                  reserved_bytes=allocated + 4 * GIB, inactive_split_bytes=(i % 97) << 20,
                  num_alloc_retries=i // 50_000, num_ooms=0, device_used_bytes=allocated + 5 * GIB,
                  device_total_bytes=141 * GIB, kv_blocks_used=i % 4000, kv_blocks_total=4096,
                  kv_blocks_cached=100)


def generate(store: Store, per_device: int) -> None:
    """``per_device`` samples for each of 8 devices, spread evenly over 24 hours."""
    step = DAY_S / per_device
    batch: list[Sample] = []
    for i in range(per_device):
        t = T0 + i * step
        batch.extend(_sample(t, d, i) for d in range(DEVICES))
        if len(batch) >= WRITE_BATCH:
            store.write_samples(batch)
            batch = []
    store.write_samples(batch)


def roll_up(store: Store) -> None:
    """Per-minute rollups of the whole day, as the live agent's retention keeps them (set-up,
    not timed): long ranges are served from them, the newest minutes from raw samples."""
    from vramscope.agent.store.maintenance import rollup_window

    first = (T0 // 60) * 60
    for hour in range(25):
        rollup_window(store, first + hour * 3600, first + (hour + 1) * 3600)


def _endpoint(client: FlaskClient, device: int) -> Callable[[], int]:
    url = (f"/api/v1/timeline?device={device}&start={T0}&end={T0 + DAY_S}&max_points=2000")

    def call() -> int:
        response = client.get(url)
        if response.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {response.status_code}")
        return len(response.data)
    return call


def _sql_only(store: Store, device: int) -> Callable[[], int]:
    from vramscope.dashboard.timeline import TIMELINE_COLUMNS

    def call() -> int:
        return len(store.timeline(device, T0, T0 + DAY_S, 2000, TIMELINE_COLUMNS))
    return call


def _raw(store: Store, device: int) -> Callable[[], int]:
    from vramscope.agent.trace import sample_to_json

    def call() -> int:
        rows = store.samples(device, T0, T0 + DAY_S)
        return len(json.dumps([sample_to_json(s) for s in rows]))
    return call


def run(options: BenchOptions) -> list[Figure]:
    from vramscope.agent.store import Store
    from vramscope.dashboard.app import create_app

    per_device = 5_000 if options.quick else 126_000
    rounds = 3 if options.quick else 5
    with tempfile.TemporaryDirectory(prefix="vramscope-bench-") as workdir:
        url = options.db_url or f"sqlite:///{os.path.join(workdir, 'dashboard.db')}"
        store = Store.open(url, host_name="bench-host")
        try:
            generate(store, per_device)
            roll_up(store)
            client = create_app(None, store).test_client()
            sizes = (_endpoint(client, 3)(), _raw(store, 3)())
            sub, base, sql = interleaved([_endpoint(client, 3), _raw(store, 3),
                                          _sql_only(store, 3)], rounds)
        finally:
            store.close()
    return _figures(per_device, sub, base, sizes) + [
        Figure("dashboard", "of which Store.timeline SQL", sql.median_s * 1000, "ms",
               spread=sql.spread(1000, "ms"), baseline="the endpoint's own query, same run")]


def _figures(per_device: int, sub: Timing, base: Timing, sizes: tuple[int, int]) -> list[Figure]:
    total = per_device * DEVICES
    ratio = base.median_s / sub.median_s
    per_round = [b / s for s, b in zip(sub.samples_s, base.samples_s)]
    note = f"store of {total} samples, 8 devices, 24 h; {per_device} rows in range"
    return [
        Figure("dashboard", "timeline 24 h, max_points=2000", sub.median_s * 1000, "ms",
               spread=sub.spread(1000, "ms") + f"; {note}; {sizes[0]} bytes",
               target="<= 300", met=sub.median_s <= 0.300),
        Figure("dashboard", "raw 24 h fetch + JSON", base.median_s * 1000, "ms",
               spread=base.spread(1000, "ms") + f"; {sizes[1]} bytes",
               baseline="(the baseline)"),
        Figure("dashboard", "raw / downsampled time", ratio, "x",
               spread=f"per-round min {min(per_round):.1f} / max {max(per_round):.1f}; "
                      f"stdev {statistics.pstdev(per_round):.2f}",
               baseline="Store.samples + json.dumps of the same range, same run",
               target=">= 10", met=ratio >= 10),
    ]
