"""The one writer: batches, drop-oldest bound, retries with one log line, final flush."""

from __future__ import annotations

import logging
import sqlite3
import time

from vramscope.agent.errors import StoreError
from vramscope.agent.records import Event, Phase, PostMortem, Sample
from vramscope.agent.writer import Writer


def _s(i: int) -> Sample:
    return Sample(1000.0 + i, 0, Phase.DECODE, "torch", 1, allocated_bytes=i)


class FlakyStore:
    """A real store whose writes fail ``failures`` times first, the way SQLite fails when the
    database is locked (a StoreError caused by sqlite3.OperationalError)."""

    def __init__(self, store, failures: int, error: Exception | None = None):
        self.store, self.failures, self.attempts = store, failures, 0
        self.error = error or sqlite3.OperationalError("database is locked")

    def write(self, samples, events):
        self.attempts += 1
        if self.failures > 0:
            self.failures -= 1
            raise StoreError(f"cannot write: {self.error}") from self.error
        return self.store.write(samples, events)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_commits_in_batches_of_batch_rows(store):
    w = Writer(store, batch_rows=3)
    for i in range(7):
        w.put(_s(i))
    assert [w.run_once() for _ in range(4)] == [True, True, True, False]
    assert w.stats.batches_total == 3 and w.stats.written_total == 7
    assert [s.allocated_bytes for s in store.samples()] == list(range(7))


def test_a_full_queue_drops_the_oldest_and_counts_them(store):
    w = Writer(store, max_records=5, batch_rows=100)
    for i in range(6):
        w.put(_s(i))
    w.put_many([_s(6), _s(7)])
    assert w.stats.dropped_total == 3 and w.queue_depth == 5
    w.flush()
    assert [s.allocated_bytes for s in store.samples()] == [3, 4, 5, 6, 7]


def test_samples_events_and_postmortems_are_all_written(store):
    w = Writer(store)
    pm = PostMortem(3.0, 0, 9, Phase.PREFILL, 1, 2, 3, 4, 5, 6, 0.5, message="boom")
    w.put_many([_s(0), Event(2.0, "request_start", 0, 1, None, "r1"), pm])
    w.flush()
    assert len(store.samples()) == 1
    assert [e.request_id for e in store.events()] == ["r1"]
    assert [p._replace(host=None) for _, p in store.postmortems()] == [pm]


def test_a_locked_database_is_retried_with_one_log_line_each_way(store, caplog):
    flaky = FlakyStore(store, failures=5)
    w = Writer(flaky, batch_rows=2, batch_interval_s=0.01, max_backoff_s=0.001)
    w.put_many([_s(0), _s(1), _s(2)])
    with caplog.at_level(logging.WARNING, logger="vramscope.writer"):
        w.start()
        deadline = time.monotonic() + 10
        while w.stats.written_total < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        w.stop()
    assert [s.allocated_bytes for s in store.samples()] == [0, 1, 2]  # nothing lost or doubled
    assert w.stats.failed_attempts == 5 and w.stats.dropped_total == 0
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert messages[0].startswith("cannot write to the database (cannot write: database is "
                                  "locked); sampling continues")
    assert messages[1].startswith("database writable again after")
    assert "5 failed attempts; 0 records were dropped meanwhile" in messages[1]


def test_a_record_refused_for_good_is_dropped_alone_and_not_retried(any_url, caplog):
    """The database (SQLite or PostgreSQL, really) refuses a lone surrogate: only that record
    is dropped; the other 999 rows of its batch are written, none retried."""
    from vramscope.agent.store import Store

    with Store.open(any_url, host_name="testhost") as store:
        w = Writer(store, batch_rows=1000)
        good = [_s(i) for i in range(999)]
        bad = _s(500)._replace(source="\ud800")  # what a validator missed would look like
        w.put_many([*good[:500], bad, *good[500:]])
        with caplog.at_level(logging.ERROR, logger="vramscope.writer"):
            w.flush()
        assert [s.allocated_bytes for s in store.samples()] == list(range(999))
        assert (w.stats.refused_total, w.stats.dropped_total, w.stats.failed_attempts) == (1, 1, 0)
        assert w.stats.written_total == 999
        assert "refused 1 record(s) for good; dropped them and wrote the rest" in caplog.text
        w.put(_s(5))
        w.flush()
        assert len(store.samples()) == 1000


def test_permanent_errors_are_not_transient():
    from sqlalchemy.exc import DataError, IntegrityError, OperationalError
    from vramscope.agent.writer import _is_transient

    def wrapped(exc):
        try:
            raise StoreError("cannot write") from exc
        except StoreError as err:
            return err

    assert not _is_transient(wrapped(IntegrityError("x", {}, sqlite3.IntegrityError("uniq"))))
    assert not _is_transient(wrapped(DataError("x", {}, Exception("too long"))))
    assert _is_transient(wrapped(OperationalError("x", {}, sqlite3.OperationalError("locked"))))


def test_puts_do_not_cut_the_backoff_short(store):
    """A full disk: 1.5 s of failing writes while a producer puts a batch every 10 ms. The
    backoff schedule (0.2, 0.4, 0.8 s...) allows 3-4 attempts, not one per put."""
    flaky = FlakyStore(store, failures=10_000)
    w = Writer(flaky, batch_rows=10, batch_interval_s=0.01, max_backoff_s=5.0)
    w.start()
    deadline = time.monotonic() + 1.5
    i = 0
    while time.monotonic() < deadline:
        w.put_many([_s(i + k) for k in range(10)])
        i += 10
        time.sleep(0.01)
    attempts = flaky.attempts
    flaky.failures = 0
    w.stop(timeout_s=5)
    assert 2 <= attempts <= 5, attempts


def test_stop_flushes_what_is_queued(store):
    w = Writer(store, batch_rows=10_000, batch_interval_s=30.0)
    w.start()
    w.put_many([_s(i) for i in range(5)])
    t0 = time.monotonic()
    w.stop()
    assert time.monotonic() - t0 < 5
    assert len(store.samples()) == 5 and w.queue_depth == 0


def test_tasks_run_on_the_writer_after_the_batch(store):
    w = Writer(store)
    seen = []
    w.put(_s(0))
    w.submit(lambda st: seen.append(len(st.samples())))
    w.submit(lambda st: 1 / 0)  # a failing task is counted, not fatal
    w.submit(lambda st: seen.append("after"))
    w.flush()
    assert seen == [1, "after"] and w.stats.tasks_failed == 1


def test_a_postmortem_is_stored_with_the_cause_the_engine_gives_it(store):
    # the live agent's AlertFeed.completed: the engine names growth for a pid whose leak
    # verdict holds a leak, and for its neighbour the cause of its risk episode (its alert and
    # rows said "growth (at risk from pid 1's growth)"); a callback that raises stores the
    # post-mortem as sent
    from vramscope.agent.alerts.engine import AlertEngine
    from vramscope.agent.daemon import AlertFeed

    from tests.agent.test_growth import _pair

    feed = AlertFeed(AlertEngine.from_config(None), [], None)
    feed(_pair(949), [])  # pid 1 grows 60 MiB/s from 300 s: a leak since 600 s
    grower = PostMortem(949.5, 0, 1, Phase.DECODE, 1, 2, 3, 4, 5, 6, 0.5)
    neighbour = grower._replace(pid=2, ts_s=949.6)
    live = Writer(store, on_postmortem=feed.completed)
    live.put_many([grower, neighbour])
    broken = Writer(store, on_postmortem=lambda pm: 1 / 0)
    broken.put(grower._replace(ts_s=949.7))
    for w in (live, broken):
        w.flush()
    got = [(p.pid, p.cause) for _, p in store.postmortems()]
    assert got == [(1, "growth"), (2, "growth"), (1, None)]
