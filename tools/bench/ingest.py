"""``vramscope bench ingest``: the store's write rate against raw ``sqlite3.executemany``.

Both write the same rows into the same schema (created by our migrations), in the same batch
size, each into a fresh SQLite file with the same pragmas; rounds alternate so machine noise
hits both alike. Targets: >= 100k samples/s and >= 0.5 of the raw rate.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import tempfile
from collections.abc import Callable

from vramscope.agent.records import SAMPLE_COUNTER_FIELDS, Phase, Sample

from tools.bench import BenchOptions, Figure, interleaved

BATCH_ROWS = 2000  # the agent writer's default batch


def make_samples(n: int, devices: int = 8) -> list[Sample]:
    phases = (Phase.PREFILL, Phase.DECODE, Phase.IDLE)
    return [Sample(1_700_000_000.0 + i * 0.0125, i % devices, phases[i % 3], "torch", 4242,
                   allocated_bytes=30 << 30 | i, reserved_bytes=40 << 30, active_bytes=30 << 30,
                   inactive_split_bytes=(i % 97) << 20, requested_bytes=30 << 30,
                   num_alloc_retries=i // 1000, num_ooms=0, device_total_bytes=141 << 30)
            for i in range(n)]


def _store_writer(rows: list[Sample], workdir: str) -> Callable[[], None]:
    from vramscope.agent.store import Store

    def write() -> None:
        path = os.path.join(workdir, f"store-{os.urandom(4).hex()}.db")
        with Store.open(f"sqlite:///{path}") as store:
            store.device_id(0)  # schema and identity are set-up, not ingest
            for i in range(0, len(rows), BATCH_ROWS):
                store.write(rows[i:i + BATCH_ROWS], ())
    return write


def _raw_writer(rows: list[Sample], workdir: str, template: str) -> Callable[[], None]:
    cols = ("device_id", "ts_s", "phase", "source", "pid", *SAMPLE_COUNTER_FIELDS)
    sql = f"INSERT INTO samples ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
    tuples = [(1, s.ts_s, s.phase.value, s.source, s.pid, *s[5:5 + len(SAMPLE_COUNTER_FIELDS)])
              for s in rows]  # prepared outside the timing: the raw side gets every advantage

    def write() -> None:
        path = os.path.join(workdir, f"raw-{os.urandom(4).hex()}.db")
        conn = sqlite3.connect(path)
        conn.executescript(template)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("INSERT INTO hosts (id, name, first_seen_s, last_seen_s) VALUES (1,'h',0,0)")
        conn.execute("INSERT INTO devices (id, host_id, device_index) VALUES (1, 1, 0)")
        conn.commit()
        for i in range(0, len(tuples), BATCH_ROWS):
            with conn:
                conn.executemany(sql, tuples[i:i + BATCH_ROWS])
        conn.close()
    return write


def _schema_sql(workdir: str) -> str:
    from vramscope.agent.store import Store

    path = os.path.join(workdir, "template.db")
    Store.open(f"sqlite:///{path}").close()
    conn = sqlite3.connect(path)
    ddl = [r[0] for r in conn.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL")]
    conn.close()
    return ";\n".join(ddl) + ";"


def run(options: BenchOptions) -> list[Figure]:
    n = 20_000 if options.quick else 200_000
    rounds = 3 if options.quick else 5
    rows = make_samples(n)
    with tempfile.TemporaryDirectory(prefix="vramscope-bench-") as workdir:
        template = _schema_sql(workdir)
        store_t, raw_t = interleaved([_store_writer(rows, workdir),
                                      _raw_writer(rows, workdir, template)], rounds)
    store_rate = n / store_t.median_s
    raw_rate = n / raw_t.median_s
    ratios = [r / s for s, r in zip(store_t.samples_s, raw_t.samples_s)]
    return [
        Figure("ingest", "store samples/s (SQLite, batches of 2000)", store_rate, "samples/s",
               spread=_rate_spread(n, store_t.samples_s), target=">= 100000",
               met=store_rate >= 100_000),
        Figure("ingest", "raw sqlite3.executemany samples/s", raw_rate, "samples/s",
               spread=_rate_spread(n, raw_t.samples_s), baseline="(the baseline)"),
        Figure("ingest", "store / raw rate", store_rate / raw_rate, "ratio",
               spread=f"per-round min {min(ratios):.3f} / max {max(ratios):.3f}",
               baseline="raw sqlite3.executemany, same rows, same run", target=">= 0.5",
               met=store_rate / raw_rate >= 0.5),
    ]


def _rate_spread(n: int, times: list[float]) -> str:
    rates = [n / t for t in times]
    return (f"median of {len(rates)}; min {min(rates):.0f} / max {max(rates):.0f}; "
            f"stdev {statistics.pstdev(rates):.0f}")
