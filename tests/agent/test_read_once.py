"""One timeline read asks each of its repeated questions once (``read_once``), reads its
events in one statement (``Store.event_groups``) after counting them in one
(``window.event_groups_at_most``), and answers what the separate reads answered, on SQLite
and PostgreSQL."""

from __future__ import annotations

from vramscope.agent.records import Event, Phase, Sample
from vramscope.agent.store import Store, reader
from vramscope.agent.store import read_once as memo
from vramscope.agent.store import window as bounded

from tests.support.sql_watch import statements_sent

T0 = 1_700_000_040.0  # a minute boundary


def test_within_reading_a_question_is_read_once_and_outside_every_time():
    reads: list[str] = []

    def read(name: str) -> int:
        reads.append(name)
        return len(reads)

    assert memo.once("a", lambda: read("a")) == 1
    assert memo.once("a", lambda: read("a")) == 2  # outside: read as asked
    with memo.reading():
        assert memo.once("a", lambda: read("a")) == 3
        with memo.reading():  # nested: the outermost keeps the answers
            assert memo.once("a", lambda: read("a")) == 3
            assert memo.once("b", lambda: read("b")) == 4
        assert memo.once("b", lambda: read("b")) == 4
    assert memo.once("a", lambda: read("a")) == 5  # the answers went with the read
    assert reads == ["a", "a", "a", "b", "a"]


def _store(url: str) -> Store:
    """Device 0 of host "h": 600 s of samples at 1 Hz, a request every 30 s (its start and
    end), phase changes every 100 s, an OOM at T0 + 250 and a load report each minute."""
    store = Store.open(url, host_name="h")
    samples = [Sample(T0 + k, 0, Phase.DECODE if k % 10 > 6 else Phase.IDLE, "torch", 7,
                      allocated_bytes=2**30 + k, reserved_bytes=2**31) for k in range(600)]
    events = [Event(T0 + k + e, name, 0, 7, None, f"r{k}")
              for k in range(0, 600, 30) for e, name in ((0, "request_start"),
                                                          (0.5, "request_end"))]
    events += [Event(T0 + k, "phase", 0, 7, Phase.PREFILL if k % 200 else Phase.DECODE)
               for k in range(0, 600, 100)]
    events += [Event(T0 + 250, "oom", 0, 7, None, None, {"message": "CUDA out of memory"})]
    events += [Event(T0 + k, "server_load", 0, 7, None, None, {"running": k // 60})
               for k in range(0, 600, 60)]
    store.write(samples, events)
    return store


def test_event_groups_answer_each_as_events_would_in_one_statement(any_url):
    store = _store(any_url)
    groups = [(("oom", "phase"), 4), (("request_start", "request_end"), 7),
              (("server_load",), 100), (("request_start",), 1)]
    with statements_sent(store.engine, lambda s: "FROM events" in s) as sent:
        found = store.event_groups(0, T0 + 10, T0 + 500, groups, host="h")
    assert len(sent) == 1
    assert found == [store.events(0, T0 + 10, T0 + 500, host="h", names=names, limit=limit)
                     for names, limit in groups]
    # the first group cut at 4 of its 6 in time order: phases at 100, 200, the OOM, 300
    assert [(e.ts_s - T0, e.name) for e in found[0]] == [
        (100.0, "phase"), (200.0, "phase"), (250.0, "oom"), (300.0, "phase")]
    assert [e.request_id for e in found[3]] == ["r30"]
    assert [e.data["running"] for e in found[2]] == [1, 2, 3, 4, 5, 6, 7, 8]
    store.close()


def test_event_counts_of_groups_in_one_statement_as_each_counted_alone(any_url):
    store = _store(any_url)
    groups = [(("request_start", "request_end"), 10), (("request_start", "request_end"), 100),
              (("oom", "phase"), 6), (("kv_alloc",), 5)]
    with statements_sent(store.engine, lambda s: "FROM events" in s) as sent:
        counted = bounded.event_groups_at_most(store, 0, T0, T0 + 599, groups, "h")
    assert len(sent) == 1
    assert counted == [11, 40, 7, 0]  # past a limit: its limit + 1
    assert counted == [bounded.events_at_most(store, 0, T0, T0 + 599, names, limit, "h")
                       for names, limit in groups]
    assert bounded.event_groups_at_most(store, 3, T0, T0 + 599, groups, "h") == [0, 0, 0, 0]
    store.close()


def test_a_timeline_read_answers_as_its_parts_read_alone(any_url):
    """The reads a timeline shares answer as each part read on its own; the statements
    it sends are pinned (40 on SQLite before its questions were asked once; PostgreSQL reads
    the 600 buckets' last values in one statement, SQLite 500 stamps a statement)."""
    store = _store(any_url)
    span = reader.Span(0, T0 - 1, T0 + 599, "h")
    with statements_sent(store.engine, lambda s: True) as sent:
        read = reader.timeline(store, span, 600, ("allocated_bytes", "reserved_bytes"))
    assert len(sent) == (17 if store.dialect == "sqlite" else 16)
    assert read.series == reader.series(store, span, 600, ("allocated_bytes", "reserved_bytes"))
    assert read.rate == reader.requests(store, span, read.series.bucket_s)
    assert read.processes == reader.process_series(store, span, 600)
    assert [e.name for e in read.rare] == ["oom"]
    assert len(read.requests) == 40 and not read.requests_truncated
    assert [e.ts_s - T0 for e in read.load] == [float(k) for k in range(0, 600, 60)]
    assert read.phases.tier == "events" and len(read.phases.bands) == 6
    store.close()


def _verdict(ts: float, pid: int | None, state: str):
    from vramscope.agent.alerts.verdicts import Verdict

    return Verdict(ts, 0, "h", pid, state, 0.0, None, None, 0.0, state, "ok", None, (), None,
                   None, None, None, None, None)


def test_each_processes_newest_verdict_in_two_statements(any_url):
    """``verdicts.latest``: the pids walked in one recursive statement, each one's newest rows
    (and the device-wide ones) read in one: the device-wide answer first, then by pid; of two
    rows of one instant the later written unless damaged; a damaged row alone at its
    instant answers nothing; rows after ``at_s`` are not an answer yet."""
    from sqlalchemy import update
    from vramscope.agent.store import verdicts as stored
    from vramscope.agent.store.schema import verdicts

    store = _store(any_url)
    stored.write(store, [_verdict(T0 + 10, None, "no_leak"), _verdict(T0 + 20, None, "leak"),
                         _verdict(T0 + 10, 12, "no_leak"), _verdict(T0 + 30, 12, "no_leak"),
                         _verdict(T0 + 30, 12, "leak"),  # same instant, written later
                         _verdict(T0 + 10, 7, "leak"), _verdict(T0 + 40, 7, "no_leak"),
                         _verdict(T0 + 90, 3, "leak")])  # after at_s: not yet
    with statements_sent(store.engine, lambda s: "verdicts" in s) as sent:
        found = stored.latest(store, 0, "h", T0 + 60)
    assert len(sent) == 2
    assert [(v.pid, v.ts_s - T0, v.leak_state) for v in found] == [
        (None, 20.0, "leak"), (7, 40.0, "no_leak"), (12, 30.0, "leak")]
    with store.engine.begin() as c:  # damaged: pid 12's later row, pid 7's newest
        for pid, ts, state in ((12, T0 + 30, "leak"), (7, T0 + 40, "no_leak")):
            c.execute(update(verdicts).where(verdicts.c.pid == pid, verdicts.c.ts_s == ts,
                                             verdicts.c.leak_state == state)
                      .values(doc="{not json"))
    stored_again = stored.latest(store, 0, "h", T0 + 100)
    assert [(v.pid, v.ts_s - T0, v.leak_state) for v in stored_again] == [
        (None, 20.0, "leak"), (3, 90.0, "leak"), (12, 30.0, "no_leak")]
    assert stored.latest(store, 0, "h", T0) == []  # nothing yet
    store.close()
