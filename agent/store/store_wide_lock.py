"""Which agent of a fleet does the store-wide work (deletion by age, partitions, and the
rollups and compaction of hosts whose agents are gone): the one that holds a PostgreSQL
advisory lock. Every agent rolls up and compacts its own host's devices
(vramscope.agent.retention).

Session-level (``pg_try_advisory_lock``), not transaction-level: a retention step is many short
transactions and the leader keeps state between steps (the gone hosts' rollup watermarks, its
partitions); PostgreSQL releases the lock when the session ends, however the agent went. Each
step checks in ``pg_locks`` that the session still holds it, so a leader whose connection broke
stops believing it leads. SQLite: one agent per file; :meth:`StoreWideLock.acquire` is always
true. docs/agent.md, "Retention and rollups".
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlalchemy import Connection, text

if TYPE_CHECKING:
    from vramscope.agent.store.store import Store

log = logging.getLogger("vramscope.retention")

# The advisory lock's key (one bigint): the ASCII of "vramscop" read as a big-endian integer,
# 8534991366535737200. Documented in docs/agent.md so that an operator can look the leader up:
# SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
#   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
#   AND (classid::bigint << 32 | objid::bigint) = 8534991366535737200;
STORE_WIDE_LOCK_KEY = int.from_bytes(b"vramscop", "big")

_HELD = text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
             "AND pid = pg_backend_pid() AND objsubid = 1 "
             "AND (classid::bigint << 32 | objid::bigint) = :key")


class StoreWideLock:
    """The store-wide work's lock for one agent. Used from one thread (the writer's)."""

    def __init__(self, key: int = STORE_WIDE_LOCK_KEY) -> None:
        self.key = key
        self._conn: Connection | None = None  # PostgreSQL: the session holding the lock

    @property
    def held(self) -> bool:
        return self._conn is not None

    def acquire(self, store: Store) -> bool:
        """Whether this agent may do the store-wide work now: it holds the lock (still, or
        newly). Never waits for another agent; a database error is "not held"."""
        if store.dialect != "postgresql":
            return True
        if self._conn is not None:
            try:
                if self._conn.execute(_HELD, {"key": self.key}).scalar_one() == 1:
                    self._conn.rollback()  # no transaction left open on the lock's session
                    return True
            except Exception as exc:  # the session is gone (server restart, lost link)
                log.warning("the store-wide work's lock was lost with its connection (%s); "
                            "trying to take it again", exc.__class__.__name__)
            self.release()
        try:
            conn = store.engine.connect()
        except Exception:
            return False
        try:
            got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:key)"),
                                    {"key": self.key}).scalar_one())
            conn.commit()  # the session lock outlives the transaction; nothing is left open
        except Exception:
            conn.invalidate()
            conn.close()
            return False
        if not got:
            conn.close()
            return False
        self._conn = conn
        log.info("this agent now does the store-wide work (deletion by age, partitions, the "
                 "rollups of hosts whose agents are gone)")
        return True

    def release(self) -> None:
        """Give the lock up (agent stopping, or a failed step): another agent takes it at its
        next step. Closing the session releases it even where the unlock cannot be sent."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": self.key})
            conn.commit()
            conn.close()
        except Exception:
            # the session is broken: drop it rather than give it back to the pool, so that
            # the server ends it (and with it the lock, if it still held one)
            conn.invalidate()
            conn.close()
