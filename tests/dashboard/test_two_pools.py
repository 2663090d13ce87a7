"""Two servers on one device with KV pools of 63 and 16,384 blocks (issue 47 item 6), on
SQLite and PostgreSQL: the timeline document gives each process's pool apart with its share
used, the figure draws each against its own size (never one block axis where the small pool
is a flat line, never one series over both), the Overview's device row says the fullest pool
with every pool, and ``/metrics`` keeps the two servers apart by pid with no label set twice.
"""

from __future__ import annotations

import subprocess
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families
from vramscope.agent.clock import FakeClock
from vramscope.dashboard.app import create_app

from tests.support import two_pools as P
from tests.support.tools import require_tool

SMALL_SHARES = [0.0, 1 / 3, 2 / 3, 1.0]  # 0, 21, 42, 63 of 63 blocks, each second of a cycle
BIG_SHARES = [0.0, 0.03125, 0.0625, 0.09375]  # 0, 512, 1,024, 1,536 of 16,384


@pytest.fixture
def client(any_url):
    store = P.two_pools_store(any_url)
    yield create_app(P.config(), store, clock=FakeClock(P.NOW)).test_client()
    store.close()


def _query() -> str:
    start, end = P.WINDOW
    return f"device=0&start={start}&end={end}&max_points={P.MAX_POINTS}"


def test_the_timeline_document_gives_each_pool_its_share_of_its_own_size(client):
    doc = client.get("/api/v1/timeline?" + _query()).get_json()
    assert doc["bucket_s"] == 1.0
    assert (doc["several_kv_pools"], doc["kv_pool_pids"], doc["kv_pools_note"]) == (
        True, [P.SMALL, P.BIG], None)
    pools = {p["pid"]: p for p in doc["kv_pools"]}
    assert {pid: (p["process"], p["blocks_total"], p["ended"]) for pid, p in pools.items()} == {
        P.SMALL: ("vllm engine core (port 8000) (pid 4100)", 63, False),
        P.BIG: ("vllm engine core (port 8001) (pid 4200)", 16_384, False)}
    seconds = [P.START + k for k in range(P.SECONDS)]
    for pid, shares in ((P.SMALL, SMALL_SHARES), (P.BIG, BIG_SHARES)):
        ratio = pools[pid]["series"]["kv_used_ratio"]
        assert ratio["ts"] == seconds
        assert ratio["max"] == [shares[k % 4] for k in range(P.SECONDS)]
        assert ratio["used"] == [P.used(pid, k) for k in range(P.SECONDS)]
        assert set(ratio["total"]) == {P.TOTAL[pid]}
        assert pools[pid]["series"]["kv_blocks_used"]["max"] == ratio["used"]
    # what the device-wide series make of the two: each bucket's larger of the two counts,
    # the big pool's, on a 16,384-block scale where 63 blocks is a flat line
    assert doc["series"]["kv_blocks_used"]["max"][:4] == [0, 512, 1024, 1536]


def test_the_figure_draws_each_pool_as_its_share_and_no_series_over_both(client):
    fig = client.get("/api/v1/figures/timeline?" + _query()).get_json()
    kv = {t["name"]: t for t in fig["data"] if t.get("yaxis") == "y3"}
    small = "vllm engine core (port 8000) (pid 4100) · KV used of its 63 blocks"
    big = "vllm engine core (port 8001) (pid 4200) · KV used of its 16,384 blocks"
    assert sorted(kv) == sorted([small, big])  # no "KV blocks used" mixing the two pools
    assert not any(t.get("yaxis") == "y5" for t in fig["data"])  # nor tokens/block over both
    # steps: a point a second, the last (full) held to the window's end
    assert kv[small]["y"] == [SMALL_SHARES[k % 4] for k in range(P.SECONDS)] + [1.0]
    assert kv[big]["y"] == [BIG_SHARES[k % 4] for k in range(P.SECONDS)] + [0.09375]
    assert kv[small]["customdata"][:4] == [[0, 63], [21, 63], [42, 63], [63, 63]]
    assert kv[big]["customdata"][3] == [1536, 16_384]
    assert kv[small]["line"]["shape"] == "hv"
    assert kv[small]["legendgroup"] != kv[big]["legendgroup"]
    axis = fig["layout"]["yaxis3"]
    assert (axis["range"], axis["tickformat"]) == ([0, 1.05], ".0%")


def test_the_overview_device_row_says_the_fullest_pool_and_each_pool(client):
    (row,) = client.get("/api/v1/devices").get_json()["devices"]
    # the fullest pool's share, as the agent's KV rules read it: not the sum's 1,599 / 16,447
    assert row["kv_usage_ratio"] == 1.0
    assert row["kv_pools"] == [
        {"pid": P.SMALL, "process": "vllm engine core (port 8000)", "kv_blocks_used": 63,
         "kv_blocks_total": 63, "kv_usage_ratio": 1.0},
        {"pid": P.BIG, "process": "vllm engine core (port 8001)", "kv_blocks_used": 1536,
         "kv_blocks_total": 16_384, "kv_usage_ratio": 0.09375}]
    procs = {p["pid"]: p for p in client.get("/api/v1/processes").get_json()["processes"]}
    assert {pid: (p["kv_blocks_used"], p["kv_blocks_total"], p["kv_usage_ratio"])
            for pid, p in procs.items()} == {P.SMALL: (63, 63, 1.0),
                                             P.BIG: (1536, 16_384, 0.09375)}


def test_metrics_keep_the_two_servers_apart_and_promtool_passes(client):
    text = client.get("/metrics").get_data(as_text=True)
    families = {f.name: f.samples for f in text_string_to_metric_families(text)}
    for name, pid, value in (("vramscope_process_kv_blocks_used", P.SMALL, 63),
                             ("vramscope_process_kv_blocks_used", P.BIG, 1536),
                             ("vramscope_process_kv_blocks_capacity", P.SMALL, 63),
                             ("vramscope_process_kv_blocks_capacity", P.BIG, 16_384)):
        found = [s.value for s in families[name] if s.labels.get("pid") == str(pid)]
        assert found == [value], (name, pid, families[name])
    assert {s.labels["process"] for s in families["vramscope_process_kv_blocks_used"]} == {
        "vllm engine core (port 8000)", "vllm engine core (port 8001)"}
    # no two samples with one name and one label set, in any family
    seen = Counter((s.name, tuple(sorted(s.labels.items())))
                   for samples in families.values() for s in samples)
    assert [k for k, n in seen.items() if n > 1] == []
    assert seen[("vramscope_process_kv_blocks_used", (
        ("device", "0"), ("host", "h"), ("pid", str(P.SMALL)),
        ("process", "vllm engine core (port 8000)")))] == 1
    promtool = require_tool("promtool")
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and (out.stdout + out.stderr).strip() == "", out.stdout + out.stderr


def test_more_raw_rows_than_grouped_labels_the_device_lines_and_says_to_zoom_in(any_url,
                                                                              monkeypatch):
    from vramscope.agent.store import process_series

    store = P.two_pools_store(any_url)
    monkeypatch.setattr(process_series, "PROCESS_RAW_LIMIT", 100)  # the window holds 120
    client = create_app(P.config(), store, clock=FakeClock(P.NOW)).test_client()
    doc = client.get("/api/v1/timeline?" + _query()).get_json()
    assert (doc["kv_pools"], doc["kv_pool_pids"], doc["several_kv_pools"]) == (
        [], [P.SMALL, P.BIG], True)  # both found in the window's edge rows
    assert doc["kv_pools_note"] == ("2 KV pools: each is drawn from at most 100 raw samples, "
                                    "and this window holds more. Zoom in to see each pool.")
    fig = client.get("/api/v1/figures/timeline?" + _query()).get_json()
    kv = [t["name"] for t in fig["data"] if t.get("yaxis") in ("y3", "y5")]
    assert kv == [f"KV blocks {what}, largest of 2 pools per bucket"
                  for what in ("used", "cached", "total")]  # never "KV blocks used" alone
    assert fig["layout"]["yaxis3"]["title"]["text"] == "KV blocks"
    assert fig["layout"]["meta"]["kv_pools_note"] == doc["kv_pools_note"]
    store.close()


def test_a_window_across_the_raw_horizon_draws_each_pool_from_it(any_url):
    from vramscope.agent.store.maintenance import rollup_window

    store = P.two_pools_store(any_url)
    rollup_window(store, P.START, P.NOW)
    horizon = P.START + 30
    with store.engine.begin() as c:  # what retention leaves: the newest 30 s raw
        c.exec_driver_sql(f"DELETE FROM samples WHERE ts_s < {horizon!r}")
    client = create_app(P.config(), store, clock=FakeClock(P.NOW)).test_client()
    doc = client.get("/api/v1/timeline?" + _query()).get_json()
    assert doc["several_kv_pools"] is True and doc["kv_pool_pids"] == [P.SMALL, P.BIG]
    small = doc["kv_pools"][0]["series"]["kv_used_ratio"]
    assert small["ts"][0] == horizon
    assert small["max"] == [SMALL_SHARES[k % 4] for k in range(30, P.SECONDS)]
    assert doc["kv_pools_note"] == (
        "2 KV pools, each drawn from 2027-01-15T07:59:30Z on; before it only the tiers answer, "
        "which keep no process (raw samples are kept retention.raw_s).")
    store.close()


def test_a_process_without_a_pool_is_no_second_pool(any_url):
    """One pool beside a worker that sends allocator samples only, across the raw horizon:
    the worker (its process row on the device, as the agent writes it) is no pool, so the one
    pool is drawn in blocks as ever (a second pool counted from the worker would blank the
    lane before the raw samples)."""
    from vramscope.agent.store.maintenance import rollup_window

    store = P.two_pools_store(any_url, pools=(P.SMALL,), worker=True)
    rollup_window(store, P.START, P.NOW)
    with store.engine.begin() as c:
        c.exec_driver_sql(f"DELETE FROM samples WHERE ts_s < {P.START + 30!r}")
    client = create_app(P.config(), store, clock=FakeClock(P.NOW)).test_client()
    doc = client.get("/api/v1/timeline?" + _query()).get_json()
    assert (doc["kv_pool_pids"], doc["several_kv_pools"], doc["kv_pools_note"]) == (
        [P.SMALL], False, None)
    fig = client.get("/api/v1/figures/timeline?" + _query()).get_json()
    kv = [t["name"] for t in fig["data"] if t.get("yaxis") == "y3"]
    assert kv == ["KV blocks used", "KV blocks cached", "KV blocks total"]
    assert max(v for t in fig["data"] if t["name"] == "KV blocks used"
               for v in t["y"] if v is not None) == 63
    store.close()
