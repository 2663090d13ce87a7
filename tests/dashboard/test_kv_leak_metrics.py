"""A KV-pool leak on a CPU server, as ``/metrics`` exposes it (issue 44: "the latest orphan count
(not a sum)" on every surface): the stored leak verdict's orphaned blocks and their rate, one
series for the running process that leaks, none for its healthy neighbour's pool.

pid 9's pool check finds 3 more orphaned blocks each second (3, 6, … 60 over 20 checks); pid 8
runs a pool of its own that frees every block. Neither has allocator counters (a CPU server)."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from vramscope.agent.alerts.engine import AlertEngine
from vramscope.agent.alerts.verdicts import ORPHAN_ROW_S
from vramscope.agent.clock import FakeClock
from vramscope.agent.config import parse_config
from vramscope.agent.records import Event, Phase, Sample
from vramscope.agent.store import Store
from vramscope.agent.store import verdicts as stored
from vramscope.dashboard.app import create_app

T0 = 1_800_000_000.0
PER_BLOCK = 16384
CHECKS = 20


def _records() -> tuple[list[Sample], list[Event]]:
    samples, events = [], []
    for i in range(CHECKS):
        t = T0 + i
        samples.append(Sample(t, 0, Phase.DECODE, "kv", 9, kv_blocks_used=100 + 3 * (i + 1),
                              kv_blocks_total=1024))
        samples.append(Sample(t + 0.5, 0, Phase.DECODE, "kv", 8, kv_blocks_used=100,
                              kv_blocks_total=1024))
        events.append(Event(t + 0.25, "kv_orphaned_blocks", 0, 9, data={
            "blocks": 3 * (i + 1), "bytes_per_block": PER_BLOCK, "block_ids": [], "owners": [],
            "problems": []}))
    return samples, events


@pytest.fixture
def metrics(any_url):
    samples, events = _records()
    engine = AlertEngine.from_config(None)
    engine.feed(sorted([*samples, *events], key=lambda r: r.ts_s))
    with Store.open(any_url) as s:
        s.write(samples, events)
        s.upsert_process(9, T0 + CHECKS, name="leaky-kv")
        s.upsert_process(8, T0 + CHECKS, name="healthy-kv")
        stored.write(s, engine.verdicts.take())
        client = create_app(parse_config({}, None), s,
                            clock=FakeClock(T0 + CHECKS)).test_client()
        text = client.get("/metrics").get_data(as_text=True)
        row = next(v for v in stored.latest(s, 0, None, T0 + CHECKS) if v.pid == 9)
    got: dict[str, Any] = {f.name: f.samples for f in text_string_to_metric_families(text)}
    got["_row"] = (row.leak_kv.blocks if row.leak_kv else None, row.ts_s)
    return got


def _by_pid(samples) -> dict[str, float]:
    return {s.labels["pid"]: s.value for s in samples}


def test_the_leaking_process_s_latest_orphan_count_and_rate_are_its_series(metrics):
    # the count of the newest stored row: the check at 15 s (48), the latest count as the
    # verdict log writes it (a moved count once the last row is ORPHAN_ROW_S old, not a row
    # per check): never the sum of the checks (630 by the last one)
    orphans, row_ts = metrics["_row"]
    assert (orphans, row_ts - T0) == (48, 15.25)
    assert (T0 + CHECKS - 1) - row_ts < ORPHAN_ROW_S
    assert _by_pid(metrics["vramscope_process_kv_orphaned_blocks"]) == {"9": 48.0}
    rate = _by_pid(metrics["vramscope_process_kv_orphaned_blocks_per_second"])
    assert rate == {"9": pytest.approx(3.0)}
    # the leak verdict: pid 9 leaks at the pool's bytes per second; pid 8 has no leak to show
    assert _by_pid(metrics["vramscope_process_leak_state"])["9"] == 1.0
    assert _by_pid(metrics["vramscope_process_leak_slope_bytes_per_second"]) == {
        "9": pytest.approx(3.0 * PER_BLOCK)}
    assert _by_pid(metrics["vramscope_process_leak_state"]).get("8", -1.0) != 1.0
