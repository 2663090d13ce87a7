"""The background sampler: a named daemon thread that reads sources and hands records to a sink.

Drift-free: each task has its own :class:`vramscope.agent.clock.Schedule`, advanced by its
interval, so a slow read does not push later samples back; a task more than an interval behind
skips ahead instead of bursting. A task is any object with ``read()`` and an ``interval_s`` (read
again after every run), optionally ``start_delay_s``. A source's failure is counted and logged
once, never stops the thread; ``run_once()`` runs what is due, for tests (docs/hooks.md).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Protocol

from vramscope.agent.clock import SYSTEM_CLOCK, Clock, Schedule
from vramscope.hooks.sink import Record, RecordSink

log = logging.getLogger("vramscope.hooks")


class Source(Protocol):
    """A plain source: one read, on whatever schedule the caller keeps."""

    def read(self) -> Record | list[Record] | None: ...


class Task(Source, Protocol):
    """A source with its own interval (an attribute or a property; read after every run)."""

    @property
    def interval_s(self) -> float: ...


class Every:
    """Gives a plain source (``read()`` only) a fixed interval."""

    def __init__(self, source: Source, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"sampling interval must be > 0 s, got {interval_s!r}")
        self.source = source
        self.interval_s = interval_s

    def read(self) -> Record | list[Record] | None:
        return self.source.read()


class Sampler:
    def __init__(self, sink: RecordSink, tasks: Sequence[Task], *, clock: Clock = SYSTEM_CLOCK,
                 name: str = "vramscope-sampler") -> None:
        self.sink = sink
        self.tasks = list(tasks)
        self.name = name
        self._clock = clock
        self._schedules: list[Schedule | None] = [None] * len(self.tasks)  # None: not started
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.records_put = 0
        self.failures = 0

    def run_once(self) -> int:
        """Run every task that is due now; returns how many records went to the sink."""
        now = self._clock.monotonic_s()
        put = 0
        for i, task in enumerate(list(self.tasks)):
            schedule = self._schedules[i]
            if schedule is None:
                delay_s: float = getattr(task, "start_delay_s", 0)  # e.g. snapshots: not at once
                schedule = self._schedules[i] = Schedule(task.interval_s, now + delay_s)
            if not schedule.is_due(now):
                continue
            put += self._run_task(task)
            schedule.advance(now, task.interval_s)  # read after the run: a task may change it
        self.records_put += put
        return put

    def _run_task(self, task: Task) -> int:
        try:
            got = task.read()
        except Exception as exc:  # a broken source must not stop the others
            self.failures += 1
            if self.failures == 1:
                # text only: a log record holding exc would keep its frames' locals alive
                log.warning("vramscope: sampler task %r failed: %s", type(task).__name__,
                            repr(exc))
            return 0
        if got is None:
            return 0
        records = got if isinstance(got, list) else [got]
        for record in records:
            self.sink.put(record)
        return len(records)

    def add(self, task: Task) -> None:
        """Add a task while running (its schedule slot first, so the loop never misses it)."""
        self._schedules.append(None)
        self.tasks.append(task)

    def seconds_until_due(self) -> float:
        now = self._clock.monotonic_s()
        pending = [s.next_s for s in self._schedules if s is not None]
        if len(pending) < len(self._schedules):
            return 0.0
        return max(0.0, min(pending, default=now + 1.0) - now)

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.run_once()
            self._stop.wait(self.seconds_until_due())
