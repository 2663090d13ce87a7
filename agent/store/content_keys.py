"""Idempotent import: each imported row keyed by its content, so that a file imported twice, or
files that overlap, store no row twice (``vramscope import``; docs/trace-format.md).

The key (``content_key``, migration 0012) is a 64-bit BLAKE2b digest of the row as stored,
unique together with ``ts_s`` (a partial index: the live agent's rows have none). Time comes
first in the index so that a trace, written in time order, adds its keys at the index's end
instead of scattering them. What is already stored is looked up per batch (:func:`_stored`), so
the caller learns which records were new (``import`` runs the alert engine over those alone);
the inserts still say ``ON CONFLICT DO NOTHING`` for a concurrent import.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from hashlib import blake2b
from typing import Any, NamedTuple, TypeVar

import orjson
from sqlalchemy import (
    Boolean,
    ColumnElement,
    Connection,
    Table,
    insert,
    literal_column,
    select,
)
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS, Event, Sample
from vramscope.agent.store import event_blocks, sample_blocks
from vramscope.agent.store.schema import events, samples

R = TypeVar("R")
SAMPLE_ROW = ("device_id", "ts_s", "phase", "source", "pid", *SAMPLE_COUNTER_FIELDS)
# the partial index's condition, which a query must name for the index to serve it
_KEYED: ColumnElement[bool] = literal_column("content_key IS NOT NULL", Boolean)
_PG_TYPES = ("int4", "float8", "text", "text", "int4",
             *["int8"] * len(SAMPLE_COUNTER_FIELDS), "int8")
# PostgreSQL: a batch as one array per column, as the agent writes it (Store._insert_samples_pg)
_PG_SAMPLES_SQL = (
    f"INSERT INTO samples ({', '.join(SAMPLE_ROW)}, content_key) SELECT * FROM unnest("
    + ", ".join(f"%s::{t}[]" for t in _PG_TYPES)
    + ") ON CONFLICT (ts_s, content_key) WHERE content_key IS NOT NULL DO NOTHING")


class NewRecords(NamedTuple):
    """What one batch of an import added: the records that were new, and how many of the
    others were already stored (records of no known device are in neither)."""

    samples: list[Sample]
    events: list[Event]
    samples_there: int
    events_there: int


_DIGEST = struct.Struct(">q")  # 8 bytes as a signed 64-bit integer: BigInteger's range


def content_key(row: Sequence[Any]) -> int:
    """A row's values as a signed 64-bit digest; orjson writes floats in their shortest form,
    so a time read back from a trace gives the same key."""
    key: int = _DIGEST.unpack(blake2b(orjson.dumps(tuple(row)), digest_size=8).digest())[0]
    return key


def digests(rows: list[tuple[Any, ...]]) -> list[int]:
    """:func:`content_key` of each row, inline: this runs once per imported sample."""
    unpack, dumps = _DIGEST.unpack, orjson.dumps
    return [unpack(blake2b(dumps(row), digest_size=8).digest())[0] for row in rows]


class Repeats:
    """The keys of one file's rows: a row's digest, or, for the n-th repeat of a row the file
    holds more than once, the digest of the row and n. A line a file says twice is then two
    rows, and the file imported again still adds none (nor does another file with the same
    repeats). Repeats are counted among consecutive rows of one time, so that what is held
    stays bounded by the rows of one instant, whatever the file's size (identical rows share
    their time; a file out of time order that repeats a row with other times between the
    repeats keeps it once)."""

    def __init__(self) -> None:
        self._ts: float | None = None
        self._counts: dict[int, int] = {}

    def keys(self, times: list[float], digests: list[int]) -> list[int]:
        out = []
        for ts, digest in zip(times, digests):
            if ts != self._ts:
                self._ts = ts
                self._counts.clear()
            n = self._counts.get(digest, 0)
            self._counts[digest] = n + 1
            out.append(digest if n == 0 else content_key((digest, n)))
        return out


class FileRepeats(NamedTuple):
    """A file's :class:`Repeats`, one per table (``Store.write_new``)."""

    samples: Repeats
    events: Repeats

    @classmethod
    def new(cls) -> FileRepeats:
        return cls(Repeats(), Repeats())


def write(c: Connection, dialect: str, sample_batch: tuple[list[Sample], list[tuple[Any, ...]]],
          event_batch: tuple[list[Event], list[dict[str, Any]]],
          repeats: FileRepeats) -> NewRecords:
    """Insert the rows not stored yet. ``sample_batch``: the records and their rows in
    ``SAMPLE_ROW`` order; ``event_batch``: the records and their rows as dicts."""
    rows = sample_batch[1]
    keys = repeats.samples.keys([row[1] for row in rows], digests(rows))
    sample_rows = [(*row, key) for row, key in zip(rows, keys)]
    event_keys = repeats.events.keys([row["ts_s"] for row in event_batch[1]],
                                     digests([tuple(row.values()) for row in event_batch[1]]))
    event_rows = [{**row, "content_key": key} for row, key in zip(event_batch[1], event_keys)]
    new_samples, samples_there = _new_only(c, samples, sample_batch[0], sample_rows, keys)
    new_events, events_there = _new_only(c, events, event_batch[0], event_rows, event_keys)
    if new_samples[1]:
        _insert_samples(c, dialect, new_samples[1])
    if new_events[1]:
        c.execute(_insert_ignore(dialect, events), new_events[1])
    return NewRecords(new_samples[0], new_events[0], samples_there, events_there)


def _new_only(c: Connection, table: Table, records: list[R], rows: list[Any],
              keys: list[int]) -> tuple[tuple[list[R], list[Any]], int]:
    """The records and rows whose key is neither stored nor earlier in ``keys`` (a repeat
    that :class:`Repeats` did not number, in a file out of time order), and how many were
    left out."""
    if not rows:
        return ([], []), 0
    times = [row["ts_s"] if isinstance(row, dict) else row[1] for row in rows]
    seen = _stored(c, table, times, keys)
    if not seen and len(set(keys)) == len(keys):  # a fresh import: every record is new
        return (records, rows), 0
    new_records, new_rows = [], []
    for record, row, key in zip(records, rows, keys):
        if key not in seen:
            seen.add(key)
            new_records.append(record)
            new_rows.append(row)
    return (new_records, new_rows), len(rows) - len(new_rows)


def _stored(c: Connection, table: Table, times: list[float], keys: list[int]) -> set[int]:
    """Which of the keys are stored: nothing to look up when no keyed row lies in the batch's
    span of time (a fresh import's every batch), else each (ts_s, content_key) probed in the
    index, ``_PROBES`` a statement. Reading the whole span instead would read a file's rows of
    one instant again for every batch of it (a file of one repeated line)."""
    keyed = table.c.content_key.is_not(None)  # as the index's WHERE says, so that it serves
    span = table.c.ts_s.between(min(times), max(times))
    # rows already moved into the compact raw tier keep their keys there
    found: set[int] = (sample_blocks.stored_keys(c, times, keys) if table is samples
                       else event_blocks.stored_keys(c, times, keys))
    if c.execute(select(table.c.ts_s).where(keyed, span).limit(1)).first() is None:
        return found
    for i in range(0, len(keys), _PROBES):
        chunk = [v for pair in zip(times[i:i + _PROBES], keys[i:i + _PROBES]) for v in pair]
        sql = _probe_sql(table.name, len(chunk) // 2, c.dialect.paramstyle)
        found.update(c.exec_driver_sql(sql, tuple(chunk)).scalars())
    return found


@functools.lru_cache(maxsize=16)
def _probe_sql(table: str, pairs: int, paramstyle: str) -> str:
    """``pairs`` (ts_s, content_key) pairs ORed, each one seek of the partial index (a
    row-value IN is a scan on SQLite); SQL text, built once per size: SQLAlchemy compiling an
    expression of hundreds of terms for every batch cost more than the look-up."""
    mark = "?" if paramstyle == "qmark" else "%s"
    probes = " OR ".join([f"(ts_s = {mark} AND content_key = {mark})"] * pairs)
    return f"SELECT content_key FROM {table} WHERE content_key IS NOT NULL AND ({probes})"


_PROBES = 500  # (ts_s, key) pairs a statement: far under SQLite's and psycopg's limits


def _insert_samples(c: Connection, dialect: str, rows: list[tuple[Any, ...]]) -> None:
    if dialect == "postgresql":
        c.exec_driver_sql(_PG_SAMPLES_SQL, tuple(list(col) for col in zip(*rows)))
        return
    # plain tuples to the driver's executemany, as the agent's hot path does (Store.write)
    sql = _COMPILED.get(dialect)
    if sql is None:
        stmt = _insert_ignore(dialect, samples).values(
            {k: None for k in (*SAMPLE_ROW, "content_key")})
        sql = _COMPILED[dialect] = str(stmt.compile(dialect=c.dialect))
    c.exec_driver_sql(sql, rows)


_COMPILED: dict[str, str] = {}  # the samples INSERT of a dialect, compiled once


def _insert_ignore(dialect: str, table: Table) -> Any:  # a dialect's INSERT ... DO NOTHING
    """``INSERT`` that skips a row whose (ts_s, content_key) is stored."""
    key = ["ts_s", "content_key"]
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing(index_elements=key, index_where=_KEYED)
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table).on_conflict_do_nothing(index_elements=key,
                                                           index_where=_KEYED)
    return insert(table)  # (the store refuses other databases when it opens)
