"""What a client's records must pass before the writer gets them, refused one by one and counted.

In order: the write budget (``budget.py``, charged first), the time window (``timewindow.py``),
the live names (``names.py``) and the kept events' day count (``rare_events.py``). Kept apart from
the socket loop: this decides what is stored, the loop only moves bytes.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Hashable

from vramscope.agent.clock import Clock
from vramscope.agent.ingest import protocol as proto
from vramscope.agent.ingest.budget import ProcessBuckets, WriteBudget
from vramscope.agent.ingest.names import NameLimits
from vramscope.agent.ingest.peer import Conn
from vramscope.agent.ingest.rare_events import REASON as RARE_REASON
from vramscope.agent.ingest.rare_events import RareEventsPerDay, RareRefusal
from vramscope.agent.ingest.rate_log import RateLimitedLog
from vramscope.agent.ingest.timewindow import TimeWindow
from vramscope.agent.records import Event, Sample

log = logging.getLogger("vramscope.ingest")


class RecordAdmission:
    """The window, names, budget and daily count a connection's records are admitted by.

    ``None`` for the window, the budget or the count: no such bound (tests, benchmarks).
    """

    def __init__(self, rejected: Counter[str], *, time_window: TimeWindow | None,
                 name_limits: NameLimits | None, budget: WriteBudget | None,
                 rare_events: RareEventsPerDay | None, clock: Clock) -> None:
        self.rejected = rejected  # reason -> count: the server's stats
        self._window = time_window  # None: any representable time (tests, benchmarks)
        self.names = name_limits if name_limits is not None else NameLimits()
        self._budget = budget  # None: no write budget (tests, benchmarks)
        self._buckets = ProcessBuckets(budget if budget is not None else WriteBudget())
        self._rare = rare_events  # None: no cap a day (tests, benchmarks)
        self._clock = clock  # the write budget's time (the socket timeouts are real time)
        self._log_refused_records = RateLimitedLog(log, logging.WARNING)

    def records(self, conn: Conn, records: list[Sample | Event], payload_bytes: int
                ) -> list[Sample | Event]:
        """The records of one message that may be stored."""
        if self._budget is not None:  # first: what a client sends costs it, refused or not
            records = records[:self._within_budget(conn, len(records), payload_bytes)]
        records = self._bounded(conn, records)
        if self._rare is not None:  # last: it counts what the store keeps
            records = self._within_rare_cap(conn, records)
        return records

    def postmortem(self, conn: Conn, ts_s: float, payload_bytes: int) -> bool:
        """Whether a post-mortem at ``ts_s`` may be stored; outside the window it is a bad
        message (:class:`~vramscope.agent.ingest.protocol.ProtocolError`)."""
        if self._window is not None and not self._window.contains(ts_s):
            raise proto.ProtocolError("ts", f"post-mortem at ts_s {ts_s!r} is outside "
                                      "the accepted window (agent.max_record_age_s, "
                                      "agent.max_record_ahead_s)")
        if not self._within_budget(conn, 1, payload_bytes):
            return False
        if self._rare is not None and not self._rare.take(_rare_key(conn), 1):
            self.rejected[RARE_REASON] += 1
            self._log_refused_records("client pid %s: a post-mortem: %s", conn.info.pid,
                                      self._rare.describe(
                                          RareRefusal(1, self._rare.max_per_day)))
            return False
        return True

    def _bounded(self, conn: Conn, records: list[Sample | Event]) -> list[Sample | Event]:
        """The records inside the time window whose names may be stored; the others are
        counted (``ts``, ``names``) and said in a rate-limited log line."""
        if self._window is not None:
            kept, late = self._window.keep(records)
            if late is not None:
                self.rejected["ts"] += late.records
                self._log_refused_records("client pid %s: %s", conn.info.pid,
                                          self._window.describe(late))
                records = list(kept)
        kept, refusal = self.names.admit(records, conn.names)
        if refusal is not None:
            self.rejected["names"] += refusal.records
            self._log_refused_records("client pid %s: %s", conn.info.pid,
                                      self.names.describe(refusal))
            records = list(kept)
        return records

    def _within_budget(self, conn: Conn, records: int, payload_bytes: int) -> int:
        """How many of ``records`` (the first ones) the client's write budget takes; the
        rest are counted (``budget_rows``, ``budget_bytes``) and said in a log line."""
        if self._budget is None:
            return records
        now = self._clock.monotonic_s()
        process = _process(conn)
        if process is not None:  # drawn on each time: its connections share it
            conn.bucket = self._buckets.get(process, now)
        elif conn.bucket is None:
            conn.bucket = self._budget.bucket(now)
        kept, over = self._budget.take(conn.bucket, records, payload_bytes, now)
        if over is not None:
            self.rejected[over.reason] += over.records
            self._log_refused_records("client pid %s: %s", conn.info.pid,
                                      self._budget.describe(over))
        return kept

    def _within_rare_cap(self, conn: Conn, records: list[Sample | Event]
                         ) -> list[Sample | Event]:
        """``records`` less the events kept with the rollups beyond the client process's cap
        for today; counted (``rare_events_day``) and said in a log line."""
        assert self._rare is not None
        kept, refusal = self._rare.admit(_rare_key(conn), records)
        if refusal is not None:
            self.rejected[RARE_REASON] += refusal.records
            self._log_refused_records("client pid %s: %s", conn.info.pid,
                                      self._rare.describe(refusal))
        return kept


def _process(conn: Conn) -> tuple[int | None, int] | None:
    """Whose write budget a connection spends: its process, the kernel's uid and pid (a
    client cannot choose them, unlike its hello's pid); None when the kernel names none
    (not Linux, or another PID namespace: the connection has a budget of its own)."""
    pid = conn.info.peer_pid
    return (conn.info.peer_uid, pid) if pid else None


def _rare_key(conn: Conn) -> Hashable:
    """Whose count of events kept with the rollups a connection spends: its process, or the
    connection itself when the kernel names no process (as for the write budget)."""
    process = _process(conn)
    return process if process is not None else ("connection", id(conn))
