"""The raw tier's size per device-day of a recorded store, as rows and after compaction.

``python -m tools.bench.raw_tier STORE.db[.gz] OUT.json [POSTGRESQL_URL]``: reads the SQLite
store (a ``.gz`` unpacked) and copies its records (``Store.write``, host by host, every record a
row) into a fresh SQLite store, or with a PostgreSQL URL into that (an empty database). Then,
on the copy: VACUUMs and measures the raw tables with their indexes (``bench dashboard``'s
tiers: samples with ``sample_blocks``, events with ``event_blocks``); rolls the span up,
compacts every closed interval of samples and frequent events into the compact raw tier,
VACUUMs and measures again; and checks that every sample and event reads back the same. Sizes
per device-day are over the span of the recording's raw samples, less what the same tables
take in the empty store (their first pages and empty indexes: a fixed cost, which scaling a
17-minute recording to a day would multiply); the JSON holds them, the empty store's bytes and
their ``vramscope.bench/1`` figures (docs/BENCHMARKS.md's table).
"""

from __future__ import annotations

import gzip
import json
import math
import shutil
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path
from typing import Any

from vramscope.agent.store import Store, event_blocks, maintenance, sample_blocks

from tools.bench import Figure
from tools.bench.dashboard import _tier_bytes

DAY_S = 86_400.0
BATCH = 5_000  # records a write while copying into PostgreSQL


def _vacuum(store: Store) -> None:
    store.engine.dispose()
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        if store.dialect == "sqlite":
            c.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            c.exec_driver_sql("VACUUM")
        else:
            c.exec_driver_sql("VACUUM FULL")


def _records(store: Store, hosts: list[str]) -> tuple[list[Any], list[Any]]:
    out: tuple[list[Any], list[Any]] = ([], [])
    for h in hosts:
        out[0].extend(store.iter_samples(host=h))
        out[1].extend(store.iter_events(host=h))
    return out


def _copy(records: tuple[list[Any], list[Any]], target: Store) -> Store:
    for part in (0, 1):
        it = iter(records[part])
        while batch := list(islice(it, BATCH)):
            target.write(batch if part == 0 else (), batch if part == 1 else ())
    return target


def measure(path: Path, postgresql_url: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "store.db"
        if path.suffix == ".gz":
            with gzip.open(path) as src, db.open("wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            shutil.copy(path, db)
        store = Store.open(f"sqlite:///{db}")
        hosts = [h["name"] for h in store.hosts()]
        # into a fresh store, every record a row: a recording whose agent compacted closed
        # intervals as it ran would otherwise measure its rows half compacted
        recorded = _records(store, hosts)
        store.close()
        store = Store.open(postgresql_url or f"sqlite:///{Path(tmp) / 'rows.db'}")
        _vacuum(store)
        empty = _tier_bytes(store)
        store = _copy(recorded, store)
        devices = sum(len(store.devices(h)) for h in hosts)
        spans = [s for h in hosts if (s := store.time_range(host=h)) is not None]
        lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
        days = devices * (hi - lo) / DAY_S
        before_reads = _records(store, hosts)
        _vacuum(store)
        rows = _tier_bytes(store)
        maintenance.rollup_window(store, math.floor(lo / 60) * 60, math.ceil(hi / 60) * 60 + 60)
        cpu = time.process_time()
        moved_samples = sample_blocks.compact(store, math.inf, 1_000_000)
        moved_events = 0
        while due := event_blocks.due_sets(store, math.inf, 1000):
            moved_events += sum(event_blocks.compact_interval(store, did, s) for s, did in due)
        cpu = time.process_time() - cpu
        same = _records(store, hosts) == before_reads
        _vacuum(store)
        blocks = _tier_bytes(store)
        dialect = store.dialect
        store.close()
    raw = ("raw samples and their indexes", "events")

    def per_day(sizes: dict[str, int]) -> dict[str, float]:
        return {t: round((sizes[t] - empty[t]) / days / 1e6, 2) for t in raw}

    return {
        "recording": str(path), "dialect": dialect, "devices": devices,
        "span_s": round(hi - lo, 1), "samples": len(before_reads[0]),
        "events": len(before_reads[1]),
        "moved": {"samples": moved_samples, "events": moved_events},
        "compaction_cpu_s": round(cpu, 2), "reads_same_after_compaction": same,
        "empty_store_bytes": {t: empty[t] for t in raw},
        "rows_bytes": {t: rows[t] for t in raw}, "compacted_bytes": {t: blocks[t] for t in raw},
        "rows_mb_per_device_day": per_day(rows),
        "compacted_mb_per_device_day": per_day(blocks),
        "raw_tier_mb_per_device_day": {
            "rows": round(sum(rows[t] - empty[t] for t in raw) / days / 1e6, 1),
            "compacted": round(sum(blocks[t] - empty[t] for t in raw) / days / 1e6, 1)},
        "target_mb_per_device_day": 100,
    }


def figures(result: dict[str, Any]) -> list[Figure]:
    """The measurement as ``vramscope.bench/1`` figures (docs/BENCHMARKS.md renders them)."""
    name = "/".join(Path(result["recording"]).parts[-3:-1])  # e.g. 2026-12-07/live
    compacted, rows = (result["raw_tier_mb_per_device_day"][k] for k in ("compacted", "rows"))
    parts = result["compacted_mb_per_device_day"]
    spread = (f"{result['samples']} samples, {result['events']} events over "
              f"{result['span_s']:.0f} s of {result['devices']} device(s); samples "
              f"{parts['raw samples and their indexes']}, events {parts['events']}; every record "
              f"a row: {rows} ({rows / compacted:.1f}x); reads the same after compaction: "
              f"{result['reads_same_after_compaction']}")
    metric = f"raw tier of a real recording ({name}), compacted, MB per device-day"
    target = result["target_mb_per_device_day"]
    return [Figure("dashboard", metric, compacted, "MB", spread, target=f"<= {target}",
                   met=compacted <= result["target_mb_per_device_day"] and
                   result["reads_same_after_compaction"])]


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: python -m tools.bench.raw_tier STORE.db[.gz] OUT.json [POSTGRESQL_URL]",
              file=sys.stderr)
        return 2
    result = measure(Path(argv[0]), argv[2] if len(argv) == 3 else None)
    result = {"format": "vramscope.bench/1",
              "figures": [f.to_json() for f in figures(result)], **result}
    Path(argv[1]).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
