"""The raw tier's size per device-day of a recorded store, as rows and after compaction.

``python -m tools.bench.raw_tier STORE.db[.gz] OUT.json``: copies the SQLite store (a
``.gz`` unpacked), opens it (upgrading its schema), VACUUMs it and measures each raw table
with its indexes (SQLite's ``dbstat``); then rolls its span up, compacts every closed interval
of samples and frequent events into the compact raw tier (``sample_blocks``,
``event_blocks``), VACUUMs and measures again; and checks that every event and sample reads
back the same. Sizes per device-day are over the span of the recording's raw samples.
"""

from __future__ import annotations

import gzip
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vramscope.agent.store import Store, event_blocks, maintenance, sample_blocks

DAY_S = 86_400.0
RAW_TABLES = ("samples", "sample_blocks", "events", "event_blocks")


def _table_bytes(store: Store) -> dict[str, int]:
    with store.engine.connect() as c:
        got = dict(c.exec_driver_sql(
            "SELECT m.tbl_name, sum(d.pgsize) FROM dbstat d JOIN sqlite_schema m "
            "ON m.name = d.name GROUP BY m.tbl_name").all())
    return {t: int(got.get(t) or 0) for t in RAW_TABLES}


def _vacuum(store: Store) -> None:
    store.engine.dispose()
    with store.engine.connect() as c:
        c.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        c.exec_driver_sql("VACUUM")



def measure(path: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "store.db"
        if path.suffix == ".gz":
            with gzip.open(path) as src, db.open("wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            shutil.copy(path, db)
        store = Store.open(f"sqlite:///{db}")
        hosts = [h["name"] for h in store.hosts()]
        devices = sum(len(store.devices(h)) for h in hosts)
        spans = [s for h in hosts if (s := store.time_range(host=h)) is not None]
        lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
        days = devices * (hi - lo) / DAY_S

        def reads() -> tuple[list[Any], list[Any]]:
            out: tuple[list[Any], list[Any]] = ([], [])
            for h in hosts:
                out[0].extend(store.iter_samples(host=h))
                out[1].extend(store.iter_events(host=h))
            return out

        before_reads = reads()
        _vacuum(store)
        rows = _table_bytes(store)
        start = math.floor(lo / 60) * 60
        maintenance.rollup_window(store, start, math.ceil(hi / 60) * 60 + 60)
        cpu = time.process_time()
        moved_samples = sample_blocks.compact(store, math.inf, 1_000_000)
        moved_events = 0
        while due := event_blocks.due_sets(store, math.inf, 1000):
            moved_events += sum(event_blocks.compact_interval(store, did, s) for s, did in due)
        cpu = time.process_time() - cpu
        same = reads() == before_reads
        _vacuum(store)
        blocks = _table_bytes(store)
        store.close()

    def per_day(sizes: dict[str, int]) -> dict[str, float]:
        return {t: round(n / days / 1e6, 2) for t, n in sizes.items()}

    return {
        "recording": str(path), "devices": devices, "span_s": round(hi - lo, 1),
        "samples": len(before_reads[0]), "events": len(before_reads[1]),
        "moved": {"samples": moved_samples, "events": moved_events},
        "compaction_cpu_s": round(cpu, 2), "reads_same_after_compaction": same,
        "rows_bytes": rows, "compacted_bytes": blocks,
        "rows_mb_per_device_day": per_day(rows),
        "compacted_mb_per_device_day": per_day(blocks),
        "raw_tier_mb_per_device_day": {"rows": round(sum(rows.values()) / days / 1e6, 1),
                                       "compacted": round(sum(blocks.values()) / days / 1e6,
                                                          1)},
        "target_mb_per_device_day": 100,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m tools.bench.raw_tier STORE.db[.gz] OUT.json", file=sys.stderr)
        return 2
    result = measure(Path(argv[0]))
    Path(argv[1]).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
