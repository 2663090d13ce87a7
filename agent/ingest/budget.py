"""A write budget per client process (its uid and pid): rows and bytes per second, as token
buckets (docs/agent.md, "Limits per client and per name").

One client writing custom events once got 12.7 MB/s accepted. Its connections share one bucket,
so reconnecting buys no fresh burst; the first records of a message are kept, so what a client
gets stored is its oldest data, in order. The budget is charged before the other checks, so a
flood they refuse costs no more than the budget lets through.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

DEFAULT_ROWS_PER_S = 10_000.0
DEFAULT_BYTES_PER_S = 2_097_152.0
DEFAULT_BURST_S = 10.0
# What one stored row costs the database beyond its record's bytes, its indexes included,
# rounded up: a raw sample is about 124 B on SQLite and 280 B on PostgreSQL (docs/agent.md,
# "Retention and rollups"), an event's data is stored as its JSON. The database's growth
# under one client's flood is bounded by the budget through it (growth_bound_bytes).
STORED_ROW_BYTES = 400


@dataclass
class Bucket:
    """One connection's tokens; refilled lazily, on each message."""

    rows: float
    bytes: float
    at_s: float  # monotonic time of the last refill


class ProcessBuckets:
    """One bucket per client process, shared by its connections, open or closed. A bucket
    not drawn on for ``burst_s`` is full again, the same as a new one: it is forgotten then
    (and beyond ``max_kept`` processes, the least recently drawn), so memory stays bounded."""

    def __init__(self, budget: WriteBudget, max_kept: int = 4096) -> None:
        self._budget = budget
        self._max_kept = max_kept
        self._by_process: OrderedDict[Hashable, Bucket] = OrderedDict()

    def get(self, process: Hashable, now_s: float) -> Bucket:
        while self._by_process:  # the least recently drawn first
            oldest = next(iter(self._by_process.values()))
            if now_s - oldest.at_s < self._budget.burst_s:
                break
            self._by_process.popitem(last=False)
        bucket = self._by_process.pop(process, None)
        if bucket is None:
            bucket = self._budget.bucket(now_s)
        self._by_process[process] = bucket  # the most recently drawn: last
        if len(self._by_process) > self._max_kept:
            self._by_process.popitem(last=False)
        return bucket


class Overdraft(NamedTuple):
    records: int  # refused
    reason: str  # "budget_rows" or "budget_bytes": the bucket that ran out first


class WriteBudget:
    def __init__(self, rows_per_s: float = DEFAULT_ROWS_PER_S,
                 bytes_per_s: float = DEFAULT_BYTES_PER_S,
                 burst_s: float = DEFAULT_BURST_S) -> None:
        if not (rows_per_s > 0 and bytes_per_s > 0 and burst_s > 0):
            raise ValueError(f"a write budget needs rows_per_s, bytes_per_s and burst_s > 0, "
                             f"got {rows_per_s!r}, {bytes_per_s!r} and {burst_s!r}")
        self.rows_per_s, self.bytes_per_s, self.burst_s = rows_per_s, bytes_per_s, burst_s

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> WriteBudget:
        return cls(config["agent.client_max_rows_per_s"], config["agent.client_max_bytes_per_s"],
                   config["agent.client_budget_burst_s"])

    def bucket(self, now_s: float) -> Bucket:
        """A new client starts with a full burst."""
        return Bucket(self.rows_per_s * self.burst_s, self.bytes_per_s * self.burst_s, now_s)

    def take(self, bucket: Bucket, records: int, payload_bytes: int,
             now_s: float) -> tuple[int, Overdraft | None]:
        """How many of ``records`` (sharing ``payload_bytes``) fit the budget now; the tokens
        of those are spent."""
        if records <= 0:
            return 0, None
        self._refill(bucket, now_s)
        per_record = payload_bytes / records
        fit_rows = int(bucket.rows)
        fit_bytes = int(bucket.bytes / per_record) if per_record > 0 else records
        kept = max(0, min(records, fit_rows, fit_bytes))
        bucket.rows -= kept
        bucket.bytes -= kept * per_record
        if kept == records:
            return kept, None
        reason = "budget_rows" if fit_rows <= fit_bytes else "budget_bytes"
        return kept, Overdraft(records - kept, reason)

    def _refill(self, bucket: Bucket, now_s: float) -> None:
        elapsed = max(0.0, now_s - bucket.at_s)
        bucket.at_s = now_s
        bucket.rows = min(self.rows_per_s * self.burst_s, bucket.rows + elapsed * self.rows_per_s)
        bucket.bytes = min(self.bytes_per_s * self.burst_s,
                           bucket.bytes + elapsed * self.bytes_per_s)

    def growth_bound_bytes(self, seconds: float) -> float:
        """The most one client's records can add to the database in ``seconds``: its burst
        and ``seconds`` of its budget, each row at most its bytes plus ``STORED_ROW_BYTES``."""
        span = seconds + self.burst_s
        return span * (self.bytes_per_s + self.rows_per_s * STORED_ROW_BYTES)

    def describe(self, overdraft: Overdraft) -> str:
        what = ("rows" if overdraft.reason == "budget_rows" else "bytes")
        rate = self.rows_per_s if what == "rows" else self.bytes_per_s
        key = "rows" if what == "rows" else "bytes"
        return (f"{overdraft.records} record(s) refused: the client wrote more than its "
                f"{rate:g} {what}/s (agent.client_max_{key}_per_s, bursts of "
                f"agent.client_budget_burst_s = {self.burst_s:g} s)")
