"""A seeded, realistic store of days of history, built in SQL: the fixture that makes benchmarks
and tests start old (design rule 8: a week of history must cost what a minute costs).

``generate(store, devices=8, hz=10, days=7)`` writes what an agent watching 8 busy GPUs for a
week at 10 Hz would have left: 48.4 M torch samples (request cycles of prefill, decode and idle;
the allocator, device and KV counters moving with them; one device leaking 1 MiB a minute),
``request_start`` / ``request_end`` events, and the per-minute rollups retention makes. Nothing
goes through Python per row: a recursive CTE counts the ticks and ``INSERT ... SELECT`` writes
them, so the SQLite week takes minutes, not the hours ``Store.write`` would, and the small test
version (2 devices, 1 Hz, 7 days) takes seconds.

Values are closed-form functions of (tick, device, seed) — integer arithmetic only, identical
on SQLite and PostgreSQL — so a test can compute what any row holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import text
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS

if TYPE_CHECKING:
    from vramscope.agent.store.store import Store

T_END = 1_700_604_780.0  # the default end (a minute boundary); the newest sample is 1 tick before
GIB = 2**30
MIB = 2**20
CYCLE = 37  # ticks per request cycle: 3 prefill, 24 decode, 10 idle
LEAKING_DEVICE = 3  # its idle floor rises 1 MiB a minute


@dataclass(frozen=True)
class History:
    devices: int = 8
    hz: float = 10.0
    days: float = 7.0
    end_s: float = T_END
    seed: int = 1
    events: bool = True
    rollups: bool = True

    def __post_init__(self) -> None:
        if self.devices < 1 or self.hz <= 0 or self.days <= 0:
            raise ValueError(f"bad history: devices={self.devices}, hz={self.hz}, "
                             f"days={self.days}")

    @property
    def ticks(self) -> int:
        return int(self.days * 86_400 * self.hz)

    @property
    def start_s(self) -> float:
        return self.end_s - self.ticks / self.hz


def generate(store: Store, history: History | None = None, **kwargs: Any) -> History:
    """Write ``history`` (or ``History(**kwargs)``) into ``store``; returns what was written."""
    h = history or History(**kwargs)
    ids = [store.device_id(d) for d in range(h.devices)]
    host_id = store.host_id()
    with store.engine.begin() as c:
        c.execute(text(_samples_sql(h, ids)))
        if h.events:
            c.execute(text(_events_sql(h, ids)))
        c.execute(text("UPDATE hosts SET first_seen_s = :a, last_seen_s = :b WHERE id = :h"),
                  {"a": h.start_s, "b": h.end_s, "h": host_id})
    if h.rollups:
        roll_up_all(store, h.start_s, h.end_s)
    return h


def _ticks_cte(h: History, ids: list[int]) -> str:
    devices = " UNION ALL ".join(f"SELECT {i} AS dev, {pos} AS d" for pos, i in enumerate(ids))
    return (f"WITH RECURSIVE tick(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM tick "
            f"WHERE n < {h.ticks - 1}), dev(dev, d) AS ({devices}) ")


def _samples_sql(h: History, ids: list[int]) -> str:
    """One torch row per device per tick. ``c`` is the tick's place in its request cycle."""
    c = f"((n + 7 * d) % {CYCLE})"
    noise = f"((CAST(n AS BIGINT) * 2654435761 + {h.seed} * 97 + d * 131) % 1000)"
    busy = f"(CASE WHEN {c} < 27 THEN {c} ELSE 0 END)"
    minutes = f"CAST(n / {int(h.hz * 60)} AS BIGINT)"
    leak = f"(CASE WHEN d = {LEAKING_DEVICE} THEN {minutes} * {MIB} ELSE 0 END)"
    alloc = f"({16 * GIB} + d * {GIB // 4} + {busy} * {64 * MIB} + {noise} * 65536 + {leak})"
    reserved = f"({alloc} + {2 * GIB})"
    values = {
        "allocated_bytes": alloc,
        "reserved_bytes": reserved,
        "active_bytes": f"({alloc} + {noise} * 1024)",
        "inactive_split_bytes": f"({noise} * {MIB // 2})",
        "requested_bytes": f"({alloc} - {noise} * 512)",
        "largest_free_block_bytes": "NULL",
        "num_alloc_retries": f"(n / {int(h.hz * 3600)})",
        "num_ooms": "0",
        "device_used_bytes": f"({reserved} + {3 * GIB // 2})",
        "device_total_bytes": str(141 * GIB),
        "kv_blocks_used": f"({busy} * 120 + {noise} % 50)",
        "kv_blocks_total": "4096",
        "kv_blocks_cached": f"({noise} % 100)",
        "kv_tokens_used": f"({busy} * 1900 + {noise})",
    }
    assert tuple(values) == SAMPLE_COUNTER_FIELDS
    phase = (f"CASE WHEN {c} < 3 THEN 'prefill' WHEN {c} < 27 THEN 'decode' "
             f"ELSE 'idle' END")
    cols = ", ".join(SAMPLE_COUNTER_FIELDS)
    return (_ticks_cte(h, ids)
            + f"INSERT INTO samples (device_id, ts_s, phase, source, pid, {cols}) "
            f"SELECT dev, {_ts(h)}, {phase}, 'torch', 1000 + d, {', '.join(values.values())} "
            f"FROM tick, dev ORDER BY n, dev")


def _ts(h: History) -> str:
    return f"({h.start_s!r} + CAST(n AS DOUBLE PRECISION) / {float(h.hz)!r})"


def _events_sql(h: History, ids: list[int]) -> str:
    """A request starts at each cycle's first tick and ends when decode does."""
    c = f"((n + 7 * d) % {CYCLE})"
    name = f"CASE WHEN {c} = 0 THEN 'request_start' ELSE 'request_end' END"
    rid = f"('r' || d || '-' || ((n + 7 * d) / {CYCLE}))"
    return (_ticks_cte(h, ids)
            + "INSERT INTO events (device_id, ts_s, name, pid, phase, request_id) "
            f"SELECT dev, {_ts(h)}, {name}, 1000 + d, NULL, {rid} "
            f"FROM tick, dev WHERE {c} IN (0, 27) ORDER BY n, dev")


def roll_up_all(store: Store, start_s: float, end_s: float) -> None:
    """The per-minute rollups retention would have made over [start_s, end_s), in SQL: one
    grouped pass per device into a temporary table, the "last" row of each minute fetched by
    its (device, ts) index key, then one row per metric (the rollups table's shape)."""
    lo, hi = (start_s // 60) * 60, -(-end_s // 60) * 60
    cols = SAMPLE_COUNTER_FIELDS
    agg = ", ".join(f"MIN({f}) AS {f}_min, MAX({f}) AS {f}_max, AVG({f}) AS {f}_mean, "
                    f"COUNT({f}) AS {f}_n" for f in cols)
    minute = "CAST(FLOOR(ts_s / 60) AS BIGINT) * 60" if store.dialect == "postgresql" \
        else "CAST(ts_s / 60 AS INTEGER) * 60"
    with store.engine.begin() as c:
        c.execute(text("DROP TABLE IF EXISTS gen_minutes"))
        c.execute(text(
            f"CREATE TEMPORARY TABLE gen_minutes AS SELECT device_id, source, {minute} AS bucket, "
            f"MAX(ts_s) AS last_ts, {agg} FROM samples WHERE ts_s >= {lo!r} AND ts_s < {hi!r} "
            f"GROUP BY device_id, source, {minute}"))
        for f in cols:
            c.execute(text(
                "INSERT INTO rollups (device_id, bucket_s, source, metric, min_value, max_value, "
                "mean_value, last_value, count) "
                f"SELECT m.device_id, m.bucket, m.source, '{f}', m.{f}_min, m.{f}_max, "
                f"m.{f}_mean, (SELECT s.{f} FROM samples s WHERE s.device_id = m.device_id "
                f"AND s.ts_s = m.last_ts AND s.source = m.source AND s.{f} IS NOT NULL "
                f"ORDER BY s.id DESC LIMIT 1), "
                f"m.{f}_n FROM gen_minutes m WHERE m.{f}_n > 0"))
        c.execute(text("DROP TABLE gen_minutes"))
