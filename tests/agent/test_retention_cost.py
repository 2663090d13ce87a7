"""Retention, rollups and time ranges cost the same after a week of history as after an hour
(design rule 8), on SQLite and on a real PostgreSQL.

The cost is counted, not timed, so a shared machine cannot make it flaky: on SQLite the VM
instructions a call runs (a progress handler every 1,000), on PostgreSQL the shared buffers its
statements touch (``EXPLAIN (ANALYZE, BUFFERS)`` of each statement the call ran, re-run in a
transaction that is rolled back). Both stores come from the history generator at the same rate
(2 devices, one sample per 10 s), with raw samples for all of their span and the per-second
and per-minute tiers retention makes of them: 1 hour is 720 rows, 7 days 120,960. A query that
walks the whole index (the old ``min(ts_s) WHERE ts_s >= ?``) costs 168x more on the second
store.
"""

from __future__ import annotations

import json
import os
import uuid

import pytest
from sqlalchemy import event, text
from vramscope.agent.clock import FakeClock
from vramscope.agent.retention import Retention
from vramscope.agent.store import Store
from vramscope.agent.store import maintenance as sql

from tests.support.sql_watch import statements_sent
from tools.history_generator import T_END, History, generate

HZ = 0.1
END = T_END


def _history(days: float) -> History:
    # raw for the whole span: the largest raw index a week can have (with raw_s of a week)
    return History(devices=2, hz=HZ, days=days, raw_days=None)


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql",
                                                               marks=pytest.mark.postgres)])
def backend(request, tmp_path_factory):
    """(make_url, cost) for one backend; make_url(name) gives a fresh, empty database."""
    if request.param == "sqlite":
        root = tmp_path_factory.mktemp("cost")
        return (lambda name: f"sqlite:///{root / name}.db"), _sqlite_cost
    server = request.getfixturevalue("postgres_server")
    base = os.environ.get("VRAMSCOPE_TEST_POSTGRES_URL")

    def make(name: str) -> str:
        unique = f"c_{name}_{uuid.uuid4().hex[:8]}"
        if server is not None:
            return server.create_database(unique)
        import psycopg
        with psycopg.connect(base.replace("postgresql+psycopg://", "postgresql://"),
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{unique}"')
        return base.rsplit("/", 1)[0] + "/" + unique
    return make, _postgres_cost


@pytest.fixture(scope="module")
def stores(backend):
    """The same generated history, 1 hour and 7 days long, ending at the same time."""
    make_url, cost = backend
    opened = {}
    for name, days in (("hour", 1 / 24), ("week", 7.0)):
        store = Store.open(make_url(name), host_name="h")
        generate(store, _history(days))
        opened[name] = store
    yield opened, cost
    for store in opened.values():
        store.close()


def _sqlite_cost(store: Store, call) -> int:
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    def watch(conn, *_):
        conn.connection.dbapi_connection.set_progress_handler(count, 1000)

    event.listen(store.engine, "before_cursor_execute", watch)
    try:
        call()
    finally:
        event.remove(store.engine, "before_cursor_execute", watch)
    return steps[0]


def _postgres_cost(store: Store, call) -> int:
    with statements_sent(store.engine, lambda statement: statement.lstrip().upper().startswith(
            ("SELECT", "DELETE", "INSERT", "UPDATE"))) as ran:
        call()
    blocks = 0
    with store.engine.connect() as c, c.begin() as tx:  # replayed in order, then undone
        for statement, parameters in ran:
            for params in parameters if isinstance(parameters, list) else [parameters]:
                plan = c.exec_driver_sql(
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params).scalar()
                top = (json.loads(plan) if isinstance(plan, str) else plan)[0]
                # the plan's blocks, not its planning's: planning reads the catalogs, as many
                # blocks as the session has not cached yet (a test run alone read 48 more on
                # the week's store than after the tests before it), whatever the data's size
                blocks += _buffers(top["Plan"])
        tx.rollback()
    return blocks


def _buffers(node: dict) -> int:
    return node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)


def _assert_flat(stores, call_of, slack: int = 2, extra: int = 0) -> tuple[int, int]:
    """``call_of(store)`` costs about the same on both stores (``slack`` x + a constant for
    one more B-tree level, + ``extra``)."""
    opened, cost = stores
    hour = cost(opened["hour"], lambda: call_of(opened["hour"]))
    week = cost(opened["week"], lambda: call_of(opened["week"]))
    assert week <= slack * hour + 20 + extra, (hour, week)
    return hour, week


def test_the_first_sample_after_the_watermark_is_one_seek_per_device(stores):
    found = []
    _assert_flat(stores, lambda s: found.append(sql.oldest_sample_ts(s, END - 600)))
    assert found == [END - 600, END - 600]


def test_the_watermark_is_one_seek_per_device(stores):
    found = []
    _assert_flat(stores, lambda s: found.append(sql.rollup_watermark(s)))
    assert found == [END, END]  # the generator rolled up to the last minute's end


def test_a_rollup_window_reads_only_its_minutes(stores):
    written = []
    _assert_flat(stores, lambda s: written.append(sql.rollup_window(s, END - 300, END - 180)))
    # 2 devices x 2 minutes x 13 metrics with values (largest_free_block_bytes is never set)
    assert written == [52, 52]


def test_a_delete_with_nothing_to_do_costs_nothing_whatever_the_history(stores):
    deleted = []
    start = {id(s): s_start(s) for s in stores[0].values()}  # outside the call counted
    _assert_flat(stores, lambda s: deleted.append(
        sql.delete_older(s, "samples", start[id(s)] - 1, 1000)))
    assert deleted == [0, 0]


def test_a_delete_costs_its_rows_not_the_history(stores):
    deleted = []
    start = {id(s): s_start(s) for s in stores[0].values()}  # outside the call counted
    # slack 8: each deleted row is a primary-key lookup, one or two B-tree levels deeper in
    # the week's index (PostgreSQL: 10 buffers on the hour, 77 on the week; a scan: 2,700)
    for table in ("samples", "events"):
        _assert_flat(stores, lambda s, t=table: deleted.append(
            sql.delete_older(s, t, start[id(s)] + 3600, 20)), slack=8)
    _assert_flat(stores, lambda s: deleted.append(
        sql.delete_rollups_older(s, start[id(s)] + 3600, 2)))
    # 2 minutes of each device, and its first ten-minute group (it ended before the cutoff);
    # the event counts of each device's first two minutes that had any: a request started at
    # tick 0 of device 0, one ended at tick 20 of device 1 (one sample per 10 s)
    assert deleted == [20, 20, 20, 20, 2 * 13 * 2 + 2 * 13 + 2, 2 * 13 * 2 + 2 * 13 + 2]


def test_a_retention_step_at_steady_state_costs_the_same_at_any_age(stores):
    results = []

    def step(s: Store) -> None:
        # compaction past the history (the stores keep their raw rows in ``samples``, whose
        # costs these tests count): its look-up for due intervals still runs, a seek a device
        r = Retention(raw_s=8 * 86_400, rollup_s=30 * 86_400, step_rows=100,
                      clock=FakeClock(END + 300), compact_after_s=8 * 86_400)
        results.append(r.step(s))
    _assert_flat(stores, step)
    assert [(r.rolled_up_minutes, sum(r.deleted.values()), r.backlog) for r in results] == \
        [(0, 0, False)] * 2


def _day_partitions(store: Store) -> int:
    if store.dialect != "postgresql":
        return 0
    with store.engine.connect() as c:
        return int(c.execute(text("SELECT count(*) FROM pg_inherits "
                                  "WHERE inhparent = 'samples'::regclass")).scalar())


def test_time_range_is_two_index_seeks(stores):
    spans = []
    # on PostgreSQL samples are partitioned by day: a min and a max seek each partition's
    # index (about 3 blocks each), so the week pays per day partition the raw retention
    # keeps, never per row
    opened, _ = stores
    extra = 6 * (_day_partitions(opened["week"]) - _day_partitions(opened["hour"]))
    hour, week = _assert_flat(stores, lambda s: spans.append(s.time_range(1)), extra=extra)
    hour, week = spans
    assert hour[1] == week[1] == END - 1 / HZ
    assert week[0] < END - 6 * 86_400 < hour[0]


def s_start(store: Store) -> float:
    with store.engine.connect() as c:
        return float(c.execute(text("SELECT min(ts_s) FROM samples")).scalar())
