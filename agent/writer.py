"""The one writer to the database: a bounded queue drained in batches by one thread.

Every record the agent keeps goes through :meth:`Writer.put`, which never blocks: when the
queue is full the *oldest* record is dropped and counted (the newest data is the most useful
during an incident). Batches commit at ``batch_rows`` records or ``batch_interval_s``; other
database work (process rows, stats, retention steps) runs as small tasks on the same thread, so
SQLite only ever sees one writer. A locked, full or unreachable database keeps the batch and
retries with backoff (two log lines, not one per attempt); a batch refused for good is halved
until the refused records are found, and only they are dropped (``refused_total``), so one
client's bad record never costs another its rows. docs/agent.md, "The writer".
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from vramscope.agent.errors import StoreError
from vramscope.agent.records import Event, PostMortem, Sample

if TYPE_CHECKING:
    from vramscope.agent.store import Store

log = logging.getLogger("vramscope.writer")

Task = Callable[["Store"], None]  # called with the store, on the writer thread
Record = Sample | Event | PostMortem
MAX_TASKS = 1000
# Checked in this order: IntegrityError and DataError derive from DatabaseError, and would
# fail again however often they were retried.
_PERMANENT = ("IntegrityError", "DataError", "ProgrammingError", "NotSupportedError")
_TRANSIENT = ("OperationalError", "DatabaseError", "InterfaceError", "TimeoutError")
REFUSED_LOG_INTERVAL_S = 60.0  # at most one log line per minute about refused records


@dataclass
class WriterStats:
    written_total: int = 0  # rows committed
    dropped_total: int = 0  # records dropped: queue full, refused by the DB, unwritten at stop
    refused_total: int = 0  # of those, records the database refused for good (also in dropped)
    failed_attempts: int = 0  # commits that failed (transient), cumulative
    batches_total: int = 0
    tasks_failed: int = 0


class Writer:
    def __init__(self, store: Store, *, max_records: int = 100_000, batch_rows: int = 2000,
                 batch_interval_s: float = 0.5,
                 on_batch: Callable[[list[Sample], list[Event]], None] | None = None,
                 on_postmortem: Callable[[PostMortem], PostMortem] | None = None,
                 max_backoff_s: float = 5.0) -> None:
        if max_records < 1 or batch_rows < 1:
            raise ValueError(f"max_records and batch_rows must be >= 1, got {max_records}, "
                             f"{batch_rows}")
        self.store = store
        self.stats = WriterStats()
        self._max = max_records
        self._batch_rows = batch_rows
        self._interval_s = batch_interval_s
        self._on_batch = on_batch
        self._on_postmortem = on_postmortem  # the engine's cause, on the engine's thread
        self._max_backoff_s = max_backoff_s
        self._queue: deque[Record] = deque()
        self._tasks: deque[Task] = deque(maxlen=MAX_TASKS)
        self._cond = threading.Condition()
        # one batch committed at a time: flush() on another thread (tests, stop) while the
        # writer thread runs would otherwise commit the same pending batch twice
        self._commit_lock = threading.Lock()
        self._pending: list[Record] | None = None  # a batch that failed and will be retried
        self._failing_since: float | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        # --- idempotent batches (fleet on PostgreSQL; added by the fleet work, issue 9) ------
        self._origin = _origin_for(store)
        self._next_seq = 0
        self._batch_seq = 0  # first seq of the pending batch; a retry reuses it
        self._refused_logged_at: float | None = None
        self._refused_unlogged = 0

    # --- producers (any thread; never block) ----------------------------------------------
    def put(self, record: Record) -> None:
        with self._cond:
            if len(self._queue) >= self._max:
                self._queue.popleft()
                self.stats.dropped_total += 1
            self._queue.append(record)
            if len(self._queue) in (1, self._batch_rows):  # woken on first record, or full
                self._cond.notify()

    def put_many(self, records: Iterable[Record]) -> None:
        with self._cond:
            was_empty = not self._queue
            self._queue.extend(records)
            excess = len(self._queue) - self._max
            for _ in range(max(0, excess)):
                self._queue.popleft()
            self.stats.dropped_total += max(0, excess)
            if was_empty or len(self._queue) >= self._batch_rows:
                self._cond.notify()

    def submit(self, task: Task) -> None:
        """Run ``task(store)`` on the writer thread, after the current batch."""
        with self._cond:
            self._tasks.append(task)
            self._cond.notify()

    @property
    def queue_depth(self) -> int:
        return len(self._queue) + len(self._pending or ())

    @property
    def failing(self) -> bool:
        return self._failing_since is not None

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="vramscope-writer", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Final flush: write everything queued (for up to ``timeout_s``), then stop."""
        with self._cond:
            self._stopping = True
            self._stop_deadline = time.monotonic() + timeout_s
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout_s + 1.0)
        else:
            self.flush()

    def flush(self) -> None:
        """Write everything queued and run the tasks, on the calling thread (tests, stop)."""
        while self.run_once():
            pass
        self._run_tasks()

    # --- the writer thread ----------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            self._wait_for_batch()
            self.run_once()
            self._run_tasks()
            if self._failing_since is not None:
                self._sleep_backoff()
            if self._stopping and (self._drained() or self._past_deadline()):
                break
        self._give_up_if_stuck()

    def _wait_for_batch(self) -> None:
        """Sleep until a batch is due: idle (nothing queued) until woken by a put or a task,
        then at most ``batch_interval_s`` for the batch to fill, unless a task waits (retention
        catching up submits its steps back to back: each waited half a second)."""
        with self._cond:
            while (not self._queue and not self._tasks and self._pending is None
                   and not self._stopping):
                self._cond.wait()
            deadline = time.monotonic() + self._interval_s
            while (len(self._queue) < self._batch_rows and not self._tasks
                   and not self._stopping):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)

    def run_once(self) -> bool:
        """Commit one batch (the pending one first). True if a batch was committed."""
        with self._commit_lock:
            return self._run_once()

    def _run_once(self) -> bool:
        batch = self._pending if self._pending is not None else self._take()
        if not batch:
            return False
        if self._pending is None:  # a new batch is numbered once; its retries reuse the numbers
            self._batch_seq = self._next_seq
            self._next_seq += len(batch)
        self._pending = batch
        try:
            self._commit(batch)
        except Exception as exc:  # noqa: BLE001 - the DB's failures must not kill the writer
            return self._failed(batch, exc)
        self._pending = None
        self._recovered()
        return True

    def _take(self) -> list[Record]:
        with self._cond:
            n = min(self._batch_rows, len(self._queue))
            return [self._queue.popleft() for _ in range(n)]

    def _commit(self, batch: list[Record]) -> None:
        """Write ``batch``; what got committed is removed from it, so a retry never repeats it."""
        samples = [r for r in batch if isinstance(r, Sample)]
        events = [r for r in batch if isinstance(r, Event)]
        if samples or events:
            self.store.write(samples, events, **self._idempotency())
            self.stats.written_total += len(samples) + len(events)
            batch[:] = [r for r in batch if isinstance(r, PostMortem)]
            self._notify_batch(samples, events)
        while batch:
            self.store.write_postmortem(self._completed(cast(PostMortem, batch[0])))
            batch.pop(0)
            self.stats.written_total += 1
        self.stats.batches_total += 1

    def _idempotency(self) -> dict[str, Any]:
        """``(origin, seq)`` keys, so a batch retried after a lost commit reply (the commit
        happened, the answer never came) inserts nothing twice. Off on SQLite: a local commit
        has no reply to lose, and the keyed insert is slower than its fast path."""
        if self._origin is None:
            return {}
        return {"origin": self._origin, "first_seq": self._batch_seq}

    def _completed(self, pm: PostMortem) -> PostMortem:
        if self._on_postmortem is None:
            return pm
        try:
            return self._on_postmortem(pm)
        except Exception:  # noqa: BLE001 - analysis must never stop the writer
            log.exception("the post-mortem callback (alert engine) failed; storing it as sent")
            return pm

    def _notify_batch(self, samples: list[Sample], events: list[Event]) -> None:
        if self._on_batch is None:
            return
        try:
            self._on_batch(samples, events)
        except Exception:  # noqa: BLE001 - analysis must never stop the writer
            log.exception("the batch callback (alert engine) failed; continuing")

    def _failed(self, batch: list[Record], exc: Exception) -> bool:
        if not _is_transient(exc):
            self._pending = None
            return self._isolate(batch, exc)
        return self._retry_later(exc)

    def _isolate(self, batch: list[Record], exc: Exception) -> bool:
        """Halve a refused batch until each part commits or is one refused record; only those
        are dropped. A transient failure on the way keeps the part that failed as the pending
        batch and puts the rest back at the head of the queue, in order."""
        if len(batch) == 1:
            self._refuse(batch[0], exc)
            return True
        mid = len(batch) // 2
        parts = [batch[:mid], batch[mid:]]
        while parts:
            part = parts.pop(0)
            self._batch_seq, self._next_seq = self._next_seq, self._next_seq + len(part)
            try:
                self._commit(list(part))
            except Exception as part_exc:  # noqa: BLE001 - classified just below
                if _is_transient(part_exc):
                    self._pending = part
                    with self._cond:
                        self._queue.extendleft(reversed([r for p in parts for r in p]))
                    return self._retry_later(part_exc)
                if len(part) == 1:
                    self._refuse(part[0], part_exc)
                else:
                    half = len(part) // 2
                    parts[0:0] = [part[:half], part[half:]]
        self._recovered()
        return True

    def _refuse(self, record: Record, exc: Exception) -> None:
        """One record the database will never take: drop and count it; log at most one line
        a minute (a client that sends only bad records must not flood the log)."""
        self.stats.refused_total += 1
        self.stats.dropped_total += 1
        self._refused_unlogged += 1
        now = time.monotonic()
        if (self._refused_logged_at is not None
                and now - self._refused_logged_at < REFUSED_LOG_INTERVAL_S):
            return
        log.error("the database refused %d record(s) for good; dropped them and wrote the rest "
                  "of their batch (latest: %s of pid %s: %s)", self._refused_unlogged,
                  type(record).__name__, getattr(record, "pid", None), _short(exc))
        self._refused_logged_at, self._refused_unlogged = now, 0

    def _retry_later(self, exc: Exception) -> bool:
        self.stats.failed_attempts += 1
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            self._failures_at_start = self.stats.failed_attempts - 1
            self._drops_at_start = self.stats.dropped_total
            log.warning("cannot write to the database (%s); sampling continues, %d records "
                        "wait in a bounded queue (oldest dropped beyond %d), retrying",
                        _short(exc), self.queue_depth, self._max)
        return False

    def _recovered(self) -> None:
        if self._failing_since is None:
            return
        log.warning("database writable again after %.1f s and %d failed attempts; %d records "
                    "were dropped meanwhile", time.monotonic() - self._failing_since,
                    self.stats.failed_attempts - self._failures_at_start,
                    self.stats.dropped_total - self._drops_at_start)
        self._failing_since = None

    def _sleep_backoff(self) -> None:
        """Wait out the backoff. Puts notify the same condition (a batch is ready), so the wait
        loops to its deadline: only stop() cuts it short."""
        attempts = self.stats.failed_attempts - self._failures_at_start
        delay = min(self._max_backoff_s, 0.1 * 2 ** min(attempts, 10))
        deadline = time.monotonic() + delay
        with self._cond:
            while not self._stopping and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            if self._stopping and not self._past_deadline():
                self._cond.wait(min(delay, 0.2))

    def _drained(self) -> bool:
        return self._pending is None and not self._queue

    def _past_deadline(self) -> bool:
        return time.monotonic() >= getattr(self, "_stop_deadline", float("inf"))

    def _give_up_if_stuck(self) -> None:
        lost = self.queue_depth
        if lost:
            self.stats.dropped_total += lost
            log.error("stopping with %d records unwritten: the database stayed unavailable",
                      lost)

    def _run_tasks(self) -> None:
        while self._tasks:
            task = self._tasks.popleft()
            try:
                task(self.store)
            except Exception as exc:  # noqa: BLE001 - a failed task is retried by its owner
                self.stats.tasks_failed += 1
                self._log_task_failure(task, exc)

    def _log_task_failure(self, task: Task, exc: Exception) -> None:
        """Warning, at most once a minute: a task that keeps failing (stats, retention) must be
        visible, but not a line per attempt while the database is away."""
        now = time.monotonic()
        last = getattr(self, "_task_logged_at", None)
        if last is not None and now - last < REFUSED_LOG_INTERVAL_S:
            return
        self._task_logged_at = now
        log.warning("a database task failed (%d so far; next report in a minute at most): "
                    "%r: %s", self.stats.tasks_failed, task, _short(exc))


def _origin_for(store: Store) -> str | None:
    """A name unique to this writer's lifetime (seq restarts at 0 with each writer), or None
    on SQLite. Host name first, for whoever reads the rows."""
    if getattr(store, "dialect", "sqlite") == "sqlite":
        return None
    host = str(getattr(store, "host_name", "") or "")[:40]
    return f"{host}:{uuid.uuid4().hex[:20]}"


def _is_transient(exc: Exception) -> bool:
    """Locked, full, unreachable: worth retrying. An integrity or data error, or anything
    unknown, would fail again."""
    cause = exc.__cause__ if isinstance(exc, StoreError) and exc.__cause__ else exc
    names = {c.__name__ for c in type(cause).__mro__}
    if names & set(_PERMANENT):
        return False
    return bool(names & set(_TRANSIENT)) or isinstance(cause, OSError)


def _short(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]
