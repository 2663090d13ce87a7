"""``Store.events`` by name: the same events in the same order as one ``name IN (...)`` query,
read on the ``(device_id, name, ts_s)`` index (migration 0004), one range a name under one
UNION ALL, on SQLite and PostgreSQL alike, even once statistics tell SQLite that most of a
device's events share a few names."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event, text
from vramscope.agent.records import Event, Phase
from vramscope.agent.store import Store

T0 = 1_700_000_000.0
RARE = ("oom", "kv_orphaned_blocks", "phase")
NAME_INDEX = "ix_events_device_name_ts"


def _busy_device() -> list[Event]:
    """Device 0: 1,500 requests (3,000 events) around two OOMs, an orphaned-blocks report and
    three phase changes; the OOM at T0 + 100 shares its second with a phase change written
    after it (ties go by id). Device 1 has an OOM of its own."""
    out = []
    for i in range(1500):
        out.append(Event(T0 + i, "request_start", 0, 7, None, f"r{i}"))
        out.append(Event(T0 + i + 0.5, "request_end", 0, 7, None, f"r{i}"))
    out += [Event(T0 + 100, "oom", 0, 7, None, None, {"message": "CUDA out of memory"}),
            Event(T0 + 100, "phase", 0, 7, Phase.IDLE),
            Event(T0 + 10, "phase", 0, 7, Phase.PREFILL),
            Event(T0 + 900.25, "kv_orphaned_blocks", 0, 7, None, None, {"blocks": 3}),
            Event(T0 + 1200, "oom", 0, 7),
            Event(T0 + 1300, "phase", 0, 7, Phase.DECODE),
            Event(T0 + 50, "oom", 1, 8)]
    return out


def _statements(store: Store, run: Any) -> tuple[Any, list[tuple[str, Any]]]:
    """``run()``'s result and the events queries it sent, with their parameters."""
    sent: list[tuple[str, Any]] = []

    def watch(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "FROM events" in statement:
            sent.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", watch)
    try:
        return run(), sent
    finally:
        event.remove(store.engine, "before_cursor_execute", watch)


def _plan(store: Store, statement: str, parameters: Any) -> str:
    explain = "EXPLAIN QUERY PLAN " if store.dialect == "sqlite" else "EXPLAIN "
    with store.engine.connect() as c:
        if store.dialect == "postgresql":
            # a test table is small enough for a sequential scan to win; the question is
            # which index the planner takes when it takes one
            c.exec_driver_sql("SET enable_seqscan = off")
        return "\n".join(str(r[-1]) for r in c.exec_driver_sql(explain + statement, parameters))


def test_rare_events_by_name_in_time_order_with_their_limit(any_url):
    with Store.open(any_url, host_name="h") as store:
        store.write([], _busy_device())
        got = store.events(0, T0, T0 + 2000, names=RARE)
        assert [(e.ts_s, e.name, e.phase) for e in got] == [
            (T0 + 10, "phase", Phase.PREFILL), (T0 + 100, "oom", None),
            (T0 + 100, "phase", Phase.IDLE), (T0 + 900.25, "kv_orphaned_blocks", None),
            (T0 + 1200, "oom", None), (T0 + 1300, "phase", Phase.DECODE)]
        assert got[1].data == {"message": "CUDA out of memory"} and got[3].data == {"blocks": 3}
        # the limit holds over the names together, not per name
        assert [(e.ts_s, e.name) for e in store.events(0, T0, T0 + 2000, names=RARE, limit=3)
                ] == [(T0 + 10, "phase"), (T0 + 100, "oom"), (T0 + 100, "phase")]
        # a name given twice is read once; the window bounds hold
        assert [e.ts_s for e in store.events(0, T0 + 100, T0 + 1200, names=("oom", "oom"))
                ] == [T0 + 100, T0 + 1200]
        assert [(e.device, e.ts_s) for e in store.events(names=["oom"])] == [
            (1, T0 + 50), (0, T0 + 100), (0, T0 + 1200)]
        requests = store.events(0, T0, T0 + 2000, names=("request_start", "request_end"),
                                limit=4)
        assert [(e.ts_s, e.name) for e in requests] == [
            (T0, "request_start"), (T0 + 0.5, "request_end"), (T0 + 1, "request_start"),
            (T0 + 1.5, "request_end")]
        assert len(store.events(0)) == 3006 and store.events(0, names=()) == store.events(0)


def test_every_name_lookup_reads_the_name_index(any_url):
    with Store.open(any_url, host_name="h") as store:
        store.write([], _busy_device())
        with store.engine.begin() as c:
            # statistics as a real store gathers them: with them, SQLite answers one
            # "name IN (...) ORDER BY ts_s" from the (device, time) index, every event read
            c.execute(text("ANALYZE"))
        got, sent = _statements(store, lambda: store.events(0, T0, T0 + 2000, names=RARE))
        assert len(got) == 6 and len(sent) == 1
        plan = _plan(store, *sent[0])
        # every read of events is a range of the name index, one per name
        reads = [line for line in plan.splitlines()
                 if any(w in line for w in ("SEARCH events", "SCAN events", " on events"))]
        assert len(reads) == len(RARE) and all(NAME_INDEX in line for line in reads), plan
