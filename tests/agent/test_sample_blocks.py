"""The compact raw tier (agent/store/sample_blocks.py): closed intervals of raw samples moved
into blocks of compressed columns read back exactly as before, on SQLite and a real
PostgreSQL: every reader answer the same after compaction (whole or half done), an export of an
imported trace the same records, an import repeated after compaction stores nothing twice, and
retention deletes whole blocks."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from sqlalchemy import func, select
from vramscope.agent.cli import main
from vramscope.agent.clock import FakeClock
from vramscope.agent.records import Phase, Sample
from vramscope.agent.retention import Retention
from vramscope.agent.store import Store, block_codec, fleet, maintenance, reader, sample_blocks
from vramscope.agent.store.reader import Span
from vramscope.agent.store.schema import sample_blocks as blocks_table
from vramscope.agent.store.schema import samples

DATA = Path(__file__).resolve().parents[1] / "data"
OOM = DATA / "gpu_oom.jsonl"
T0 = 1_700_000_130.25  # not on a block's boundary: the first and last blocks are partial
SPAN_S = 40 * 60.0
GIB = 1 << 30


def _scripted() -> list[Sample]:
    """40 minutes at 2 Hz: two torch processes alternating (phases changing), NVML without a
    pid or a phase, a counter NULL on every third row, and two rows of one instant."""
    out = []
    phases = (Phase.PREFILL, Phase.DECODE, Phase.IDLE)
    for i in range(int(SPAN_S * 2)):
        ts = T0 + i * 0.5
        pid = 11 if i % 2 else 12
        out.append(Sample(ts, 0, phases[(i // 7) % 3], "torch", pid,
                          allocated_bytes=GIB + (i * 4096) % (64 << 20),
                          reserved_bytes=2 * GIB + (i // 50) * (2 << 20),
                          active_bytes=None if i % 3 == 0 else GIB + i,
                          kv_blocks_used=i % 97))
        out.append(Sample(ts, 0, Phase.UNKNOWN, "nvml", None, device_used_bytes=30 * GIB + i,
                          device_total_bytes=80 * GIB))
    out.append(Sample(T0 + 100.0, 0, Phase.DECODE, "torch", 11, allocated_bytes=5))
    return out


def _snapshot(store: Store) -> dict[str, object]:
    """Every raw read of the device, as the reader and the store answer them."""
    end = T0 + SPAN_S
    out: dict[str, object] = {
        "samples": store.samples(0),
        "window": store.samples(0, T0 + 590.0, T0 + 1210.0),
        "time_range": store.time_range(0),
        "time_range_bounded": store.time_range(0, not_after_s=T0 + 1000.0),
        "raw_from": reader.raw_from(store, 0),
        "count": reader.count_samples(store, Span(0, T0 + 300.0, T0 + 1500.0), 10_000),
        "count_capped": reader.count_samples(store, Span(0, T0, end), 100),
        "fleet_now": [(d.device["device_index"], d.span, d.recent)
                      for d in reader.fleet_samples(store, T0 + 500.0, 30.0)],
    }
    for name, (lo, hi) in {"all": (T0 - 60.0, end + 60.0), "15m": (T0 + 600.0, T0 + 1500.0),
                           "1m": (T0 + 1201.0, T0 + 1261.0)}.items():
        span = Span(0, lo, hi)
        for points in (30, 400, 2000):
            out[f"timeline {name} {points}"] = reader.timeline(
                store, span, points, ("allocated_bytes", "device_used_bytes"))
            out[f"series {name} {points}"] = reader.series(
                store, span, points, ("allocated_bytes", "active_bytes"))
        out[f"records {name}"] = reader.records(store, span, ("allocated_bytes",), True)
        out[f"peaks {name}"] = reader.peaks(store, span, ("reserved_bytes",))
        out[f"processes {name}"] = reader.process_series(store, span, 100)
        # phase bands from the samples' phase changes, and (past 5 bands) shares per bucket
        for bands in (5, 2000):
            out[f"phases {name} {bands}"] = reader.phase_bands(store, span, bands, [])
    return out


def _assert_edges_within_spans(store: Store) -> None:
    """The span ``edge_span`` decodes for a window's first or last n rows holds them all."""
    times = sorted(s.ts_s for s in store.samples(0))
    did = store.known_device_id(0)
    with store.engine.connect() as c:
        for lo, hi in ((T0, T0 + SPAN_S), (T0 + 700.0, T0 + 1900.0)):
            inside = [t for t in times if lo <= t <= hi]
            for n in (1, 7, 500, 5000):
                first_lo, first_hi = sample_blocks.edge_span(c, did, lo, hi, n, False)
                last_lo, last_hi = sample_blocks.edge_span(c, did, lo, hi, n, True)
                assert first_lo == lo and first_hi >= inside[min(n, len(inside)) - 1]
                assert last_hi == hi and last_lo <= inside[-min(n, len(inside))]


def _store(url: str) -> Store:
    store = Store.open(url, host_name="h")
    store.write(_scripted())
    maintenance.rollup_window(store, math.floor(T0 / 60) * 60, T0 + SPAN_S + 60)
    return store


def _counts(store: Store) -> tuple[int, int]:
    with store.engine.connect() as c:
        return (c.execute(select(func.count()).select_from(samples)).scalar_one(),
                c.execute(select(func.count()).select_from(blocks_table)).scalar_one())


def test_codec_round_trip_keeps_every_value_and_null():
    big, small = (1 << 63) - 1, -(1 << 63)
    n_counters = len(block_codec.COLUMNS) - 6
    rows = [(i * 3 + 1, 1_700_000_000.1 + i / 10, ("idle", "decode", "setup")[i % 3],
             *[None if (i + j) % 4 == 0 else (i * 1000 + j) for j in range(n_counters)],
             None if i % 2 else "agent-a", None if i % 5 == 0 else i,
             big if i % 2 else small)
            for i in range(300)]
    rows.append((10_000, -0.0, "unknown", *[None] * n_counters, None, None, None))
    assert block_codec.decode(block_codec.encode(rows)) == rows
    with pytest.raises(ValueError, match="format 9, expected 1"):
        block_codec.decode(b"\x09")


def test_reads_are_identical_after_compaction_whole_or_half(any_url):
    store = _store(any_url)
    try:
        before = _snapshot(store)
        rows = _counts(store)[0]
        assert rows == 2 * 4800 + 1
        # interrupted: the first half of the intervals moved, the rest still rows
        moved = sample_blocks.compact(store, T0 + SPAN_S / 2, 100)
        assert 0 < moved < rows and _counts(store)[1] > 0
        assert _snapshot(store) == before
        _assert_edges_within_spans(store)
        sample_blocks.compact(store, T0 + SPAN_S + 600.0, 100)
        assert _counts(store)[0] == 0
        # per interval (5 touched, ten minutes each) one block per (source, pid)
        assert _counts(store)[1] == 5 * 3
        after = _snapshot(store)
        for key, value in before.items():
            assert after[key] == value, key
    finally:
        store.close()


def test_a_listing_read_a_chunk_at_a_time_is_the_same_rows(any_url, monkeypatch):
    """export and analyze --db list a device's rows a chunk of time at a time: chunks whose
    ends fall on samples (every 97 s is one at 2 Hz) and inside blocks lose and repeat none."""
    store = _store(any_url)
    try:
        whole, first = store.samples(0), store.samples(0, limit=1000)
        window = store.samples(0, T0 + 590.0, T0 + 1210.0)
        sample_blocks.compact(store, T0 + SPAN_S / 2, 100)  # half: rows in both tables
        monkeypatch.setattr(sample_blocks, "ROWS_CHUNK_S", 97.0)
        assert len(whole) == 2 * 4800 + 1
        assert store.samples(0) == whole
        assert store.samples(0, limit=1000) == first
        assert store.samples(0, T0 + 590.0, T0 + 1210.0) == window
    finally:
        store.close()


def test_export_of_an_imported_trace_is_the_same_after_compaction(any_url, capsys, tmp_path):
    assert main(["import", str(OOM), "--db", any_url]) == 0
    first, second = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    assert main(["export", "--db", any_url, "-o", str(first)]) == 0
    with Store.open(any_url) as store:
        sample_blocks.compact(store, 4e9, 1000)
        assert _counts(store)[0] == 0 and _counts(store)[1] > 0
    assert main(["export", "--db", any_url, "-o", str(second)]) == 0
    assert second.read_text() == first.read_text()
    # imported again after compaction: nothing stored twice (keys are kept in the blocks)
    capsys.readouterr()
    assert main(["import", str(OOM), "--db", any_url]) == 0
    assert "394 samples and 41 events were already there" in capsys.readouterr().out
    with Store.open(any_url) as store:
        assert _counts(store)[0] == 0


def test_retention_compacts_rolled_up_intervals_and_deletes_whole_blocks(any_url):
    store = _store(any_url)
    try:
        clock = FakeClock(T0 + SPAN_S + 1200.0)
        retention = Retention(raw_s=86400.0, rollup_s=90 * 86400.0, step_rows=5000,
                              clock=clock, compact_after_s=600.0)
        for _ in range(40):
            if not retention.step(store).backlog:
                break
        # everything is older than compact_after_s and rolled up: all moved
        assert _counts(store) == (0, 15)
        whole = store.samples(0)
        assert len(whole) == 2 * 4800 + 1
        # later, the blocks that end before the raw cutoff (here 21 min 40 s into the data)
        # go, whole; the block the cutoff falls in stays
        clock.advance(86400.0 - 2300.0)
        retention.step(store)
        cutoff = clock.time_s() - 86400.0
        kept = store.samples(0)
        first_kept_block = math.floor(cutoff / 600.0) * 600.0
        assert kept == [s for s in whole if s.ts_s >= first_kept_block]
        assert 0 < len(kept) < len(whole)
    finally:
        store.close()


def test_every_device_s_span_reads_its_own_blocks_in_one_statement(any_url):
    # device 1 starts 20 minutes after device 0 and device 0 stops 10 minutes before device 1:
    # their first and last compacted intervals differ, and each device's span in the fleet's
    # one statement (the block edges correlated to the device row two subqueries out) is the
    # one time_range reads for it alone
    store = Store.open(any_url, host_name="h")
    try:
        late = [s._replace(device=1, ts_s=s.ts_s + 1200.0) for s in _scripted()
                if s.ts_s >= T0 + 600.0]
        store.write([s for s in _scripted() if s.ts_s < T0 + SPAN_S - 600.0] + late)
        maintenance.rollup_window(store, math.floor(T0 / 60) * 60, T0 + SPAN_S + 1260)
        sample_blocks.compact(store, T0 + SPAN_S + 1260.0, 100)
        rows, blocks = _counts(store)
        assert (rows, blocks) == (1320, 21)  # all but device 1's newest interval compacted
        spans = fleet.device_spans(store)
        alone = {("h", i): store.time_range(i) for i in (0, 1)}
        assert spans == alone
        # from the minute rollup holding the first sample to the newest sample
        assert alone[("h", 0)] == (T0 - 30.25, T0 + SPAN_S - 600.5)
        assert alone[("h", 1)] == (T0 + 1800.0 - 30.25, T0 + SPAN_S + 1199.5)
    finally:
        store.close()
