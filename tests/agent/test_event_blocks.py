"""The compact raw tier's events (agent/store/event_blocks.py): closed intervals of frequent
events moved into blocks of compressed columns and read back exactly as before, on SQLite and
a real PostgreSQL: every event reader answers the same after compaction (whole or half done),
an export of an imported trace is the same records, an import repeated after compaction
stores nothing twice, and retention compacts and deletes whole blocks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from sqlalchemy import func, select
from vramscope.agent.cli import main
from vramscope.agent.clock import FakeClock
from vramscope.agent.records import Event, Phase, Sample
from vramscope.agent.retention import Retention
from vramscope.agent.store import Store, block_codec, event_blocks, maintenance, reader, store
from vramscope.agent.store import fleet_events as fleet_reads
from vramscope.agent.store.reader import Span
from vramscope.agent.store.schema import event_blocks as blocks_table
from vramscope.agent.store.schema import events

DATA = Path(__file__).resolve().parents[1] / "data"
OOM = DATA / "gpu_oom.jsonl"
T0 = 1_700_000_130.25  # not on a block's boundary: the first and last blocks are partial
SPAN_S = 40 * 60.0


def _scripted() -> list[Event]:
    """40 minutes of two servers (pids 11 and 12): a request every 2 s each (start, KV
    allocation, end two seconds on, KV free), a phase change every 5 s with the hooks' data,
    a client's own name, and the kept events (an OOM, a server load) among them."""
    out = []
    for i in range(int(SPAN_S / 2)):
        ts = T0 + i * 2.0
        pid = 11 if i % 2 else 12
        rid = f"r{i}"
        out += [Event(ts, "request_start", 0, pid, Phase.PREFILL, rid),
                Event(ts + 0.000125, "kv_alloc", 0, pid, Phase.PREFILL, rid,
                      {"blocks": i % 13, "hit_tokens": 0}),
                Event(ts + 2.0, "request_end", 0, pid, Phase.DECODE, rid),
                Event(ts + 2.0, "kv_free", 0, pid, Phase.DECODE, rid,
                      {"blocks_cached": i % 7, "blocks_released": 1})]
    for i in range(int(SPAN_S / 5)):
        out.append(Event(T0 + i * 5.0 + 0.3, "phase", 0, 11, (Phase.DECODE, Phase.IDLE)[i % 2],
                         None, {"ended_phase": "prefill", "ended_duration_s": 0.004 + i / 1e6,
                                "ended_steps": i % 5, "ended_peak_exact": i % 3 == 0,
                                "ended_peak_allocated_bytes": (1 << 30) + i * 4096}))
    out += [Event(T0 + 700.0, "my_own_event", 0, None, None, None, {"note": "x", "n": [1, 2]}),
            Event(T0 + 701.0, "my_own_event", 0, None, None, None, None),
            Event(T0 + 900.0, "oom", 0, 11, Phase.DECODE, None, {"requested_bytes": 1 << 30}),
            Event(T0 + 905.0, "server_load", 0, 11, None, None, {"running": 3, "waiting": 1})]
    return out


def _snapshot(store: Store) -> dict[str, object]:
    """Every read of the device's events, as the store and the reader answer them."""
    end = T0 + SPAN_S + 10.0
    names = ("request_start", "request_end")
    out: dict[str, object] = {
        "events": store.events(0),
        "iter": list(store.iter_events(0)),
        "iter_window": list(store.iter_events(0, T0 + 590.0, T0 + 1810.0)),
        "window": store.events(0, T0 + 590.0, T0 + 1210.0),
        "requests": store.events(0, names=names),
        "requests_limit": store.events(0, T0 + 300.0, end, names=names, limit=77),
        "kept": store.events(0, names=("oom", "server_load")),
        "own": store.events(0, names=("my_own_event",)),
        "all_devices": store.events(None, T0 + 1000.0, T0 + 1100.0),
        "fleet": fleet_reads.device_events(store, T0, end, ("phase", "oom")),
        "fleet_counts": fleet_reads.event_counts(store, T0 + 100.0, end, "request_start", 50),
    }
    for name, (lo, hi) in {"all": (T0 - 60.0, end + 60.0), "15m": (T0 + 600.0, T0 + 1500.0),
                           "1m": (T0 + 1201.0, T0 + 1261.0)}.items():
        span = Span(0, lo, hi)
        out[f"timeline {name}"] = reader.timeline(store, span, 400, ("allocated_bytes",))
        out[f"count {name}"] = reader.count_events(store, span, names, 10_000)
        out[f"count capped {name}"] = reader.count_events(store, span, names, 20)
        out[f"rate {name}"] = reader.requests(store, span, 60.0)
    return out


def _store(url: str) -> Store:
    s = Store.open(url, host_name="h")
    # samples past the events' end: retention rolls up (and counts) their last interval
    s.write([Sample(T0 + i, 0, Phase.DECODE, "torch", 11, allocated_bytes=i)
             for i in range(0, int(SPAN_S) + 900, 10)], _scripted())
    return s


def _counts(s: Store) -> tuple[int, int]:
    with s.engine.connect() as c:
        return (c.execute(select(func.count()).select_from(events)).scalar_one(),
                c.execute(select(func.count()).select_from(blocks_table)).scalar_one())


def _compact_events(s: Store, closed_by_s: float) -> int:
    moved = 0
    while due := event_blocks.due_sets(s, closed_by_s, 100):
        moved += sum(event_blocks.compact_interval(s, did, start) for start, did in due)
    return moved


def test_codec_gives_back_every_value_and_the_very_data_text():
    texts = [json.dumps({"blocks": 3, "hit_tokens": 0}, sort_keys=True),
             json.dumps({"d": 0.004123, "big": (1 << 63) - 1, "exact": True, "s": "a"},
                        sort_keys=True),
             json.dumps({"f": 1 / 3, "neg": -0.0, "huge": 1 << 70, "n": None}, sort_keys=True),
             '{"b": 1, "a": 2}',  # not as the store writes it: kept whole
             "{}", "not json", "[1, 2]", None]
    rows = [(i + 1, 1_700_000_000.0 + i / 7, ("request_start", "phase", "x")[i % 3],
             (None, "decode")[i % 2], None if i % 4 == 0 else f"r{i // 2}",
             None if i % 2 else "agent-a", None if i % 5 == 0 else i,
             None if i % 3 else (1 << 62) + i, texts[i % len(texts)])
            for i in range(700)]  # past 256 request ids: their numbers as integers
    cols = event_blocks.decode(event_blocks.encode(rows))
    back = list(zip(*(cols[n] for n in ("id", "ts_s", "name", "phase", "request_id", "origin",
                                        "seq", "content_key", "data"))))
    assert back == rows
    # request ids that are not all a text and a number: a dictionary, codes as integers
    rows = [(*r[:4], f"req-{r[0]:04d}" if r[0] % 2 else str(r[0]), *r[5:]) for r in rows]
    cols = event_blocks.decode(event_blocks.encode(rows))
    assert list(cols["request_id"]) == [r[4] for r in rows]
    with pytest.raises(ValueError, match="format 9, expected 1 or 2"):
        block_codec.decode_table(b"\x09", block_codec.sample_kind)


def test_reads_are_identical_after_compaction_whole_or_half(any_url, monkeypatch):
    monkeypatch.setattr(store, "EVENTS_CHUNK_S", 97.0)  # chunk ends on events and in blocks
    s = _store(any_url)
    try:
        before = _snapshot(s)
        rows = _counts(s)[0]
        assert rows == 4 * 1200 + 480 + 4
        # interrupted: the first half of the intervals moved, the rest still rows
        moved = _compact_events(s, T0 + SPAN_S / 2)
        assert 0 < moved < rows and _counts(s)[1] > 0
        assert _snapshot(s) == before
        _compact_events(s, T0 + SPAN_S + 600.0)
        # the kept events (an OOM, a server load) stay rows
        assert _counts(s)[0] == 2
        # per interval (5 touched) one block per pid (11, 12), and the own name's (no pid)
        assert _counts(s)[1] == 5 * 2 + 1
        after = _snapshot(s)
        for key, value in before.items():
            assert after[key] == value, key
    finally:
        s.close()


def _export(url: str, path: Path) -> str:
    assert main(["export", "--db", url, "-o", str(path)]) == 0
    return path.read_text()


def test_export_of_an_imported_trace_is_the_same_after_compaction(any_url, capsys, tmp_path):
    """An export of an imported trace is the same records once its events are blocks; the
    trace imported again stores nothing twice (the blocks keep each event's content key)."""
    assert main(["import", str(OOM), "--db", any_url]) == 0
    exported = _export(any_url, tmp_path / "before.jsonl")
    with Store.open(any_url) as s:
        moved = _compact_events(s, 4e9)
        kept, blocks = _counts(s)
    assert (moved, kept, blocks) == (41 - kept, kept, 1) and moved > 30
    assert _export(any_url, tmp_path / "after.jsonl") == exported
    capsys.readouterr()
    assert main(["import", str(OOM), "--db", any_url]) == 0
    assert "394 samples and 41 events were already there" in capsys.readouterr().out


def test_retention_compacts_counted_intervals_and_deletes_whole_blocks(any_url):
    s, clock = _store(any_url), FakeClock(T0 + SPAN_S + 1200.0)
    retention = Retention(raw_s=86400.0, rollup_s=90 * 86400.0, step_rows=5000, clock=clock)
    whole = s.events(0)
    try:
        # twenty minutes on: every interval closed (compact_after_s, 600 s by default),
        # rolled up and counted; 60 steps, the last ones with nothing left to do
        steps = [retention.step(s).backlog for _ in range(60)]
        assert steps[-1] is False
        assert _counts(s) == (2, 11)
        assert s.events(0) == whole
        # a late minute counted again after its events moved: the same counts
        with s.engine.begin() as c:
            minute = math.floor((T0 + 600.0) / 60) * 60
            counted = maintenance.event_counts.c
            before = c.execute(select(counted.name, counted.count)
                               .where(counted.minute_s == minute)).all()
        maintenance.rollup_window(s, minute, minute + 60.0)
        with s.engine.connect() as c:
            assert c.execute(select(counted.name, counted.count)
                             .where(counted.minute_s == minute)).all() == before
        assert sorted(before) == [("kv_alloc", 30), ("kv_free", 30), ("phase", 12),
                                  ("request_end", 30), ("request_start", 30)]
        # a day on: the blocks that end before the raw cutoff go whole
        clock.advance(86400.0 - 2300.0)
        retention.step(s)
        first_kept_block = math.floor((clock.time_s() - 86400.0) / 600.0) * 600.0
        kept = s.events(0)
        assert kept == [e for e in whole if e.ts_s >= first_kept_block
                        or e.name in ("oom", "server_load")]
        assert 0 < len(kept) < len(whole)
    finally:
        s.close()
