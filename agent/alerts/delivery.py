"""What the webhook sends next: alert changes by severity, coalesced and damped per alert.

A first-in first-out queue once let one flapping rule on a hung receiver delay and drop an OOM
alert; here changes are coalesced per alert, sent most severe first, damped and bounded, and a
critical one is never held or dropped (docs/alerts.md, "Delivery"). Not thread-safe: the webhook
sink holds its lock around every call.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from vramscope.agent.alerts.engine import AlertChange
from vramscope.agent.analysis.severity import Severity
from vramscope.agent.durations import HOUR_S

Key = tuple[str, int | None, str | None]


def key_of(change: AlertChange) -> Key:
    return (change.rule, change.device, change.host)


def _rank(change: AlertChange) -> Severity:
    return Severity.parse(change.severity, f"alert {change.rule}")


def _critical_fired(change: AlertChange) -> bool:
    return _rank(change) is Severity.CRITICAL and change.kind == "fired"


@dataclass
class _Pending:
    """One alert's pending state: its newest change, and ahead of it a critical 'fired' the
    receiver has not had yet."""

    seq: int  # place in line among equal severities (kept when coalesced or retried)
    newest: AlertChange
    first: AlertChange | None = None
    failed: bool = False  # tried and failed: not tried again when the sink closes

    @property
    def rank(self) -> Severity:
        return max(_rank(self.newest), _rank(self.first) if self.first else Severity.OK)


class Taken(NamedTuple):
    change: AlertChange
    seq: int
    failed_before: bool  # a retry of a change that failed all its tries once already


class DeliveryQueue:
    """Pending alert changes for one receiver; see the module docstring."""

    def __init__(self, max_changes: int = 1000, max_per_hour: int = 20) -> None:
        if max_changes < 1 or max_per_hour < 1:
            raise ValueError(f"max_changes and max_per_hour must be >= 1, got {max_changes!r} "
                             f"and {max_per_hour!r}")
        self.max_changes, self.max_per_hour = max_changes, max_per_hour
        self._pending: dict[Key, _Pending] = {}
        self._held_by: dict[Key, str] = {}  # the kind the receiver last got, per alert
        self._sent_at: dict[Key, deque[float]] = {}  # its deliveries in the last hour
        self._seq = 0
        self.coalesced = self.dropped = 0

    def __len__(self) -> int:
        return len(self._pending)

    def put(self, change: AlertChange) -> list[AlertChange]:
        """Queue ``change``; returns the changes dropped to make room (oldest, least severe)."""
        key = key_of(change)
        entry = self._pending.get(key)
        if entry is None:
            self._seq += 1
            self._pending[key] = _Pending(self._seq, change)
        else:
            self._replace(key, entry, change)
        return self._overflow()

    def _replace(self, key: Key, entry: _Pending, change: AlertChange) -> None:
        if entry.first is None and self._unheard(key, entry.newest):
            entry.first = entry.newest  # the news a critical alert fired outranks its end
        else:
            self.coalesced += 1
        entry.newest, entry.failed = change, False
        if entry.first is None and self._held_by.get(key) == change.kind:
            del self._pending[key]  # the receiver already holds this state
            self.coalesced += 1

    def _unheard(self, key: Key, change: AlertChange) -> bool:
        """A critical alert fired and the receiver does not hold it firing."""
        return _critical_fired(change) and self._held_by.get(key) != "fired"

    def _overflow(self) -> list[AlertChange]:
        dropped: list[AlertChange] = []
        while len(self._pending) > self.max_changes:
            victims = [(e.rank, e.seq, k) for k, e in self._pending.items()
                       if e.rank < Severity.CRITICAL]
            if not victims:
                break  # critical alerts only: never dropped
            _, _, key = min(victims)
            dropped.append(self._pending.pop(key).newest)
            self.dropped += 1
        return dropped

    def take(self, now_s: float, untried_only: bool = False) -> Taken | None:
        """The next change due (most severe, oldest first), out of the queue; None if none is.
        ``untried_only``: leave those that failed before (closing: one pass, no retries)."""
        due = [(e.rank, -e.seq, k) for k, e in self._pending.items()
               if self._due(k, e, now_s) and not (untried_only and e.failed)]
        if not due:
            return None
        _, _, key = max(due)
        entry = self._pending[key]
        if entry.first is not None:
            change, entry.first = entry.first, None
            return Taken(change, entry.seq, entry.failed)
        del self._pending[key]
        return Taken(entry.newest, entry.seq, entry.failed)

    def _due(self, key: Key, entry: _Pending, now_s: float) -> bool:
        if entry.first is not None or self._unheard(key, entry.newest):
            return True
        return self._budget_left(key, now_s)

    def _budget_left(self, key: Key, now_s: float) -> bool:
        sent = self._sent_at.get(key)
        while sent and now_s - sent[0] >= HOUR_S:
            sent.popleft()
        return not sent or len(sent) < self.max_per_hour

    def done(self, taken: Taken, delivered: bool, now_s: float) -> list[AlertChange]:
        """After a try: a delivered change counts against its alert's hour; a failed one goes
        back in line, at its place, unless a newer state replaced it meanwhile. Returns the
        changes dropped to make room for it."""
        change, key = taken.change, key_of(taken.change)
        entry = self._pending.get(key)
        if delivered:
            self._held_by[key] = change.kind
            self._sent_at.setdefault(key, deque(maxlen=self.max_per_hour)).append(now_s)
            if entry is not None and entry.first is None and entry.newest.kind == change.kind:
                del self._pending[key]  # what came meanwhile ends where the receiver now is
                self.coalesced += 1
            return []
        if entry is None:
            self._pending[key] = _Pending(taken.seq, change, failed=True)
            return self._overflow()
        if entry.first is None and self._unheard(key, change):
            entry.first, entry.failed = change, True
        else:
            self.coalesced += 1  # a newer state replaced it while it was tried
        return []
