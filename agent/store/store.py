"""The store: the only place that talks SQL (docs/architecture.md rule 3).

SQLAlchemy 2 Core with batched ``executemany`` on the hot write path; SQLite by default or
PostgreSQL by URL; opening upgrades an older schema and refuses a newer one. Records in, records
out (``Sample`` / ``Event`` / ``PostMortem``), devices addressed by ``(host, index)``
(``host=None``: this store's own host). A record joins its device by ``device_uuid`` when it has
one (rule 6) and by index only otherwise; one whose UUID names no device of its host while its
index is another device's is counted in ``unjoined_total`` and not written (docs/agent.md).
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from operator import itemgetter
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    CursorResult,
    Select,
    Table,
    and_,
    create_engine,
    event,
    func,
    insert,
    literal,
    select,
    union_all,
    update,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DatabaseError, IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.sql.expression import Executable
from vramscope.agent.database_url import database_driver_problem, database_url_problem
from vramscope.agent.durations import MINUTE_S
from vramscope.agent.errors import StoreError
from vramscope.agent.records import (
    INT32_MAX,
    INT64_MAX,
    RANK_EVENT,
    SAMPLE_COUNTER_FIELDS,
    Event,
    Phase,
    PostMortem,
    Sample,
    uuid_candidates,
)
from vramscope.agent.settings import INTEGRITY_MAX_CPU_PERCENT
from vramscope.agent.store import content_keys, event_blocks, migrate, sample_blocks
from vramscope.agent.store.exists import sqlite_file
from vramscope.agent.store.read_once import once
from vramscope.agent.store.schema import (
    agent_stats,
    alerts,
    devices,
    events,
    hosts,
    postmortems,
    processes,
    rollups,
    samples,
    seconds,
)
from vramscope.agent.store.seconds import PhaseSeconds, Second, unpack_phases


def integrity_wait_s(every_s: float, cpu_s: float, max_cpu_percent: float) -> float:
    """Seconds from one integrity check to the next: ``every_s``, or longer when a check of
    ``cpu_s`` CPU seconds that often would take more than ``max_cpu_percent`` of a core."""
    return max(every_s, 100.0 * cpu_s / max_cpu_percent)


_COUNTERS_START = 5  # index of the first counter in a Sample tuple
_COUNTERS_END = _COUNTERS_START + len(SAMPLE_COUNTER_FIELDS)
_ROW_ORDER = ("device_id", "ts_s", "phase", "source", "pid", *SAMPLE_COUNTER_FIELDS)
_PHASE_OF = {p.value: p for p in Phase}  # a stored phase to its Phase (an unknown one: None)
# PostgreSQL: a batch of samples as one array per column (Store._insert_samples_pg); the
# conflict target is the partitioned table's (origin, seq, ts_s) key (0006)
_PG_SAMPLES_SQL = (
    f"INSERT INTO samples ({', '.join(_ROW_ORDER)}, origin, seq) SELECT * FROM unnest("
    + ", ".join(f"%s::{t}[]" for t in ("int4", "float8", "text", "text", "int4",
                                       *["int8"] * len(SAMPLE_COUNTER_FIELDS), "text", "int8"))
    + ") ON CONFLICT (origin, seq, ts_s) DO NOTHING")
# a read of events that the compact raw tier holds some of is made this much time at a time
# (Store.iter_events): an hour of a busy server's requests in memory, not a day's
EVENTS_CHUNK_S = 3_600.0
log = logging.getLogger("vramscope.store")


class Store:
    """A connection pool to one database, plus the few queries vramscope needs."""

    def __init__(self, engine: Engine, host_name: str | None = None) -> None:
        self.engine = engine
        self.host_name = host_name or socket.gethostname()
        self._host_ids: dict[str, int] = {}
        self._device_ids: dict[tuple[str, int], int] = {}
        self._uuid_ids: dict[tuple[str, str], int] = {}
        self._unjoined: set[tuple[str, str]] = set()  # (host, uuid) already logged
        self.unjoined_total = 0  # records not written: their UUID named no device of the host
        self._sample_sql: str | None = None  # compiled once, see _insert_samples

    # --- opening --------------------------------------------------------------------------
    @classmethod
    def open(cls, url: str, *, synchronous: str = "NORMAL", host_name: str | None = None,
             upgrade: bool = True) -> Store:
        """Open (creating a SQLite file's directory), then upgrade or refuse the schema."""
        engine = _make_engine(url, synchronous)
        store = cls(engine, host_name)
        if upgrade:
            store.ensure_schema()
        return store

    @classmethod
    def from_config(cls, config: Mapping[str, Any], url: str | None = None, *,
                    upgrade: bool = True) -> Store:
        """:meth:`open` ``url`` (default: ``database.url``) with the config's ``synchronous``
        and host name."""
        return cls.open(url or config["database.url"], synchronous=config["database.synchronous"],
                        host_name=config["agent.host_name"] or None, upgrade=upgrade)

    def ensure_schema(self, on_migrated: migrate.OnMigrated | None = None) -> None:
        """Upgrade an older schema; refuse a newer one, a damaged file and tables without a
        revision. Never writes over what it does not recognise. ``on_migrated`` is told of
        each revision applied."""
        try:
            current = migrate.current_revision(self.engine)
            tables = [t for t in self._table_names() if t != "alembic_version"] \
                if current is None else []
        except OperationalError as exc:
            raise StoreError(f"cannot open database {self.safe_url}: {exc.orig}") from None
        except DatabaseError as exc:  # SQLite: not a database at all, or damaged
            raise StoreError(self._damaged(exc)) from None
        if current is not None and current not in migrate.known_revisions():
            raise StoreError(
                f"database {self.safe_url} has schema revision {current}, newer than this "
                f"vramscope knows (head {migrate.head_revision()}); upgrade vramscope")
        if current is None and tables:
            raise StoreError(
                f"database {self.safe_url} has tables ({', '.join(sorted(tables)[:5])}) but no "
                f"alembic_version, so its schema revision is unknown; vramscope will not write "
                f"over it. Use another database, or, if this is a vramscope database whose "
                f"revision was lost, record it with `vramscope db stamp head` and then run "
                f"`vramscope db upgrade`")
        if current != migrate.head_revision():
            try:
                migrate.upgrade(self.engine, on_migrated=on_migrated)
            except DatabaseError as exc:
                raise StoreError(self._damaged(exc)) from None

    def _table_names(self) -> list[str]:
        from sqlalchemy import inspect

        return inspect(self.engine).get_table_names()

    def _damaged(self, exc: Exception) -> str:
        path = sqlite_file(self.engine.url)
        if path is None:
            return f"cannot open database {self.safe_url}: {_reason(exc)}"
        return (f"database file {path} is not a usable SQLite database ({_reason(exc)}); "
                f"vramscope will not write over it. Check it with `sqlite3 {path} 'PRAGMA "
                f"integrity_check'`, then move it aside (`mv {path} {path}.broken`) to start "
                f"a new one, or restore a backup")

    def ping(self) -> None:
        """One cheap query that proves the database answers and has its main table (raises
        otherwise): one row of ``samples``, whatever its size."""
        with self.engine.connect() as c:
            c.execute(select(samples.c.id).limit(1)).all()

    def check_integrity(self) -> str | None:
        """None when the database looks sound, else what is wrong. SQLite: ``PRAGMA
        quick_check`` (reads every page once, O(size); seconds per GB, so run it on a
        schedule, not per request); other databases check themselves: None."""
        path = sqlite_file(self.engine.url)
        if path is None:
            return None
        import sqlite3

        # A connection of its own: a pooled one keeps pages cached and would not see damage
        # done to the file under it.
        try:
            conn = sqlite3.connect(path, timeout=5)
            try:
                rows = [str(r[0]) for r in conn.execute("PRAGMA quick_check(3)")]
            finally:
                conn.close()
        except sqlite3.Error as exc:
            return str(exc)
        return None if rows == ["ok"] else "; ".join(rows)[:500]

    def timed_integrity_check(self) -> tuple[str | None, float]:
        """``check_integrity()`` and the CPU seconds it took this thread (what decides when the
        next check may run: ``integrity_wait_s``)."""
        import time

        cpu0 = time.thread_time()
        problem = self.check_integrity()
        return problem, time.thread_time() - cpu0

    def integrity(self, max_age_s: float = 600.0,
                  max_cpu_percent: float = INTEGRITY_MAX_CPU_PERCENT) -> str | None:
        """``check_integrity()``, run at most once per ``max_age_s`` and no more often than
        keeps it under ``max_cpu_percent`` of a core (for /healthz: a probe polls it, and
        the check of a week-old file takes seconds)."""
        import time

        now = time.monotonic()
        last = getattr(self, "_integrity", None)
        if last is None or now >= last[0]:
            problem, cpu_s = self.timed_integrity_check()
            self._integrity = last = (now + integrity_wait_s(max_age_s, cpu_s, max_cpu_percent),
                                      problem)
        return last[1]

    @property
    def safe_url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- identity ------------------------------------------------------------------------
    def host_id(self, host: str | None = None, conn: Connection | None = None,
                ts_s: float = 0.0) -> int:
        name = host or self.host_name
        cached = self._host_ids.get(name)
        if cached is not None:
            return cached
        with _maybe_begin(self.engine, conn) as c:
            row_id = _id_or_insert(c, hosts, hosts.c.name == name,
                                   {"name": name, "first_seen_s": ts_s, "last_seen_s": ts_s})
        self._host_ids[name] = row_id
        return row_id

    def device_id(self, index: int, host: str | None = None,
                  conn: Connection | None = None) -> int:
        key = (host or self.host_name, index)
        cached = self._device_ids.get(key)
        if cached is not None:
            return cached
        with _maybe_begin(self.engine, conn) as c:
            hid = self.host_id(key[0], c)
            row_id = _id_or_insert(c, devices, and_(devices.c.host_id == hid,
                                                    devices.c.device_index == index),
                                   {"host_id": hid, "device_index": index})
        self._device_ids[key] = row_id
        return row_id

    def known_device_id(self, index: int, host: str | None = None) -> int | None:
        """The row id of device ``index`` of ``host`` (default: this host) if it is stored, else
        None; never creates one. Found ids are kept (device rows are never deleted or
        renumbered): a dashboard request looked its device up in every part it read, a
        statement each (16 of the capacity page's 73 on PostgreSQL)."""
        key = (host or self.host_name, index)
        found = self._device_ids.get(key)
        if found is None:
            q = (select(devices.c.id).join(hosts, hosts.c.id == devices.c.host_id)
                 .where(hosts.c.name == key[0], devices.c.device_index == index))
            with self.engine.connect() as c:
                found = c.execute(q).scalar()
            if found is not None:
                self._device_ids[key] = found
        return found

    def set_boot_id(self, boot_id: str, host: str | None = None) -> None:
        """Record the host's current boot id (from ``/proc/sys/kernel/random/boot_id``)."""
        with self.engine.begin() as c:
            hid = self.host_id(host, c)
            c.execute(update(hosts).where(hosts.c.id == hid).values(boot_id=boot_id))

    def describe_device(self, index: int, *, uuid: str | None = None, name: str | None = None,
                        total_bytes: int | None = None, host: str | None = None,
                        parent_uuid: str | None = None,
                        physical_index: int | None = None) -> None:
        """Record a device's UUID, name and total memory (from NVML) under ``index``.

        The UUID's row keeps its samples when the index moved (a reboot renumbered the GPUs, or
        a hook client named the device before NVML did): the row takes ``index``, and another
        row that held it is retired to the label ``-id``, its history intact under that label.
        """
        values = {"uuid": uuid, "name": name, "total_bytes": total_bytes,
                  "parent_uuid": parent_uuid,
                  "physical_index": index if physical_index is None else physical_index}
        if uuid is None:  # NVML could not say (a failed query): the row at index keeps its own
            del values["uuid"]
        with self.engine.begin() as c:
            hid = self.host_id(host, c)
            mine = self._row_by_uuid(c, hid, (uuid,)) if uuid else None
            at_index = c.execute(select(devices.c.id, devices.c.uuid).where(
                devices.c.host_id == hid, devices.c.device_index == index)).first()
            if at_index is not None and uuid is not None and (
                    at_index.id != mine if mine is not None
                    else at_index.uuid not in (None, uuid)):
                c.execute(update(devices).where(devices.c.id == at_index.id)
                          .values(device_index=-at_index.id))
                at_index = None
            target = mine if mine is not None else (at_index.id if at_index else None)
            if target is None:
                c.execute(insert(devices).values(host_id=hid, device_index=index, **values))
            else:
                c.execute(update(devices).where(devices.c.id == target)
                          .values(device_index=index, **values))
        self._device_ids.clear()
        self._uuid_ids.clear()

    @staticmethod
    def _row_by_uuid(c: Connection, hid: int, names: Sequence[str]) -> int | None:
        did: int | None = c.execute(select(devices.c.id).where(
            devices.c.host_id == hid, devices.c.uuid.in_(list(names)))).scalar()
        return did

    def resolve_device(self, index: int, uuid: str | None, host: str | None = None,
                       conn: Connection | None = None) -> int | None:
        """The device row of a record: by UUID if it has one, else by ``(host, index)``.

        An unknown UUID claims the row at ``index`` when that row has no UUID yet (no NVML on
        this host: the hook's view is all there is) or creates it; when the row at ``index`` is
        another device's, the record is unjoined: ``None``, counted, logged once.
        """
        if uuid is None:
            return self.device_id(index, host, conn)
        name = host or self.host_name
        cached = self._uuid_ids.get((name, uuid))
        if cached is not None:
            return cached
        with _maybe_begin(self.engine, conn) as c:
            hid = self.host_id(name, c)
            did = self._row_by_uuid(c, hid, uuid_candidates(uuid))
            if did is None:
                did = self._claim_index(c, hid, index, uuid)
        if did is None:
            self._note_unjoined(name, uuid, index)
            return None
        self._uuid_ids[(name, uuid)] = did
        return did

    def _claim_index(self, c: Connection, hid: int, index: int, uuid: str) -> int | None:
        row = c.execute(select(devices.c.id, devices.c.uuid).where(
            devices.c.host_id == hid, devices.c.device_index == index)).first()
        if row is None:
            return _new_id(c.execute(insert(devices).values(
                host_id=hid, device_index=index, uuid=uuid, physical_index=index)))
        if row.uuid is None:
            c.execute(update(devices).where(devices.c.id == row.id).values(uuid=uuid))
            claimed: int = row.id
            return claimed
        return None

    def _note_unjoined(self, host: str, uuid: str, index: int) -> None:
        self.unjoined_total += 1
        if (host, uuid) not in self._unjoined:
            self._unjoined.add((host, uuid))
            log.warning("records of device %s (index %d as the client numbers it) on host %s "
                        "name no device NVML reported there; they are counted as unjoined and "
                        "not stored (is the agent seeing the same GPUs as the server?)",
                        uuid, index, host)

    def upsert_process(self, pid: int, ts_s: float, *, name: str | None = None,
                       model: str | None = None, device_indexes: Sequence[int] = (),
                       host: str | None = None, rank: int | None = None,
                       local_rank: int | None = None, world_size: int | None = None,
                       ns_pid: int | None = None) -> None:
        values: dict[str, Any] = {"last_seen_s": ts_s}
        optional = {"name": name, "model": model, "rank": rank, "local_rank": local_rank,
                    "world_size": world_size, "ns_pid": ns_pid}
        values.update({k: v for k, v in optional.items() if v is not None})
        if device_indexes:
            values["devices"] = ",".join(str(i) for i in device_indexes)
        with self.engine.begin() as c:
            self._upsert_process(c, pid, host, values)

    def _upsert_process(self, c: Connection, pid: int, host: str | None,
                        values: dict[str, Any]) -> None:
        hid = self.host_id(host, c)
        where = and_(processes.c.host_id == hid, processes.c.pid == pid)
        if c.execute(update(processes).where(where).values(**values)).rowcount == 0:
            c.execute(insert(processes).values(host_id=hid, pid=pid,
                                               first_seen_s=values["last_seen_s"], **values))

    def _note_ranks(self, c: Connection, batch: Sequence[Event]) -> None:
        """A ``process_rank`` event (the hooks' RankWatch) puts the rank on its process's row."""
        for e in batch:
            if e.name == RANK_EVENT and e.pid is not None and e.data:
                ranks = {k: e.data.get(k) for k in ("rank", "local_rank", "world_size")}
                self._upsert_process(c, e.pid, e.host, {"last_seen_s": e.ts_s, **{
                    k: v for k, v in ranks.items() if isinstance(v, int) and 0 <= v <= INT32_MAX}})

    # --- writing -------------------------------------------------------------------------
    def transaction(self) -> AbstractContextManager[Connection]:
        """One transaction for several ``write(..., conn=...)`` calls (``vramscope import`` of
        several files: all or nothing)."""
        return self.engine.begin()

    def write(self, sample_batch: Sequence[Sample] = (), event_batch: Sequence[Event] = (),
              origin: str | None = None, first_seq: int | None = None,
              conn: Connection | None = None) -> int:
        """Insert samples and events in one transaction (``conn``'s, if given); returns rows
        inserted.

        With ``origin`` and ``first_seq`` every row gets ``(origin, seq)`` numbered in order
        (samples first, then events) and rows already present are skipped, so replaying a batch
        after a reconnect is harmless.
        """
        if not sample_batch and not event_batch:
            return 0
        try:
            with _maybe_begin(self.engine, conn) as c:
                event_rows = [self._event_row(e, c) for e in event_batch]
                if event_batch:
                    self._note_ranks(c, event_batch)
                if origin is not None and first_seq is not None:
                    # samples numbered first, events after them; unjoined rows keep a seq
                    if self.dialect == "postgresql":
                        written = self._insert_samples_pg(c, sample_batch, origin, first_seq)
                        _number(event_rows, origin, first_seq + len(sample_batch))
                        return written + self._insert_idempotent(c, [], _joined(event_rows))
                    sample_rows = [self._sample_row(s, c) for s in sample_batch]
                    _number(sample_rows + event_rows, origin, first_seq)
                    return self._insert_idempotent(c, _joined(sample_rows), _joined(event_rows))
                written = self._insert_samples(c, sample_batch) if sample_batch else 0
                event_rows = _joined(event_rows)
                if event_rows:
                    c.execute(insert(events), event_rows)
        except (SQLAlchemyError, OverflowError, UnicodeError) as exc:
            self._forget_ids()
            raise StoreError(f"cannot write to {self.safe_url}: {_reason(exc)}") from exc
        return written + len(event_rows)

    def write_new(self, sample_batch: Sequence[Sample], event_batch: Sequence[Event],
                  conn: Connection, repeats: content_keys.FileRepeats
                  ) -> content_keys.NewRecords:
        """``vramscope import``'s write, in ``conn``'s transaction: each row keyed by its
        content, and only those not stored yet inserted (agent/store/content_keys.py), so that
        a file imported twice, or files that overlap, store no row twice. ``repeats``: the
        file's, kept from batch to batch. Returns the records that were new and how many were
        already there."""
        try:
            joined = [(e, row) for e in event_batch
                      if (row := self._event_row(e, conn))["device_id"] is not None]
            if event_batch:
                self._note_ranks(conn, event_batch)
            return content_keys.write(conn, self.dialect, self._sample_rows(sample_batch, conn),
                                      ([e for e, _ in joined], [row for _, row in joined]),
                                      repeats)
        except (SQLAlchemyError, OverflowError, UnicodeError, TypeError) as exc:
            self._forget_ids()
            raise StoreError(f"cannot write to {self.safe_url}: {_reason(exc)}") from exc

    def _sample_rows(self, batch: Sequence[Sample], c: Connection
                     ) -> tuple[list[Sample], list[tuple[Any, ...]]]:
        """The joined samples and their rows in ``content_keys.SAMPLE_ROW`` order (unjoined
        ones left out); the device ids from the caches inline (a call per row would cost more
        than the rest of the row)."""
        records: list[Sample] = []
        rows: list[tuple[Any, ...]] = []
        by_uuid, by_index, host_name = self._uuid_ids, self._device_ids, self.host_name
        for s in batch:
            uuid = s.device_uuid
            did = (by_index.get((s.host or host_name, s.device)) if uuid is None
                   else by_uuid.get((s.host or host_name, uuid)))
            if did is None:
                did = self._device_of(s, c)
                if did is None:
                    continue
            phase = s.phase.value if isinstance(s.phase, Phase) else Phase.parse(s.phase).value
            records.append(s)
            rows.append((did, s.ts_s, phase, s.source, s.pid) + s[_COUNTERS_START:_COUNTERS_END])
        return records, rows

    def _forget_ids(self) -> None:
        """A rolled-back transaction may have inserted host or device rows and cached their
        ids: forget the cache, or every later batch would point at rows that do not exist."""
        self._host_ids.clear()
        self._device_ids.clear()
        self._uuid_ids.clear()

    def _insert_idempotent(self, c: Connection, sample_rows: list[dict[str, Any]],
                           event_rows: list[dict[str, Any]]) -> int:
        inserted = 0
        for table, rows in ((samples, sample_rows), (events, event_rows)):
            if not rows:
                continue
            # RETURNING counts what was really inserted; executemany rowcounts are unreliable.
            stmt = _insert_ignore(self.dialect, table).returning(table.c.id)
            inserted += len(c.execute(stmt, rows).all())
        return inserted

    def _insert_samples(self, c: Connection, batch: Sequence[Sample]) -> int:
        """The hot path. On SQLite, the Core ``insert()`` is compiled once and rows go to the
        driver's ``executemany`` as plain tuples: building a dict per row and letting SQLAlchemy
        re-process its parameters costs more than the insert itself (``vramscope bench ingest``).
        """
        if self.dialect == "postgresql":
            return self._insert_samples_pg(c, batch, None, None)
        if self._sample_sql is None:  # (the SQLite path: rows are plain tuples from here)
            stmt = insert(samples).values({k: None for k in _ROW_ORDER})
            self._sample_sql = str(stmt.compile(dialect=self.engine.dialect))
        _, tuples = self._sample_rows(batch, c)
        if tuples:
            c.exec_driver_sql(self._sample_sql, tuples)
        return len(tuples)

    def _insert_samples_pg(self, c: Connection, batch: Sequence[Sample], origin: str | None,
                           first_seq: int | None) -> int:
        """PostgreSQL's hot path: the batch as one array per column, inserted by one
        ``INSERT ... SELECT FROM unnest(...)``, rows already there (the same ``(origin, seq,
        ts_s)``: a retried batch) skipped; returns the rows inserted. SQLAlchemy's
        ``executemany`` of one dict per row with ``RETURNING`` builds and sends a statement's
        parameters per row, which kept the agent over its 2 % of a core at 8 x 10 Hz
        (``vramscope bench agent --db postgresql://``)."""
        tuples: list[tuple[Any, ...]] = []
        for i, s in enumerate(batch):
            did = self._device_of(s, c)
            if did is None:
                continue
            phase = s.phase.value if isinstance(s.phase, Phase) else Phase.parse(s.phase).value
            tuples.append((did, s.ts_s, phase, s.source, s.pid,
                           *s[_COUNTERS_START:_COUNTERS_END],
                           origin, None if first_seq is None else first_seq + i))
        if not tuples:
            return 0
        result = c.exec_driver_sql(_PG_SAMPLES_SQL, tuple(list(col) for col in zip(*tuples)))
        return int(result.rowcount)

    def _device_of(self, r: Sample | Event | PostMortem, conn: Connection | None) -> int | None:
        """The row id of a record's device, from the caches when it is there (the hot path)."""
        host = r.host or self.host_name
        if r.device_uuid is None:
            did = self._device_ids.get((host, r.device))
            return did if did is not None else self.device_id(r.device, r.host, conn)
        did = self._uuid_ids.get((host, r.device_uuid))
        return did if did is not None else self.resolve_device(r.device, r.device_uuid,
                                                                r.host, conn)

    def _sample_row(self, s: Sample, conn: Connection | None) -> dict[str, Any]:
        row = dict(zip(SAMPLE_COUNTER_FIELDS, s[_COUNTERS_START:_COUNTERS_END]))
        row["device_id"] = self._device_of(s, conn)
        row["ts_s"] = s.ts_s
        row["phase"] = s.phase.value if isinstance(s.phase, Phase) else Phase.parse(s.phase).value
        row["source"] = s.source
        row["pid"] = s.pid
        return row

    def _event_row(self, e: Event, conn: Connection | None) -> dict[str, Any]:
        return {
            "device_id": self._device_of(e, conn),
            "ts_s": e.ts_s, "name": e.name, "pid": e.pid,
            "phase": e.phase.value if e.phase is not None else None,
            "request_id": e.request_id,
            "data": json.dumps(e.data, sort_keys=True) if e.data else None,
        }

    def write_postmortem(self, pm: PostMortem) -> int | None:
        """Store ``pm``; returns its row id. Idempotent: a post-mortem is one OOM of one process
        at one instant, so a row with the same device, time, pid and cause is this one again
        (the writer retrying after a commit whose reply was lost) and its id is returned."""
        try:
            with self.engine.begin() as c:
                did = self._device_of(pm, c)
                if did is None:  # unjoined: counted and logged; nothing to retry
                    return None
                same: int | None = c.execute(select(postmortems.c.id).where(
                    postmortems.c.device_id == did, postmortems.c.ts_s == pm.ts_s,
                    postmortems.c.pid.is_not_distinct_from(pm.pid),
                    postmortems.c.cause.is_not_distinct_from(pm.cause))).scalar()
                return same if same is not None else _new_id(c.execute(insert(postmortems).values(
                    device_id=did, ts_s=pm.ts_s, pid=pm.pid, cause=pm.cause,
                    summary=json.dumps(pm.to_json(), sort_keys=True),
                    snapshot_path=pm.snapshot_path)))
        except Exception:
            self._forget_ids()
            raise

    def open_alert(self, rule: str, severity: str, fired_ts_s: float, *,
                   device: int | None = None, value: float | None = None,
                   message: str | None = None, labels: dict[str, str] | None = None,
                   host: str | None = None, conn: Connection | None = None) -> int:
        with _maybe_begin(self.engine, conn) as c:
            did = self.device_id(device, host, c) if device is not None else None
            return _new_id(c.execute(insert(alerts).values(
                device_id=did, rule=rule, severity=severity, fired_ts_s=fired_ts_s,
                value=value, message=message,
                labels=json.dumps(labels, sort_keys=True) if labels else None,
            )))

    def resolve_alert(self, alert_id: int, resolved_ts_s: float,
                      conn: Connection | None = None) -> None:
        with _maybe_begin(self.engine, conn) as c:
            c.execute(update(alerts).where(alerts.c.id == alert_id)
                      .values(resolved_ts_s=resolved_ts_s))

    def write_agent_stats(self, ts_s: float, *, clients: int, rows_per_s: float,
                          queue_depth: int, dropped_total: int, rejected_total: int,
                          db_size_bytes: int | None, host: str | None = None,
                          retention_behind_s: float | None = None,
                          retention_eta_s: float | None = None,
                          rejected_by_reason: Mapping[str, int] | None = None) -> None:
        # Sums of client-reported counters could pass the BigInteger range: saturate, so the
        # row (and the dashboard's sampling health) is still written.
        dropped_total, rejected_total = (min(v, INT64_MAX) for v in (dropped_total,
                                                                       rejected_total))
        by_reason = (None if rejected_by_reason is None else json.dumps(
            {k: min(int(v), INT64_MAX) for k, v in sorted(rejected_by_reason.items()) if v}))
        with self.engine.begin() as c:
            c.execute(insert(agent_stats).values(
                host_id=self.host_id(host, c), ts_s=ts_s, clients=clients,
                rows_per_s=rows_per_s, queue_depth=queue_depth, dropped_total=dropped_total,
                rejected_total=rejected_total, db_size_bytes=db_size_bytes,
                retention_behind_s=retention_behind_s, retention_eta_s=retention_eta_s,
                rejected_by_reason=by_reason))

    # --- reading -------------------------------------------------------------------------
    def hosts(self) -> list[dict[str, Any]]:
        with self.engine.connect() as c:
            return [dict(r._mapping) for r in c.execute(select(hosts).order_by(hosts.c.name))]

    def devices(self, host: str | None = None) -> list[dict[str, Any]]:
        """Every device (of one host, or all hosts when ``host="*"``), with its host name."""
        q = (select(devices, hosts.c.name.label("host"))
             .join(hosts, hosts.c.id == devices.c.host_id)
             .order_by(hosts.c.name, devices.c.device_index))
        if host != "*":
            q = q.where(hosts.c.name == (host or self.host_name))
        with self.engine.connect() as c:
            return [dict(r._mapping) for r in c.execute(q)]

    def processes(self, host: str | None = None) -> list[dict[str, Any]]:
        q = (select(processes, hosts.c.name.label("host"))
             .join(hosts, hosts.c.id == processes.c.host_id).order_by(processes.c.pid))
        if host != "*":
            q = q.where(hosts.c.name == (host or self.host_name))
        with self.engine.connect() as c:
            return [dict(r._mapping) for r in c.execute(q)]

    def samples(self, device: int | None = None, start_s: float | None = None,
                end_s: float | None = None, *, host: str | None = None,
                source: str | None = None, limit: int | None = None) -> list[Sample]:
        """Samples in time order (all devices of the host when ``device`` is None)."""
        return list(self.iter_samples(device, start_s, end_s, host=host, source=source,
                                      limit=limit))

    def iter_samples(self, device: int | None = None, start_s: float | None = None,
                     end_s: float | None = None, *, host: str | None = None,
                     source: str | None = None, limit: int | None = None) -> Iterable[Sample]:
        hname = host or self.host_name
        host_field = None if host is None else host
        with self.engine.connect() as c:
            known = self._device_rows(c, device, host)
            if sample_blocks.any_blocks(c, list(known), start_s, end_s):
                # the compact raw tier holds some: its rows and samples's, merged in order
                columns = ("device_id", "phase", "source", "pid", *SAMPLE_COUNTER_FIELDS)
                for r in sample_blocks.iter_window_rows(c, list(known), start_s, end_s,
                                                        columns, source=source, limit=limit):
                    index, uuid = known[r[2]]
                    yield Sample(r[0], index, Phase(r[3]), r[4], r[5],  # type: ignore[misc]
                                 *r[6:], host=host_field, device_uuid=uuid)  # r: counters
                return
            q = (select(devices.c.device_index, samples.c.ts_s, samples.c.phase,
                        samples.c.source, samples.c.pid,
                        *(samples.c[n] for n in SAMPLE_COUNTER_FIELDS), devices.c.uuid)
                 .join(devices, devices.c.id == samples.c.device_id)
                 .join(hosts, hosts.c.id == devices.c.host_id)
                 .where(hosts.c.name == hname)
                 .order_by(samples.c.ts_s, samples.c.id))
            q = _time_filter(q, samples.c.ts_s, start_s, end_s)
            if device is not None:
                q = q.where(devices.c.device_index == device)
            if source is not None:
                q = q.where(samples.c.source == source)
            if limit is not None:
                q = q.limit(limit)
            for r in c.execute(q).yield_per(10_000):
                yield Sample(r[1], r[0], Phase(r[2]), r[3], r[4],  # type: ignore[misc]
                             *r[5:-1], host=host_field, device_uuid=r[-1])  # r: counters

    def events(self, device: int | None = None, start_s: float | None = None,
               end_s: float | None = None, *, host: str | None = None,
               names: Sequence[str] | None = None, limit: int | None = None) -> list[Event]:
        """Events in time order (ties by id), at most ``limit``.

        With several ``names``, one SELECT per name under a UNION ALL: each a range of the
        ``(device_id, name, ts_s)`` index in time order, which SQLite merges (PostgreSQL: a
        Merge Append) and stops at ``limit``. One ``name IN (...)`` makes SQLite walk the
        ``(device_id, ts_s)`` index for its ORDER BY and test every event of the window: a
        week's OOM and phase look-up would read every request event of the device to find
        none.

        One device is filtered by its row id (a scalar subquery), not by the joined device
        row: PostgreSQL estimates a join's filter at a few events, so it sorted all request
        events of a week where an index range in time order stops at ``limit``.
        """
        q = self._events_select(device, start_s, end_s, host)
        arms = [q.where(events.c.name == name) for name in dict.fromkeys(names or ())]
        with self.engine.connect() as c:
            rows = c.execute(_in_time_order(arms or [q], limit)).all()
            if event_blocks.compactable(names):
                rows = self._with_event_blocks(c, rows, device, host, start_s, end_s, names,
                                               limit)
        return [_event_of(r, host) for r in rows]

    def event_groups(self, device: int, start_s: float, end_s: float,
                     groups: Sequence[tuple[Sequence[str], int]], *,
                     host: str | None = None) -> list[list[Event]]:
        """Several :meth:`events` reads of one device's window in one statement: group ``k``
        (``names``, ``limit``) answers what ``events(device, start_s, end_s, host=host,
        names=names, limit=limit)`` does. Each name's first ``limit`` events in time order,
        every arm of every group under one UNION ALL tagged with its group, each group's
        merged in (ts_s, id) order here: a timeline reads four groups (markers and phases,
        requests, load, prefix-cache allocations), a statement each was a round trip each."""
        q = self._events_select(device, start_s, end_s, host)
        arms = [q.add_columns(literal(k).label("event_group")).where(events.c.name == name)
                .order_by(events.c.ts_s, events.c.id).limit(limit).subquery().select()
                for k, (names, limit) in enumerate(groups) for name in dict.fromkeys(names)]
        found: list[list[Any]] = [[] for _ in groups]
        with self.engine.connect() as c:
            if arms:
                for r in c.execute(union_all(*arms)).all():
                    found[r[-1]].append(r)
            for rows, (names, limit) in zip(found, groups, strict=True):
                rows.sort(key=itemgetter(4, 2))  # time, then id: as events' ORDER BY
                del rows[limit:]
                if event_blocks.compactable(names):
                    rows[:] = self._with_event_blocks(c, rows, device, host, start_s, end_s,
                                                      names, limit)
        return [[_event_of(r, host) for r in rows] for rows in found]

    def _events_select(self, device: int | None, start_s: float | None, end_s: float | None,
                       host: str | None) -> Select[Any]:
        """The events of the window (of device index ``device``, or every device of the host),
        as (device index, device uuid, every column of ``events``)."""
        # labelled, so that a UNION's ORDER BY names them (SQLite: "id" alone matches none)
        q: Select[Any] = _time_filter(
            select(devices.c.device_index, devices.c.uuid.label("device_uuid"),
                   *(col.label(col.name) for col in events.c))
            .join(devices, devices.c.id == events.c.device_id), events.c.ts_s, start_s, end_s)
        if device is not None:
            did = (select(devices.c.id).join(hosts, hosts.c.id == devices.c.host_id)
                   .where(hosts.c.name == (host or self.host_name),
                          devices.c.device_index == device).scalar_subquery())
            return q.where(events.c.device_id == did)
        return (q.join(hosts, hosts.c.id == devices.c.host_id)
                .where(hosts.c.name == (host or self.host_name)))

    def _with_event_blocks(self, c: Connection, rows: Sequence[Any], device: int | None,
                           host: str | None, start_s: float | None, end_s: float | None,
                           names: Sequence[str] | None, limit: int | None) -> Sequence[Any]:
        """``rows`` (:meth:`events`' own, from ``events``) and the compact raw tier's events
        of the same devices, window and names, merged in (ts_s, id) order, at most
        ``limit``: the rows the table held before compaction. A window with no block of any
        device (the newest minutes: blocks are closed intervals) costs one seek."""
        if not event_blocks.any_in_window(c, start_s, end_s):
            return rows
        known = self._device_rows(c, device, host)
        if not known or not event_blocks.any_blocks(c, list(known), start_s, end_s):
            return rows
        found = event_blocks.window_rows(c, list(known), start_s, end_s,
                                         None if names is None else list(names), limit)
        merged = [*rows, *((*known[r[1]], *r) for r in found)]
        merged.sort(key=itemgetter(4, 2))  # time, then id
        return merged if limit is None else merged[:limit]

    def iter_events(self, device: int | None = None, start_s: float | None = None,
                    end_s: float | None = None, *, host: str | None = None) -> Iterator[Event]:
        """Every event of the window, lazily, in :meth:`events`' order (streaming analysis: a
        week of request events is millions of rows). Where the compact raw tier holds some,
        the window is read ``EVENTS_CHUNK_S`` at a time, each through :meth:`events`."""
        with self.engine.connect() as c:
            ids = list(self._device_rows(c, device, host))
            spans = ([] if not ids or not event_blocks.any_blocks(c, ids, start_s, end_s)
                     else [event_blocks.span(c, ids), self._events_span(c, ids)])
        if spans:
            yield from self._iter_events_chunked(device, start_s, end_s, host, spans)
            return
        q = self._events_select(device, start_s, end_s, host).order_by(events.c.ts_s,
                                                                       events.c.id)
        with self.engine.connect() as c:
            for r in c.execute(q).yield_per(10_000):
                yield _event_of(r, host)

    def _iter_events_chunked(self, device: int | None, start_s: float | None,
                             end_s: float | None, host: str | None,
                             spans: list[tuple[float, float] | None]) -> Iterator[Event]:
        found = [s for s in spans if s is not None]
        lo = min(s[0] for s in found) if start_s is None else start_s
        hi = max(s[1] for s in found) if end_s is None else end_s
        start = lo
        while start <= hi:
            stop = start + EVENTS_CHUNK_S
            for e in self.events(device, start, min(stop, hi), host=host):
                if e.ts_s < stop or stop > hi:  # an event at ``stop`` is the next chunk's
                    yield e
            start = stop

    def _device_rows(self, c: Connection, device: int | None,
                     host: str | None) -> dict[int, tuple[int, str | None]]:
        """The stored devices of ``host`` (device index ``device``, or all): row id to
        (index, uuid)."""
        q = (select(devices.c.id, devices.c.device_index, devices.c.uuid)
             .join(hosts, hosts.c.id == devices.c.host_id)
             .where(hosts.c.name == (host or self.host_name)))
        if device is not None:
            q = q.where(devices.c.device_index == device)
        return {int(r[0]): (r[1], r[2]) for r in c.execute(q).all()}

    @staticmethod
    def _events_span(c: Connection, ids: Sequence[int]) -> tuple[float, float] | None:
        lo, hi = c.execute(select(func.min(events.c.ts_s), func.max(events.c.ts_s))
                           .where(events.c.device_id.in_(list(ids)))).one()
        return None if lo is None else (float(lo), float(hi))

    def time_range(self, device: int | None = None, host: str | None = None, *,
                   not_after_s: float | None = None) -> tuple[float, float] | None:
        """First and last sample time of a device (every device of the host when None),
        reaching back into the minute rollups where raw samples are gone. With
        ``not_after_s`` (the reader's clock), the last is the newest sample not ahead of it:
        one row from a wrong clock must not stand for the newest real sample.

        Per device, ``min`` and ``max`` are separate scalar subqueries: each is then one seek on
        the ``(device_id, ts_s)`` index, whereas both in one SELECT turns SQLite's min/max
        shortcut off and reads every row of the device (1.26 s at 7 days of 10 Hz)."""
        known = None if device is None else self.known_device_id(device, host)
        spans = []
        with self.engine.connect() as c:
            dids = (list(self._device_rows(c, None, host)) if device is None
                    else [] if known is None else [known])
            for did in dids:
                mine = samples.c.device_id == did
                lo = select(func.min(samples.c.ts_s)).where(mine).scalar_subquery()
                hi = select(func.max(samples.c.ts_s)).where(
                    mine, *_not_after(samples.c.ts_s, not_after_s)).scalar_subquery()
                # history older than the raw samples lives on in the tiers (retention): the
                # rollups reach furthest back, and end where a device without raw rows ends
                first_minute = (select(func.min(rollups.c.bucket_s))
                                .where(rollups.c.device_id == did).scalar_subquery())
                last_minute = (select(func.max(rollups.c.bucket_s))
                               .where(rollups.c.device_id == did,
                                      *_not_after(rollups.c.bucket_s, not_after_s))
                               .scalar_subquery())
                # the compact raw tier's first and newest sample, in the same statement (a
                # block across the bound is decoded after)
                lo_, hi_, first_m, last_m, block_lo, block_hi, across = c.execute(select(
                    lo, hi, first_minute, last_minute,
                    sample_blocks.edge_of(did, False, None),
                    sample_blocks.edge_of(did, True, not_after_s),
                    sample_blocks.straddles(did, not_after_s))).one()
                if across:
                    block_hi = sample_blocks.last_ts(c, did, not_after_s)
                lo_ = min((x for x in (lo_, block_lo) if x is not None), default=None)
                hi_ = max((x for x in (hi_, block_hi) if x is not None), default=None)
                spans.append((lo_, hi_, first_m, last_m))
        firsts = [x for span in spans for x in (span[0], span[2]) if x is not None]
        lasts = [span[1] if span[1] is not None else span[3] + MINUTE_S
                 for span in spans if span[1] is not None or span[3] is not None]
        if not firsts or not lasts:  # none, or every sample ahead of ``not_after_s``
            return None
        return float(min(firsts)), float(max(lasts))

    def seconds(self, device: int, start_s: float, end_s: float, *,
                host: str | None = None) -> list[tuple[str, Second]]:
        """The per-second tier's seconds in [start_s, end_s) of device index ``device``, as
        (source, second) in time order (``agent/store/seconds.py``)."""
        from vramscope.agent.store.seconds import unpack

        q = self._seconds_rows(device, start_s, end_s, host)
        out: list[tuple[str, Second]] = []
        with self.engine.connect() as c:
            for minute, source, blob in c.execute(q):
                out.extend((source, s) for s in unpack(float(minute), bytes(blob))
                           if start_s <= s.ts_s < end_s)
        out.sort(key=lambda pair: pair[1].ts_s)
        return out

    def seconds_phases(self, device: int, start_s: float, end_s: float, *,
                       host: str | None = None) -> list[PhaseSeconds]:
        """The per-second tier's seconds in [start_s, end_s) of device index ``device``, their
        phases and sample counts only, a minute row at a time in (minute, source) order
        (:func:`~vramscope.agent.store.seconds.unpack_phases`)."""
        from bisect import bisect_left

        out = []
        for minute, source, blob in self._seconds_blobs(device, start_s, end_s, host):
            starts, counts, phases = unpack_phases(float(minute), bytes(blob))
            a, b = bisect_left(starts, start_s), bisect_left(starts, end_s)
            if a < b:
                out.append(PhaseSeconds(source, starts[a:b], counts[a:b], phases[a:b]))
        return out

    def _seconds_blobs(self, device: int, start_s: float, end_s: float, host: str | None,
                       source: str | None = None) -> list[tuple[Any, ...]]:
        """:meth:`_seconds_rows`' rows (of ``source`` only, when given): within
        ``read_once.reading`` read once (a timeline's series and phases read the same
        minutes before the raw samples)."""
        q = self._seconds_rows(device, start_s, end_s, host)
        if source is not None:
            q = q.where(seconds.c.source == source)

        def read() -> list[tuple[Any, ...]]:
            with self.engine.connect() as c:
                return [tuple(r) for r in c.execute(q).all()]

        return once(("seconds", self.engine, device, host or self.host_name, start_s, end_s,
                     source), read)

    def _seconds_rows(self, device: int, start_s: float, end_s: float,
                      host: str | None) -> Select[Any]:
        """The per-second tier's rows (minute, source, blob) that hold seconds of
        [start_s, end_s) of device index ``device``, in (minute, source) order."""

        return (select(seconds.c.minute_s, seconds.c.source, seconds.c.data)
                .join(devices, devices.c.id == seconds.c.device_id)
                .join(hosts, hosts.c.id == devices.c.host_id)
                .where(hosts.c.name == (host or self.host_name),
                       devices.c.device_index == device,
                       seconds.c.minute_s > start_s - MINUTE_S, seconds.c.minute_s < end_s)
                .order_by(seconds.c.minute_s, seconds.c.source))

    def seconds_columns(self, device: int, start_s: float, end_s: float, fields: Sequence[int],
                        *, host: str | None = None, source: str | None = None
                        ) -> list[tuple[str, list[float], list[tuple[Any, Any, Any]]]]:
        """The per-second tier in [start_s, end_s) as columns, a minute row at a time in
        (minute, source) order: ``(source, second starts, [(lows, highs, lasts) per counter
        of fields])`` (:func:`~vramscope.agent.store.seconds.unpack_columns`; ``source``: of
        that source only)."""
        from bisect import bisect_left

        from vramscope.agent.store.seconds import unpack_columns

        out = []
        for minute, src, blob in self._seconds_blobs(device, start_s, end_s, host, source):
            ts, stats = unpack_columns(float(minute), bytes(blob), fields)
            a, b = bisect_left(ts, start_s), bisect_left(ts, end_s)  # [start_s, end_s)
            if a < b:
                if (a, b) != (0, len(ts)):
                    ts = ts[a:b]
                    stats = [(lo[a:b], hi[a:b], la[a:b]) for lo, hi, la in stats]
                out.append((src, ts, stats))
        return out

    def timeline(self, device: int, start_s: float, end_s: float, buckets: int,
                 columns: Sequence[str], *, source: str | None = None,
                 host: str | None = None, lasts: bool = True,
                 width_s: float | None = None) -> list[dict[str, Any]]:
        """Per bucket, ``min``/``max``/``last`` of each column: one dict per non-empty bucket,
        in time order (:func:`~vramscope.agent.store.downsample.downsampled`)."""
        from vramscope.agent.store.downsample import downsample

        return downsample(self, device, start_s, end_s, buckets, columns, source, host,
                          lasts=lasts, width_s=width_s)

    def alerts(self, *, active_only: bool = False, host: str | None = None,
               device: int | None = None, start_s: float | None = None,
               end_s: float | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        """Alerts, newest first (of every host unless ``host`` names one), optionally of one
        device index and fired within [start_s, end_s]."""
        q = (select(alerts, devices.c.device_index.label("device"),
                    hosts.c.name.label("host"))
             .outerjoin(devices, devices.c.id == alerts.c.device_id)
             .outerjoin(hosts, hosts.c.id == devices.c.host_id)
             .order_by(alerts.c.fired_ts_s.desc()).limit(limit))
        if active_only:
            q = q.where(alerts.c.resolved_ts_s.is_(None))
        if host not in (None, "*"):
            q = q.where(hosts.c.name == host)
        if device is not None:
            q = q.where(devices.c.device_index == device)
        q = _time_filter(q, alerts.c.fired_ts_s, start_s, end_s)
        with self.engine.connect() as c:
            rows = [dict(r._mapping) for r in c.execute(q)]
        for r in rows:
            r["labels"] = stored_json(r["labels"]) or {}
        return rows

    def postmortems(self, device: int | None = None,
                    host: str | None = None) -> list[tuple[int, PostMortem]]:
        q = (select(postmortems.c.id, postmortems.c.summary, hosts.c.name.label("host"))
             .join(devices, devices.c.id == postmortems.c.device_id)
             .join(hosts, hosts.c.id == devices.c.host_id)
             .order_by(postmortems.c.ts_s))
        if host != "*":
            q = q.where(hosts.c.name == (host or self.host_name))
        if device is not None:
            q = q.where(devices.c.device_index == device)
        with self.engine.connect() as c:
            rows = c.execute(q).all()
        out = []
        for r in rows:
            summary = stored_json(r.summary, max_bytes=64 * 2**20)
            try:
                if not isinstance(summary, dict) or set(summary) == {"unreadable"}:
                    raise ValueError(summary)
                out.append((r.id, PostMortem.from_json(summary)._replace(host=r.host)))
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                log.warning("post-mortem %d is unreadable and left out: %s", r.id, exc)
        return out

    def latest_agent_stats(self, host: str | None = None) -> dict[str, Any] | None:
        q = (select(agent_stats).join(hosts, hosts.c.id == agent_stats.c.host_id)
             .where(hosts.c.name == (host or self.host_name))
             .order_by(agent_stats.c.ts_s.desc()).limit(1))
        with self.engine.connect() as c:
            row = c.execute(q).first()
        if row is None:
            return None
        out = dict(row._mapping)
        out["rejected_by_reason"] = stored_reasons(out["rejected_by_reason"])
        return out

    def count(self, table_name: str) -> int:
        from vramscope.agent.store.schema import metadata

        table = metadata.tables[table_name]
        with self.engine.connect() as c:
            return c.execute(select(func.count()).select_from(table)).scalar_one()

    def size_bytes(self) -> int | None:
        """Size of the database on disk (SQLite file plus WAL, or PostgreSQL's own figure)."""
        if self.dialect == "sqlite":
            path = sqlite_file(self.engine.url)
            if path is None:
                return None
            files = (path, path.with_name(path.name + "-wal"))
            return sum(f.stat().st_size for f in files if f.exists())
        if self.dialect == "postgresql":
            with self.engine.connect() as c:
                return c.exec_driver_sql("SELECT pg_database_size(current_database())").scalar()
        return None


def _make_engine(url: str, synchronous: str) -> Engine:
    # the check `config check` runs too, so that the two never disagree on a URL
    problem = database_url_problem(url) or database_driver_problem(url)
    if problem is not None:
        raise StoreError(f"database URL {_hidden_password(url)!r}: {problem}")
    try:
        engine = create_engine(url)
    except (SQLAlchemyError, ValueError) as exc:
        raise StoreError(f"bad database URL {_hidden_password(url)!r}: {exc}") from None
    except ModuleNotFoundError as exc:  # a module the driver itself imports
        raise StoreError(f"database URL {_hidden_password(url)!r} needs the {exc.name!r} "
                         f"module, which is not installed") from None
    if engine.dialect.name == "sqlite":
        path = sqlite_file(engine.url)
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot open database {url}: {exc}") from None
        _sqlite_pragmas(engine, synchronous)
    return engine


def _hidden_password(url: str) -> str:
    """``url`` with the password of ``user:password@`` masked, for messages."""
    import re

    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


def _sqlite_pragmas(engine: Engine, synchronous: str) -> None:
    """WAL and busy timeout on connections of *this* engine only, never process-wide."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: object) -> None:  # the DB-API connection
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.execute("PRAGMA busy_timeout=5000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()


class _maybe_begin:
    """Use the caller's connection if given, else a fresh transaction."""

    def __init__(self, engine: Engine, conn: Connection | None) -> None:
        self._engine, self._conn = engine, conn
        self._ctx: AbstractContextManager[Connection] | None = None

    def __enter__(self) -> Connection:
        if self._conn is not None:
            return self._conn
        self._ctx = self._engine.begin()
        return self._ctx.__enter__()

    def __exit__(self, *exc: Any) -> bool | None:
        if self._ctx is not None:
            return self._ctx.__exit__(*exc)
        return False


def stored_json(text: str | None, max_bytes: int = 2**20) -> Any:
    """Decode JSON text the store holds. Whatever is there — nested deeper than readers can
    walk, not JSON at all (another tool, an older version, a hand edit) — comes back as
    ``{"unreadable": why}`` instead of raising into a page: readers survive what is stored."""
    if not text:
        return None
    from vramscope.agent.trace import check_data

    try:
        value = json.loads(text)
        check_data(value if isinstance(value, dict) else {"value": value}, "stored data",
                   max_bytes=max_bytes)
    except (ValueError, RecursionError) as exc:
        return {"unreadable": str(exc)[:200]}
    return value


def stored_reasons(text: str | None) -> dict[str, int] | None:
    """An agent_stats row's refusals by reason: counts only (a hand-edited or foreign row's
    other values are left out); None on rows from before migration 0013, or unreadable."""
    value = stored_json(text, max_bytes=65_536)
    if not isinstance(value, dict) or "unreadable" in value:
        return None
    return {str(k): v for k, v in value.items() if type(v) is int and v >= 0}


def _in_time_order(arms: list[Select[Any]], limit: int | None) -> Executable:
    """The events of ``arms`` (one SELECT, or one per name) by time then id, at most
    ``limit``; several arms as one UNION ALL whose ORDER BY the database merges. With a
    ``limit`` each arm is limited too, in its own subquery: PostgreSQL does not push the
    outer LIMIT into a UNION's arms, and read every event of each before merging."""
    if len(arms) == 1:
        one = arms[0].order_by(events.c.ts_s, events.c.id)
        return one if limit is None else one.limit(limit)
    if limit is not None:
        arms = [arm.order_by(events.c.ts_s, events.c.id).limit(limit).subquery().select()
                for arm in arms]
    both = union_all(*arms)
    both = both.order_by(both.selected_columns.ts_s, both.selected_columns.id)
    return both if limit is None else both.limit(limit)


def _time_filter(q: Any, column: ColumnElement[Any], start_s: float | None,
                 end_s: float | None) -> Any:  # q: a Select of any columns (SQLAlchemy's
    # variadic Select[...] cannot be spelled on Python 3.10 without typing_extensions)
    if start_s is not None:
        q = q.where(column >= start_s)
    if end_s is not None:
        q = q.where(column <= end_s)
    return q


def _not_after(column: ColumnElement[Any], limit_s: float | None) -> list[ColumnElement[bool]]:
    """``column <= limit_s`` as a filter list, empty without a limit (still one index seek)."""
    return [] if limit_s is None else [column <= limit_s]


def _new_id(result: CursorResult[Any]) -> int:
    """The id an INSERT of one row gave it."""
    key = result.inserted_primary_key
    assert key is not None  # one row was inserted
    new: int = key[0]
    return new


def _id_or_insert(c: Connection, table: Table, where: ColumnElement[bool],
                  values: dict[str, Any]) -> int:
    """The id of ``table``'s row that ``where`` selects, inserted from ``values`` when there is
    none."""
    row = c.execute(select(table.c.id).where(where)).first()
    if row is not None:
        return int(row[0])
    try:
        with c.begin_nested():
            return _new_id(c.execute(insert(table).values(**values)))
    except IntegrityError:  # another agent inserted it first
        return int(c.execute(select(table.c.id).where(where)).scalar_one())


def _event_of(r: Any, host: str | None) -> Event:
    """A row of ``Store._events_select`` as its Event: by position, a phase by lookup
    (``Phase(value)`` and a Row's attributes were two thirds of the cost of reading a window's
    request markers)."""
    return Event(r[4], r[5], r[0], r[6], _PHASE_OF.get(r[7]) if r[7] else None, r[8],
                 stored_json(r[9]), host, r[1])


def _joined(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["device_id"] is not None]


def _number(rows: list[dict[str, Any]], origin: str, first_seq: int) -> None:
    for i, row in enumerate(rows):
        row["origin"] = origin
        row["seq"] = first_seq + i


def _insert_ignore(dialect: str, table: Table) -> Any:  # a dialect's INSERT ... DO NOTHING
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        # samples is partitioned by ts_s there (0006), so its key is (origin, seq, ts_s): a
        # replayed row carries the ts_s it had, and conflicts
        key = ["origin", "seq", "ts_s"] if table is samples else ["origin", "seq"]
        return pg_insert(table).on_conflict_do_nothing(index_elements=key)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert  # the one other dialect

    return sqlite_insert(table).on_conflict_do_nothing(index_elements=["origin", "seq"])


def _reason(exc: Exception) -> str:
    orig = getattr(exc, "orig", None)
    return str(orig) if orig is not None else str(exc)
