"""Two processes on one GPU in the timeline: drawn per process where raw samples keep their
pids (one ended 10 minutes before the window's end, and said so), and where only the pid-less
tiers answer, allocated and reserved labelled as the range over the processes with a note
that says what would show them apart. One process: nothing changes. Real stores (SQLite and
PostgreSQL), the real app and its routes."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest
from vramscope.agent.records import Phase, Sample
from vramscope.agent.store import Store, process_series
from vramscope.agent.store.maintenance import rollup_window
from vramscope.dashboard.app import create_app

GiB, MiB = 2**30, 2**20
T0 = 1_700_000_400.0  # a ten-minute boundary
A, B = 100, 200  # A runs the whole window; B stops 10 minutes before its end
RAW = (T0, T0 + 1800.0)  # 30 minutes, a sample every 10 s: 6 a minute-bucket
B_STOPS = T0 + 1200.0


def _a(i: int, t: float) -> Sample:
    return Sample(t, 0, Phase.DECODE, "torch", A, allocated_bytes=10 * GiB + i * MiB,
                  reserved_bytes=12 * GiB + 2 * i * MiB)


def _b(i: int, t: float) -> Sample:
    return Sample(t, 0, Phase.DECODE, "torch", B, allocated_bytes=GiB + i * MiB,
                  reserved_bytes=2 * GiB)


def _nvml(t: float) -> Sample:
    return Sample(t, 0, Phase.UNKNOWN, "nvml", device_used_bytes=20 * GiB,
                  device_total_bytes=80 * GiB)


def _store(url: str, end: float, step: float, two: bool = True, b_stops: float | None = None
           ) -> Store:
    store = Store.open(url, host_name="h")
    rows = []
    n = int((end - T0) / step)
    for i in range(n + 1):
        t = T0 + i * step
        rows += [_a(i, t), _nvml(t)]
        if two and (b_stops is None or t <= b_stops):
            rows.append(_b(i, t))
    store.write(rows)
    store.upsert_process(A, T0, name="vllm", model="llama-8b", device_indexes=(0,), rank=0)
    store.upsert_process(A, end)
    if two:
        store.upsert_process(B, T0, name="embedder", device_indexes=(0,))
        store.upsert_process(B, b_stops or end)
    return store


def _get(store: Store, path: str, start: float, end: float, points: int) -> dict:
    client = create_app(None, store).test_client()
    got = client.get(f"/api/v1/{path}?device=0&start={start!r}&end={end!r}"
                     f"&max_points={points}")
    assert got.status_code == 200
    return got.get_json()


def _memory(fig: dict) -> list[dict]:
    """The memory panel's curves (the phase bands behind them left out)."""
    return [t for t in fig["data"] if t["yaxis"] == "y" and t["type"] == "scatter"
            and t["name"] not in ("prefill", "decode", "idle", "setup")]


def _minutes(first: int, last: int, value) -> dict[str, list]:
    """A series of minute buckets ``first..last`` from T0, each the min and max of its six
    samples (``value(i)`` for sample i; a bucket that holds one more is the caller's)."""
    ks = range(first, last + 1)
    return {"ts": [T0 + 60.0 * k for k in ks], "min": [value(6 * k) for k in ks],
            "max": [value(6 * k + 5) for k in ks]}


def test_a_raw_window_has_each_process_apart_and_the_one_that_stopped_ended(any_url):
    store = _store(any_url, RAW[1], 10.0, b_stops=B_STOPS)
    # 30 buckets of a minute: raw samples grouped (not enough for the rollups to be worth it)
    doc = _get(store, "timeline", *RAW, 30)
    assert doc["bucket_s"] == 60.0
    assert doc["mixed_processes"] is True and doc["mixed_processes_note"] is None
    assert doc["processes_from"] == T0 and doc["process_pids"] == [A, B]
    assert doc["processes_truncated"] is False
    a, b = doc["processes"]  # by pid
    assert {k: a[k] for k in ("pid", "name", "model", "rank", "label", "process", "ended",
                              "last_ts")} == {
        "pid": A, "name": "vllm", "model": "llama-8b", "rank": 0, "label": "vllm/rank0",
        "process": "vllm/rank0 (pid 100)", "ended": False, "last_ts": RAW[1]}
    assert {k: b[k] for k in ("pid", "name", "process", "ended", "last_ts")} == {
        "pid": B, "name": "embedder", "process": "embedder (pid 200)", "ended": True,
        "last_ts": B_STOPS}
    # A: 6 samples a minute, i MiB over 10 GiB; the last bucket also holds the end's sample
    allocated = _minutes(0, 29, lambda i: 10 * GiB + i * MiB)
    allocated["max"][-1] = 10 * GiB + 180 * MiB
    reserved = _minutes(0, 29, lambda i: 12 * GiB + 2 * i * MiB)
    reserved["max"][-1] = 12 * GiB + 360 * MiB
    assert a["series"] == {"allocated_bytes": allocated, "reserved_bytes": reserved}
    assert a["series"]["allocated_bytes"]["min"][:2] == [10 * GiB, 10 * GiB + 6 * MiB]
    # B: until its last sample (i = 120, alone in minute 20), then nothing
    b_allocated = _minutes(0, 20, lambda i: GiB + i * MiB)
    b_allocated["max"][-1] = GiB + 120 * MiB
    assert b["series"]["allocated_bytes"] == b_allocated
    assert b["series"]["reserved_bytes"] == {"ts": b_allocated["ts"], "min": [2 * GiB] * 21,
                                             "max": [2 * GiB] * 21}
    # the device-wide series stay as they were: each bucket's range over both processes
    assert doc["series"]["allocated_bytes"]["min"][:1] == [GiB]
    assert doc["series"]["allocated_bytes"]["max"][:1] == [10 * GiB + 5 * MiB]
    assert doc["series"]["device_used_bytes"]["max"] == [20 * GiB] * 30

    fig = _get(store, "figures/timeline", *RAW, 30)
    memory = _memory(fig)
    assert [t["name"] for t in memory] == [
        "vllm/rank0 (pid 100) · allocated", "vllm/rank0 (pid 100) · reserved",
        "embedder (pid 200) · allocated · ended", "embedder (pid 200) · reserved · ended",
        "device used", "limit"]
    assert memory[0]["y"][:2] == [10 + 5 / 1024, 10 + 11 / 1024]  # GiB, the bucket's max
    assert len(memory[2]["y"]) == 21  # B's line stops where B did
    assert memory[0]["line"]["color"] == memory[1]["line"]["color"] != memory[2]["line"]["color"]
    assert (memory[0]["line"]["dash"], memory[1]["line"]["dash"]) == ("solid", "dash")
    # no floor: the one drawn is the engine's judged floor of the leading process, and this
    # store holds no verdicts (never a floor of two processes' minima)
    assert not any("floor" in t["name"] for t in fig["data"])
    assert fig["layout"]["meta"]["mixed_processes_note"] is None
    go.Figure(fig)  # Plotly itself accepts every property
    store.close()


def test_a_window_of_more_raw_samples_than_grouped_says_to_zoom_in(any_url, monkeypatch):
    store = _store(any_url, RAW[1], 10.0, b_stops=B_STOPS)
    monkeypatch.setattr(process_series, "PROCESS_RAW_LIMIT", 100)  # the window holds 483
    doc = _get(store, "timeline", *RAW, 30)
    assert doc["processes"] == [] and doc["processes_from"] is None
    # both found at the window's start (raw rows) and in the processes table
    assert doc["process_pids"] == [A, B] and doc["mixed_processes"] is True
    assert doc["mixed_processes_note"].startswith(
        "Allocated and reserved are each bucket's range over 2 processes: per-process lines "
        "group at most ")
    store.close()


def _rolled(url: str, two: bool = True) -> Store:
    """Three hours at one sample a minute, rolled up; retention deleted the raw samples of
    the first two hours (the newest hour's stay)."""
    end = T0 + 3 * 3600.0
    store = _store(url, end, 60.0, two=two)
    rollup_window(store, T0, end)
    with store.engine.begin() as c:
        c.exec_driver_sql(f"DELETE FROM samples WHERE ts_s < {T0 + 7200.0!r}")
    return store


def test_a_window_the_rollups_answer_labels_the_mix_and_says_why(any_url):
    store = _rolled(any_url)
    start, end = T0, T0 + 7199.0  # older than every raw sample: minute rollups, 4-min buckets
    doc = _get(store, "timeline", start, end, 30)
    assert doc["bucket_s"] == 240.0
    assert doc["processes"] == [] and doc["processes_from"] is None
    assert doc["process_pids"] == [A, B] and doc["mixed_processes"] is True
    assert doc["mixed_processes_note"] == (
        "Allocated and reserved are each bucket's range over 2 processes: the per-second tier "
        "and the rollups, which retention keeps after the raw samples, have no process. "
        "Per-process lines need raw samples, kept retention.raw_s; this device's begin at "
        "2023-11-15T00:20:00Z.")
    # each four-minute bucket: B's least (minute 4k: i = 4k) to A's greatest (i = 4k + 3)
    allocated = doc["series"]["allocated_bytes"]
    assert allocated["min"][:3] == [GiB, GiB + 4 * MiB, GiB + 8 * MiB]
    assert allocated["max"][:3] == [10 * GiB + 3 * MiB, 10 * GiB + 7 * MiB, 10 * GiB + 11 * MiB]
    fig = _get(store, "figures/timeline", start, end, 30)
    names = [t["name"] for t in _memory(fig)]
    assert names == ["allocated, all processes (range over processes per bucket): least",
                     "allocated, all processes (range over processes per bucket)",
                     "reserved, all processes (range over processes per bucket): least",
                     "reserved, all processes (range over processes per bucket)",
                     "device used", "limit"]
    band = _memory(fig)[1]
    assert band["fill"] == "tonexty" and band["y"][:1] == [10 + 3 / 1024]
    assert fig["layout"]["meta"]["mixed_processes_note"] == doc["mixed_processes_note"]
    go.Figure(fig)
    store.close()


def test_a_window_across_the_raw_horizon_is_per_process_from_it(any_url):
    store = _rolled(any_url)
    start, end = T0, T0 + 3 * 3600.0
    doc = _get(store, "timeline", start, end, 60)
    assert doc["bucket_s"] == 240.0
    assert doc["processes_from"] == T0 + 7200.0 and doc["process_pids"] == [A, B]
    assert [p["process"] for p in doc["processes"]] == ["vllm/rank0 (pid 100)",
                                                        "embedder (pid 200)"]
    assert [p["ended"] for p in doc["processes"]] == [False, False]
    # minutes 120..180 in 4-minute buckets from T0 (bucket 30 on): A's i = 120 + 4j...
    a_allocated = doc["processes"][0]["series"]["allocated_bytes"]
    assert a_allocated["ts"][:2] == [T0 + 7200.0, T0 + 7440.0]
    assert a_allocated["min"][:2] == [10 * GiB + 120 * MiB, 10 * GiB + 124 * MiB]
    assert a_allocated["max"][:2] == [10 * GiB + 123 * MiB, 10 * GiB + 127 * MiB]
    assert doc["mixed_processes_note"] == (
        "Per-process lines from 2023-11-15T00:20:00Z on (this device's first raw sample); "
        "before it allocated and reserved are each bucket's range over 2 processes: the "
        "per-second tier and the rollups, which retention keeps after the raw samples, have "
        "no process. Raw samples are kept retention.raw_s.")
    fig = _get(store, "figures/timeline", start, end, 60)
    band = next(t for t in fig["data"]
                if t["name"] == "allocated, all processes (range over processes per bucket)")
    assert len(band["x"]) == 30  # the buckets before the raw samples only
    store.close()


@pytest.mark.parametrize("window", ["rolled", "raw"])
def test_one_process_changes_nothing(any_url, window):
    if window == "rolled":
        store, start, end, points = _rolled(any_url, two=False), T0, T0 + 7199.0, 30
    else:
        store, (start, end), points = _store(any_url, RAW[1], 10.0, two=False), RAW, 30
    doc = _get(store, "timeline", start, end, points)
    assert doc["mixed_processes"] is False and doc["mixed_processes_note"] is None
    assert doc["process_pids"] == [A]
    assert [p["process"] for p in doc["processes"]] == (
        [] if window == "rolled" else ["vllm/rank0 (pid 100)"])
    fig = _get(store, "figures/timeline", start, end, points)
    names = [t["name"] for t in _memory(fig)]
    assert names[:4] == ["allocated", "reserved", "device used", "limit"]
    store.close()
