"""Retention: the tiers (per-second and per-minute rollups), then deletion of what each tier
no longer keeps.

The tiers, their settings, late samples and the fleet's store-wide lock are described in
docs/agent.md, "Retention and rollups", and docs/architecture.md, "Storage tiers".

Each :meth:`Retention.step` does a small, bounded piece of work (roll up at most
``minutes_per_step`` minutes, delete at most ``retention.step_rows`` rows per table) and is run
by the writer thread between batches, so retention never stalls ingest (and SQLite still sees
one writer). Raw samples are deleted only once they are both older than ``raw_s`` and rolled
up; before that, once their ten-minute interval ended ``retention.compact_after_s`` ago and
is rolled up, they move into the compact raw tier (:mod:`vramscope.agent.store.sample_blocks`),
and the frequent events of the same intervals with them (:mod:`vramscope.agent.store.event_blocks`),
a few intervals a step, each in its own transaction. Names the event table does not list
cannot be deleted by name: a step walks the events' time index forward from where the last one
stopped, at most ``UNLISTED_SCAN_S`` of it. Late minutes reported by
:meth:`Retention.note_written` are rolled up again (``rollup_window`` replaces a minute's
rows). On a shared PostgreSQL each agent rolls up and compacts its own host's devices, and only
the holder of the store-wide lock (:mod:`vramscope.agent.store.store_wide_lock`) deletes by
age, keeps the partitions and rolls up and compacts the hosts whose agents are gone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from itertools import chain
from operator import attrgetter
from types import ModuleType  # sql: vramscope.agent.store.maintenance, imported when first used
from typing import TYPE_CHECKING, Any, NamedTuple

from vramscope.agent.clock import SYSTEM_CLOCK, Clock
from vramscope.agent.durations import DAY_S, MINUTE_S
from vramscope.agent.event_kinds import CHEAP_EVENTS
from vramscope.agent.records import Event, Sample
from vramscope.agent.store.store_wide_lock import StoreWideLock

if TYPE_CHECKING:
    from vramscope.agent.store import Store

log = logging.getLogger("vramscope.retention")

_TS = attrgetter("ts_s")
MAX_LATE_MINUTES = 10_000  # a week of one-minute buckets; beyond it late minutes are not kept
# Rows timed further than this after the clock are deleted: no client's clock is a day ahead
# (ingest refuses more than agent.max_record_ahead_s), so they are a wrong clock or a hand edit,
# never old enough to go by age, and they would hide the newest real sample for good.
FUTURE_S = 86_400.0
# A minute is rolled up once it is this old (late samples of a batch still in flight land
# before it); rollups are behind only when their watermark trails now less this.
GRACE_S = 120.0
# The stretch of the events' time index a step reads for names the event table does not list
# (the kept events in it are read and left: 360 of a tokens source a device an hour)
UNLISTED_SCAN_S = 3600.0
# A fleet: a host whose agent wrote no heartbeat (agent_stats, every 5 s) for this long is
# gone, and the leader rolls up and compacts its devices (a host only `import` wrote has none)
HOST_GONE_S = 120.0


class StepResult(NamedTuple):
    rolled_up_minutes: int  # summed over the hosts rolled up (a fleet's leader: gone ones too)
    rollup_rows: int
    deleted: dict[str, int]
    late_minutes: int = 0  # already rolled-up minutes rolled up again for late samples
    backlog: bool = False  # a budget ran out: more of the same work is waiting

    @property
    def busy(self) -> bool:
        """True when there was work (steady state: the last few seconds' rows each step)."""
        return bool(self.rolled_up_minutes or self.late_minutes or any(self.deleted.values()))


class Retention:
    def __init__(self, *, raw_s: float, rollup_s: float, step_rows: int,
                 clock: Clock = SYSTEM_CLOCK, grace_s: float = GRACE_S,
                 minutes_per_step: int = 2, second_s: float | None = None,
                 compact_after_s: float = 600.0, compact_sets_per_step: int = 8) -> None:
        second_s = max(raw_s, min(14 * 86400.0, rollup_s)) if second_s is None else second_s
        if (raw_s <= 0 or rollup_s <= 0 or step_rows < 1 or minutes_per_step < 1
                or second_s <= 0):
            raise ValueError(f"bad retention settings: raw_s={raw_s}, rollup_s={rollup_s}, "
                             f"step_rows={step_rows}, minutes_per_step={minutes_per_step}, "
                             f"second_s={second_s}")
        self.raw_s = raw_s
        self.compact_after_s = compact_after_s
        self.compact_sets_per_step = compact_sets_per_step
        self.second_s = second_s
        self.rollup_s = rollup_s
        self.step_rows = step_rows
        self.grace_s = grace_s
        self.minutes_per_step = minutes_per_step
        self._clock = clock
        self._late: set[float] = set()  # minute starts written to after they could be rolled up
        self.late_minutes_lost = 0  # late minutes not kept: MAX_LATE_MINUTES was reached
        self._own = _Scope()  # this agent's devices: every one on SQLite, its host's in a fleet
        self._gone: dict[int, _Scope] = {}  # leading a fleet: hosts whose agents are gone
        self._partition_day: int | None = None  # PostgreSQL: the day whose partitions exist
        self._oldest_end_s: float | None = None  # and the oldest partition's end, once read
        # events of unlisted names before this are deleted (None: not sought since the start)
        self._unlisted_from: float | None = None
        # catching up: (monotonic s, watermark) when this stretch of backlog began, for the rate
        self._catch_up_from: tuple[float, float] | None = None
        self.last_backlog = False
        self.lock = StoreWideLock()
        # whether the last step held the store-wide lock (None before the first step)
        self.leading: bool | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], clock: Clock = SYSTEM_CLOCK) -> Retention:
        return cls(raw_s=config["retention.raw_s"], rollup_s=config["retention.rollup_s"],
                   second_s=config["retention.second_s"],
                   compact_after_s=config["retention.compact_after_s"],
                   step_rows=config["retention.step_rows"], clock=clock)

    def step(self, store: Store) -> StepResult:
        """One bounded step. On SQLite: roll up a few minutes of every device, compact, then
        delete a few old rows. On a shared PostgreSQL every agent rolls up and compacts its
        own host's devices; the holder of the store-wide lock also deletes by age, keeps the
        partitions and rolls up and compacts the hosts whose agents are gone
        (``HOST_GONE_S``). A step that fails while leading gives the lock up, so that
        another agent can take it."""
        from vramscope.agent.store import maintenance as sql

        fleet = store.dialect == "postgresql"
        leading = self.lock.acquire(store)
        if leading and not self.leading:  # newly leading: what another leader did is in the
            self._forget_store_state()    # store only
        self.leading = leading
        try:
            return self._step(store, sql, fleet, leading)
        except BaseException:
            if leading:
                self.lock.release()
                self.leading = False
            raise

    def close(self) -> None:
        """The agent stops: another agent of the fleet takes the store-wide work over."""
        self.lock.release()
        self.leading = False

    def _forget_store_state(self) -> None:
        self._own.forget()
        self._gone = {}
        self._partition_day = self._oldest_end_s = None
        self._catch_up_from = None
        self._unlisted_from = None

    @property
    def _watermark(self) -> float | None:
        """The end of the last rolled-up minute of this agent's own devices (every device's
        on SQLite), once known."""
        return self._own.watermark

    def _step(self, store: Store, sql: ModuleType, fleet: bool, leading: bool) -> StepResult:
        now_s = self._clock.time_s()
        own = self._own
        if fleet:  # this host's devices (new ones appear with their first rows)
            own.ids = sql.host_device_ids_of(store, store.host_name)
        # the hosts whose agents are gone (leading a fleet): their rows still go through the
        # tiers, rolled up and compacted by the leader
        scopes = [own, *(self._gone_scopes(store, sql, now_s) if leading and fleet else ())]
        minutes = rows = 0
        behind = False
        for scope in scopes:
            m, r = self._rollup(store, sql, now_s, scope)
            minutes, rows = minutes + m, rows + r
            behind = behind or m == self.minutes_per_step and self._behind(scope, now_s)
        late = self._rollup_late(store, sql, own, now_s)
        deleted: dict[str, int] = {}
        more_to_drop = False
        if leading:
            if fleet:  # raw samples go once old and rolled up, whoever rolls their host up
                first = sql.first_unrolled_ts(store, now_s - max(self.rollup_s, self.second_s))
                raw_cutoff: float | None = now_s - self.raw_s if first is None \
                    else min(now_s - self.raw_s, first)
            else:
                raw_cutoff = None if own.watermark is None else min(now_s - self.raw_s,
                                                                     own.watermark)
            deleted, more_to_drop = self._delete(store, sql, now_s, raw_cutoff)
        # after the deletes: rows old enough to go are not packed into blocks first
        compacted = False
        for scope in scopes:
            compacted = self._compact(store, now_s, scope) or compacted
        backlog = (behind or bool(self._late) or more_to_drop or compacted
                   or any(n >= self.step_rows for k, n in deleted.items()
                          if k not in ("rollups", "seconds", "partitions")))
        self._note_progress(backlog)
        return StepResult(minutes, rows, deleted, late, backlog)

    def _behind(self, scope: _Scope, now_s: float) -> bool:
        return scope.watermark is not None and \
            scope.watermark < _floor_minute(now_s - self.grace_s)

    def _gone_scopes(self, store: Store, sql: ModuleType, now_s: float) -> list[_Scope]:
        """The hosts but this one whose agents wrote no heartbeat (``agent_stats``) for
        ``HOST_GONE_S``: one scope each, its watermark kept while the host stays gone."""
        gone = sql.hosts_devices(store, stale_before_s=now_s - HOST_GONE_S,
                                 but=store.host_name)
        scopes = {}
        for host_id, ids in gone.items():
            scope = self._gone.get(host_id) or _Scope()
            scope.ids = ids
            scopes[host_id] = scope
        self._gone = scopes
        return list(scopes.values())

    def _delete(self, store: Store, sql: ModuleType, now_s: float,
                raw_cutoff: float | None) -> tuple[dict[str, int], bool]:
        """Deletion by age (store-wide); ``raw_cutoff``: where raw rows may go (old and rolled
        up), None while nothing is rolled up."""
        dropped, more_to_drop = self._partitions(store, now_s, raw_cutoff)
        from vramscope.agent.store import sample_blocks as blocks
        from vramscope.agent.store.schema import event_blocks

        cutoff = now_s - self.raw_s if raw_cutoff is None else raw_cutoff
        deleted = {
            "partitions": dropped,
            # PostgreSQL: a day partition's rows go with their partition (above); rows are
            # deleted only from the default, which holds the days without one
            "samples": sql.delete_older(
                store, "samples_default" if store.dialect == "postgresql" else "samples",
                cutoff, self.step_rows) if raw_cutoff is not None else 0,
            # the cheap events at the raw cutoff (their minute counted: event_counts), then
            # the names no table lists, then every event at the rollups' horizon
            "events": sql.delete_older(store, "events", cutoff, self.step_rows,
                                       names=CHEAP_EVENTS)
            + self._delete_unlisted(store, sql, cutoff, now_s)
            + sql.delete_older(store, "events", now_s - self.rollup_s, self.step_rows),
            "agent_stats": sql.delete_older(store, "agent_stats", now_s - self.raw_s,
                                            self.step_rows),
            # the engine's verdicts: as long as the rollups they speak about
            "verdicts": sql.delete_older(store, "verdicts", now_s - self.rollup_s,
                                         self.step_rows),
            "device_verdicts": sql.delete_older(store, "device_verdicts",
                                                now_s - self.rollup_s, self.step_rows),
            "rollups": sql.delete_rollups_older(store, now_s - self.rollup_s,
                                                self.minutes_per_step),
            "seconds": sql.delete_seconds_older(store, now_s - self.second_s,
                                                self.minutes_per_step),
            "future": self._delete_future(store, sql, now_s),
            # the compact raw tier: whole blocks past the raw cutoff
            "sample_blocks": blocks.delete_older(store, cutoff, self.step_rows)
            if raw_cutoff is not None else 0,
            "event_blocks": blocks.delete_older(store, cutoff, self.step_rows, event_blocks)
            if raw_cutoff is not None else 0,
        }
        return deleted, more_to_drop

    def _compact(self, store: Store, now_s: float, scope: _Scope) -> bool:
        """Move a few closed intervals (ended ``compact_after_s`` ago) into the compact raw
        tier, samples (:mod:`~vramscope.agent.store.sample_blocks`) and frequent events
        (:mod:`~vramscope.agent.store.event_blocks`) alike, their rows before the watermark
        (rolled up and counted: the rollups read new rows from the tables); whether the
        step's budget ran out (more are due). ``scope``: whose devices, and their watermark."""
        watermark = scope.watermark
        if watermark is None:
            return False
        from vramscope.agent.store import event_blocks, sample_blocks

        closed_by = now_s - self.compact_after_s
        more = False
        for tier in (sample_blocks, event_blocks):
            left = self.compact_sets_per_step
            while left > 0:  # a look-up finds each device's oldest due interval
                due = tier.due_sets(store, closed_by, left, watermark, scope.ids)
                if not due:
                    break
                for start, did in due:
                    tier.compact_interval(store, did, start, watermark)
                left -= len(due)
            more = more or left <= 0
        return more

    def _delete_unlisted(self, store: Store, sql: ModuleType, raw_cutoff: float,
                         now_s: float) -> int:
        """Delete the events older than ``raw_cutoff`` whose name the event table does not
        list: the next ``UNLISTED_SCAN_S`` of the time index after where the last step stopped
        (after a start, from the oldest event the rollups still keep). A step whose row budget
        ran out reads its stretch again next time; one that did not moves on."""
        start = self._unlisted_from
        if start is None:
            oldest = sql.oldest_event_ts(store, raw_cutoff)
            start = raw_cutoff if oldest is None else max(oldest, now_s - self.rollup_s)
            self._unlisted_from = start
        end = min(raw_cutoff, start + UNLISTED_SCAN_S)
        if end <= start:
            return 0
        deleted = int(sql.delete_unlisted_events(store, start, end, self.step_rows))
        if deleted < self.step_rows:
            self._unlisted_from = end
        return deleted

    def _note_progress(self, backlog: bool) -> None:
        self.last_backlog = backlog
        if not backlog or self._watermark is None:
            self._catch_up_from = None
        elif self._catch_up_from is None:
            self._catch_up_from = (self._clock.monotonic_s(), self._watermark)

    def progress(self) -> dict[str, Any] | None:
        """How far the rollups are behind while catching up (``None`` when they are not):
        ``rolled_up_to_s`` (the watermark), ``behind_s`` (of data time still to roll up),
        ``rate`` (data seconds rolled up per second since the catching up began) and
        ``eta_s`` (``behind_s / rate``; None until a rate is known)."""
        if not self.last_backlog or self._watermark is None:
            return None
        now_s = self._clock.time_s()
        behind = max(0.0, _floor_minute(now_s - self.grace_s) - self._watermark)
        rate = None
        if self._catch_up_from is not None:
            began_s, from_s = self._catch_up_from
            elapsed = self._clock.monotonic_s() - began_s
            if elapsed > 0 and self._watermark > from_s:
                rate = (self._watermark - from_s) / elapsed
        return {"rolled_up_to_s": self._watermark, "behind_s": behind,
                "rate": None if rate is None else round(rate, 1),
                "eta_s": None if rate is None else round(behind / rate, 1)}

    def _delete_future(self, store: Store, sql: ModuleType, now_s: float) -> int:
        after = now_s + FUTURE_S
        n = int(sql.delete_newer(store, "samples", after, self.step_rows)
                + sql.delete_newer(store, "events", after, self.step_rows))
        if n:
            log.warning("retention deleted %d samples and events timed more than %.0f s after "
                        "the agent's clock (a client's clock was wrong, or a hand edit)", n,
                        FUTURE_S)
        return n

    def _partitions(self, store: Store, now_s: float,
                    cutoff_s: float | None) -> tuple[int, bool]:
        """PostgreSQL (samples partitioned by day, :mod:`vramscope.agent.store.partitions`):
        the partitions of tomorrow and the day after made ahead of their writes, once a day,
        and the oldest partition dropped once wholly before ``cutoff_s`` (the raw samples'
        cutoff: old and rolled up); (partitions dropped, whether another one is droppable
        already). The partition list is read only when the cutoff reaches the oldest one's
        upper bound (and once a day), so a step with nothing to drop sends nothing.

        Never today's: a day's partition is made before its first row, so the rows that miss
        one (the first day of a new database, a day the agent was down over) stay in the
        default and are deleted as rows, instead of being moved at once."""
        if store.dialect != "postgresql":
            return 0, False
        from vramscope.agent.store import partitions

        today = partitions.day_of(now_s)
        if self._partition_day != today:
            day = DAY_S
            if partitions.ensure_days(store, now_s + day, now_s + 2 * day) is not None:
                self._partition_day = today
            self._oldest_end_s = None  # read the list again
        if cutoff_s is None or (self._oldest_end_s is not None
                                and cutoff_s < self._oldest_end_s):
            return 0, False
        result = partitions.drop_before(store, cutoff_s)
        if result is None:  # the locks were not had: the next step tries again
            return 0, False
        self._oldest_end_s = result.oldest_end_s
        if result.names:
            log.info("dropped partition %s: all of it older than %.0f", result.names, cutoff_s)
        return len(result.names), (result.oldest_end_s is not None
                                   and result.oldest_end_s <= cutoff_s)

    def note_written(self, samples: Sequence[Sample], events: Sequence[Event] = ()) -> None:
        """Remember the minutes of committed samples and events that a step may already have
        rolled up (older than the grace): their rollups and event counts are made again.
        Called by the writer thread after each commit: a ``min`` over the batch when nothing is
        late, which is the steady state."""
        if not samples and not events:
            return
        cutoff = _floor_minute(self._clock.time_s() - self.grace_s)
        if min(map(_TS, samples), default=cutoff) >= cutoff \
                and min(map(_TS, events), default=cutoff) >= cutoff:
            return
        late = {_floor_minute(ts) for ts in chain(map(_TS, samples), map(_TS, events))
                if ts < cutoff}
        for minute in late:
            if minute in self._late:
                continue
            if len(self._late) >= MAX_LATE_MINUTES:
                self.late_minutes_lost += 1
                continue
            self._late.add(minute)

    def _rollup_late(self, store: Store, sql: ModuleType, scope: _Scope, now_s: float) -> int:
        """Roll up again a few remembered late minutes (this agent's own writes) that the
        watermark has passed; minutes after it are the regular path's, minutes past
        ``rollup_s`` are not kept anyway."""
        oldest_kept = now_s - self.rollup_s
        watermark = scope.watermark
        self._late = {m for m in self._late
                      if watermark is not None and oldest_kept <= m <= watermark}
        redo = sorted(self._late)[:self.minutes_per_step]
        for minute in redo:
            sql.rollup_window(store, minute, minute + MINUTE_S, ids=scope.ids)
            self._late.discard(minute)
        return len(redo)

    def _rollup(self, store: Store, sql: ModuleType, now_s: float,
                scope: _Scope) -> tuple[int, int]:
        """Roll up the minutes after the scope's watermark, skipping any gap without
        samples."""
        if scope.ids is not None and not scope.ids:
            return 0, 0
        if not scope.watermark_known:
            scope.watermark, scope.watermark_known = \
                sql.rollup_watermark(store, scope.ids), True
        due_end = _floor_minute(now_s - self.grace_s)
        if scope.watermark is not None and scope.watermark >= due_end:
            return 0, 0  # no minute is due yet (a step every 30 s: every other one)
        first = sql.oldest_sample_ts(store, scope.watermark, scope.ids)
        if first is None:
            return 0, 0
        # rows older than every tier keeps would be rolled up only to be deleted: start at the
        # oldest minute a tier keeps (a row at -1e300 or 1970 must not hold the watermark back,
        # where start + two minutes is start again, and no minute is ever rolled up)
        start = _floor_minute(max(first, now_s - max(self.rollup_s, self.second_s)))
        end = min(due_end, start + self.minutes_per_step * MINUTE_S)
        if end <= start:
            return 0, 0
        rows = sql.rollup_window(store, start, end, ids=scope.ids)
        # the window is done even where it had no samples: the next step seeks past it
        scope.watermark = end
        return int((end - start) // MINUTE_S), rows


class _Scope:
    """The devices one agent rolls up and compacts together, with the end of their last
    rolled-up minute: every device (SQLite, ``ids`` None), or one host's (a fleet)."""

    def __init__(self, ids: list[int] | None = None) -> None:
        self.ids = ids
        self.watermark: float | None = None
        self.watermark_known = False

    def forget(self) -> None:
        self.watermark, self.watermark_known = None, False


def _floor_minute(ts_s: float) -> float:
    return (ts_s // MINUTE_S) * MINUTE_S
