"""The store on SQLite and on a real PostgreSQL server: round trips, queries, downsampling."""

from __future__ import annotations

from pathlib import Path

import pytest
from vramscope.agent.errors import StoreError
from vramscope.agent.records import Event, Holder, Phase, PostMortem, Sample
from vramscope.agent.store import Store

T0 = 1_700_000_000.0


def _samples(n: int, device: int = 0) -> list[Sample]:
    return [Sample(T0 + i, device, Phase.DECODE if i % 2 else Phase.PREFILL, "torch", 99,
                   allocated_bytes=1000 + i, reserved_bytes=4000, num_alloc_retries=i // 5)
            for i in range(n)]


def test_samples_round_trip_value_for_value(any_url):
    with Store.open(any_url, host_name="h1") as store:
        written = _samples(20) + _samples(5, device=3)
        assert store.write(written, []) == 25
        got = store.samples()
        assert sorted(got) == sorted(written)
        assert store.samples(3) == _samples(5, device=3)
        assert [s.ts_s for s in store.samples(0, T0 + 2, T0 + 4)] == [T0 + 2, T0 + 3, T0 + 4]
        assert store.time_range(0) == (T0, T0 + 19)


def test_events_and_data_round_trip(any_url):
    with Store.open(any_url, host_name="h1") as store:
        ev = [Event(T0, "request_start", 0, 5, Phase.PREFILL, "req-1", {"prompt_tokens": 900}),
              Event(T0 + 1, "oom", 1, 5, None, None, {"message": "CUDA out of memory"})]
        store.write([], ev)
        assert store.events() == ev
        assert store.events(names=["oom"]) == ev[1:]


def test_hosts_never_mix(any_url):
    with Store.open(any_url, host_name="a") as store:
        store.write([Sample(T0, 0, allocated_bytes=1, host="a"),
                     Sample(T0, 0, allocated_bytes=2, host="b")])
        assert [s.allocated_bytes for s in store.samples(0)] == [1]
        assert [s.allocated_bytes for s in store.samples(0, host="b")] == [2]
        assert [(d["host"], d["device_index"]) for d in store.devices("*")] == [("a", 0), ("b", 0)]


def test_a_reader_finds_a_device_another_store_adds_after_it_asked(any_url):
    """The dashboard's store keeps the device ids it found, never a miss: a device the agent
    adds later is found on the next request, and a host's device is never another's."""
    with Store.open(any_url, host_name="a") as writer, Store.open(any_url, host_name="a") as reader:
        writer.write([Sample(T0, 0, allocated_bytes=1)])
        assert reader.known_device_id(2) is None
        assert reader.time_range(2) is None
        writer.write([Sample(T0 + 1, 2, allocated_bytes=5), Sample(T0 + 3, 2, allocated_bytes=7,
                                                                   host="b")])
        assert reader.known_device_id(2) == writer.device_id(2)
        assert reader.known_device_id(2, "b") == writer.device_id(2, "b") != writer.device_id(2)
        assert reader.time_range(2) == (T0 + 1, T0 + 1)
        assert reader.time_range(2, "b") == (T0 + 3, T0 + 3)


def test_idempotent_batches(any_url):
    with Store.open(any_url, host_name="h") as store:
        batch = _samples(10)
        ev = [Event(T0, "request_end", request_id="r")]
        assert store.write(batch, ev, origin="agent-1", first_seq=100) == 11
        assert store.write(batch, ev, origin="agent-1", first_seq=100) == 0  # replay
        assert store.write(batch[:2], [], origin="agent-2", first_seq=100) == 2
        assert store.count("samples") == 12 and store.count("events") == 1


def test_timeline_downsamples_keeping_min_max_last(any_url):
    with Store.open(any_url, host_name="h") as store:
        vals = [5, 1, 9, 3, 7, 2, 8, 4, 6, 0]
        store.write([Sample(T0 + i, 0, source="torch", allocated_bytes=v) for i, v in
                     enumerate(vals)])
        rows = store.timeline(0, T0, T0 + 10, 2, ["allocated_bytes"])
        assert [(r["ts_s"], r["allocated_bytes_min"], r["allocated_bytes_max"],
                 r["allocated_bytes_last"]) for r in rows] == [
            (T0, 1, 9, 7), (T0 + 5, 0, 8, 0)]
        with pytest.raises(ValueError, match="unknown sample column"):
            store.timeline(0, T0, T0 + 10, 2, ["allocated; DROP TABLE samples"])
        assert store.timeline(7, T0, T0 + 10, 2, ["allocated_bytes"]) == []


def test_postmortem_alerts_processes_stats(any_url):
    pm = PostMortem(T0, 0, 42, Phase.PREFILL, 2 << 30, 1 << 30, 80 << 30, 70 << 30, 79 << 30,
                    512 << 20, 0.75, ("r1", "r2"), (Holder(1 << 30, ("model.py:10:forward",),
                                                           Phase.PREFILL),),
                    ({"address": 0, "total_size": 20 << 20, "allocated_size": 1 << 20},),
                    "CUDA out of memory", "fragmentation", ("expandable_segments",))
    with Store.open(any_url, host_name="h") as store:
        first = store.write_postmortem(pm)
        [(pm_id, got)] = store.postmortems()
        assert pm_id == first and got == pm._replace(host="h")  # the host it was stored under
        assert store.postmortems(host="other") == []
        aid = store.open_alert("leak", "warning", T0, device=0, value=1.5,
                               labels={"k": "v"}, message="rising")
        assert [a["rule"] for a in store.alerts(active_only=True)] == ["leak"]
        store.resolve_alert(aid, T0 + 60)
        assert store.alerts(active_only=True) == []
        assert store.alerts()[0]["resolved_ts_s"] == T0 + 60
        assert store.alerts()[0]["labels"] == {"k": "v"}
        store.open_alert("oom_risk", "critical", T0 + 30, device=1)
        assert [a["rule"] for a in store.alerts(device=1)] == ["oom_risk"]
        assert [a["rule"] for a in store.alerts(start_s=T0 + 10, end_s=T0 + 40)] == ["oom_risk"]
        assert [a["rule"] for a in store.alerts(device=0, end_s=T0)] == ["leak"]
        store.upsert_process(42, T0, name="<img src=x>", device_indexes=[0, 1])
        store.upsert_process(42, T0 + 5, model="llama")
        [proc] = store.processes()
        assert (proc["name"], proc["model"], proc["devices"], proc["last_seen_s"]) == (
            "<img src=x>", "llama", "0,1", T0 + 5)
        store.write_agent_stats(T0, clients=2, rows_per_s=10.0, queue_depth=3,
                                dropped_total=4, rejected_total=5, db_size_bytes=None)
        assert store.latest_agent_stats()["rejected_total"] == 5


def test_sqlite_pragmas_are_on_our_engine(store):
    with store.engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert c.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
    import sqlite3

    other = sqlite3.connect(":memory:")  # a plain connection is untouched
    assert other.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL, sqlite's default


def test_synchronous_full_by_config(tmp_path):
    with Store.open(f"sqlite:///{tmp_path / 'f.db'}", synchronous="FULL") as store:
        with store.engine.connect() as c:
            assert c.exec_driver_sql("PRAGMA synchronous").scalar() == 2


def test_bad_urls_are_clear():
    with pytest.raises(StoreError, match="database URL 'nonsense://x': 'nonsense' is not a "
                                         "database vramscope stores to"):
        Store.open("nonsense://x")
    with pytest.raises(StoreError, match="cannot open database"):
        Store.open("sqlite:////proc/forbidden/x.db")


def test_write_failure_loses_nothing_already_stored(store):
    store.write(_samples(3))
    with pytest.raises(StoreError, match="cannot write"):
        store.write([Sample(T0, 0, allocated_bytes=2**70)])  # too large for a 64-bit column
    assert store.count("samples") == 3


M0 = 1_699_999_980.0  # a whole minute, so 120 s buckets hold whole rolled-up minutes


def test_a_retried_postmortem_write_stores_one_row(any_url):
    # the writer retries a batch whose commit reply was lost (PostgreSQL): same row, not two
    pm = PostMortem(T0, 0, 42, Phase.DECODE, 2 << 30, 1 << 30, 80 << 30, 70 << 30, 79 << 30,
                    512 << 20, 0.75, cause="fragmentation")
    with Store.open(any_url, host_name="h") as store:
        first = store.write_postmortem(pm)
        assert store.write_postmortem(pm) == first
        anonymous = pm._replace(pid=None, cause=None)  # NULLs count as equal in the check
        second = store.write_postmortem(anonymous)
        assert store.write_postmortem(anonymous) == second != first
        third = store.write_postmortem(pm._replace(ts_s=T0 + 1))  # another OOM: another row
        assert sorted(i for i, _ in store.postmortems()) == sorted({first, second, third})
        assert len({first, second, third}) == 3


def _wavy(n: int, step_s: float) -> list[Sample]:
    return [Sample(M0 + i * step_s, 0, source="torch", allocated_bytes=(i * 7919) % 1000,
                   reserved_bytes=5000 + i) for i in range(n)]


def _raw_only(store, start, end, buckets, cols):
    from vramscope.agent.store.downsample import _Grid, _raw, device_row_id

    grid = _Grid(start, (end - start) / buckets, buckets, tuple(cols))
    return grid.rows(_raw(store, device_row_id(store, 0, None), grid, start, end, None, True))


def _values(rows):  # a rolled-up minute's last value is stamped at the minute's end
    return [{k: v for k, v in r.items() if k != "last_ts_s"} for r in rows]


def test_long_ranges_read_rollups_and_match_raw(any_url):
    from vramscope.agent.store.maintenance import rollup_window
    from vramscope.agent.store.schema import samples as samples_table

    cols = ["allocated_bytes", "reserved_bytes"]
    with Store.open(any_url, host_name="h") as store:
        store.write(_wavy(1080, 10.0))  # 3 hours, one sample every 10 s
        end = M0 + 3 * 3600
        expected = _raw_only(store, M0, end, 90, cols)
        assert len(expected) == 90
        short = _raw_only(store, M0, M0 + 600, 100, cols)
        rollup_window(store, M0, M0 + 2 * 3600)  # the last hour stays raw-only
        assert _values(store.timeline(0, M0, end, 90, cols)) == _values(expected)
        rollup_window(store, M0, end)
        with store.engine.begin() as c:  # raw retention ran: only the tiers are left
            c.execute(samples_table.delete())
        assert _values(store.timeline(0, M0, end, 90, cols)) == _values(expected)
        # a short range never reads rollups: with raw samples gone it reads the per-second
        # tier, whose seconds end before the range's end (the raw grouping takes a sample at
        # the end itself: M0 + 600, alone in the last bucket)
        assert short[-1]["last_ts_s"] == M0 + 600
        assert _values(store.timeline(0, M0, M0 + 600, 100, cols)) == _values(short[:-1])


def test_boot_id_is_recorded(store):
    from vramscope.agent.daemon import read_boot_id

    boot_id = read_boot_id()
    assert boot_id is not None and len(boot_id) == 36  # a UUID, on Linux
    store.set_boot_id(boot_id)
    assert [(h["name"], h["boot_id"]) for h in store.hosts()] == [("testhost", boot_id)]


def test_a_last_row_deleted_between_the_two_queries_leaves_last_empty(store, monkeypatch):
    from vramscope.agent.store import downsample

    store.write([Sample(T0 + i, 0, source="torch", allocated_bytes=v)
                 for i, v in enumerate([5, 1, 9, 3, 7, 2, 8, 4, 6, 0])])
    real = downsample._last_values

    def retention_deleted_the_newest(c, did, stamps, columns, source):
        found = real(c, did, stamps, columns, source)
        del found[max(found)]  # the row at T0 + 9, deleted after the grouped query
        return found
    monkeypatch.setattr(downsample, "_last_values", retention_deleted_the_newest)
    rows = store.timeline(0, T0, T0 + 10, 2, ["allocated_bytes"])
    assert [(r["allocated_bytes_min"], r["allocated_bytes_max"], r["allocated_bytes_last"])
            for r in rows] == [(1, 9, 7), (0, 8, None)]


def _vm_steps_of_timeline(store, start, end) -> int:
    """SQLite VM instructions (in thousands) spent by one timeline query: a count that does not
    depend on the machine's speed, only on how many rows the query plans visit."""
    from sqlalchemy import event

    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0  # 0: go on

    def watch(conn, *_):
        conn.connection.dbapi_connection.set_progress_handler(count, 1000)

    event.listen(store.engine, "before_cursor_execute", watch)
    try:
        assert len(store.timeline(0, start, end, 10, ["allocated_bytes"])) == 10
    finally:
        event.remove(store.engine, "before_cursor_execute", watch)
    return steps[0]


@pytest.fixture(params=["stdlib sqlite3", "pysqlite3"])
def sqlite_build(request, monkeypatch) -> str:
    """The store on the Python's own SQLite, then on pysqlite3-binary's newer one: query plans
    differ between SQLite versions, and users run both."""
    if request.param == "pysqlite3":
        import functools

        import sqlalchemy
        import vramscope.agent.store.store as store_module
        dbapi = pytest.importorskip("pysqlite3.dbapi2")  # Linux x86-64 wheels only
        monkeypatch.setattr(store_module, "create_engine",
                            functools.partial(sqlalchemy.create_engine, module=dbapi))
        return dbapi.sqlite_version
    import sqlite3
    return sqlite3.sqlite_version


def test_timeline_cost_follows_the_range_not_the_device_history(tmp_path, sqlite_build):
    # A 100-sample window read from a device with 100 samples of history, then with 40,000:
    # the query must reach the window through the (device, ts) index, whatever plan the
    # SQLite at hand picks. (A join back on the grouped rows was planned by newer SQLite as a
    # scan of the device's whole history: 17 s for a 24-hour dashboard view.)
    window = [Sample(T0 + i, 0, source="torch", allocated_bytes=i) for i in range(100)]
    history = [Sample(T0 - 40_000 + i, 0, source="torch", allocated_bytes=i)
               for i in range(40_000)]
    with Store.open(f"sqlite:///{tmp_path / 'short.db'}", host_name="h") as store:
        assert store.engine.dialect.dbapi.sqlite_version == sqlite_build
        store.write(window)
        short = _vm_steps_of_timeline(store, T0, T0 + 100)
    with Store.open(f"sqlite:///{tmp_path / 'long.db'}", host_name="h") as store:
        store.write(history + window)
        long = _vm_steps_of_timeline(store, T0, T0 + 100)
    assert short > 0 and long <= 2 * short, (short, long)


def test_a_sqlite_path_is_the_file_the_driver_opens(tmp_path, monkeypatch):
    """pysqlite opens ``~/x.db`` as written (relative, no home expansion): the folder made for
    it, the existence check and the size all name that same file."""
    from vramscope.agent.store.exists import missing_sqlite_file, sqlite_file

    monkeypatch.chdir(tmp_path)
    url = "sqlite:///~/x.db"
    assert missing_sqlite_file(url) == Path("~/x.db")
    with Store.open(url, host_name="h") as store:
        files = (tmp_path / "~" / "x.db", tmp_path / "~" / "x.db-wal")
        assert store.size_bytes() == sum(f.stat().st_size for f in files) > 0
        assert store.check_integrity() is None
    assert (tmp_path / "~" / "x.db").is_file() and missing_sqlite_file(url) is None
    assert sqlite_file("sqlite://") is None and sqlite_file("postgresql://h/db") is None
