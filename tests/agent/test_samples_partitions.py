"""PostgreSQL: samples partitioned by day (migration 0006, agent/store/partitions.py) — rows
land in their day's partition, replays insert nothing twice, retention drops whole days once
they are rolled up, rows without a partition wait in the default without blocking one, and the
upgrade from 0005 keeps every row. On a real server; SQLite keeps its one table."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from vramscope.agent.clock import FakeClock
from vramscope.agent.records import Phase, Sample
from vramscope.agent.retention import Retention
from vramscope.agent.store import Store, migrate, partitions

from tests.support.rollup_rows import read_rollups
from tests.support.sql_watch import insert_one_device

pytestmark = pytest.mark.postgres

DAY = 86_400.0
D0 = 1_699_920_000.0  # 2023-11-14 00:00 UTC, a day boundary (19675 * 86400)
NAMES = {n: f"samples_p202311{14 + n}" for n in range(7)}  # D0 + n days


def _s(t: float, used: int, device: int = 0) -> Sample:
    return Sample(t, device, Phase.UNKNOWN, "nvml", device_used_bytes=used,
                  device_total_bytes=100)


def _where(store: Store) -> dict[str, list[float]]:
    """Each partition's rows' times (offsets from D0), by partition name."""
    with store.engine.connect() as c:
        rows = c.execute(text("SELECT tableoid::regclass::text, ts_s FROM samples "
                              "ORDER BY ts_s")).all()
    out: dict[str, list[float]] = {}
    for name, ts in rows:
        out.setdefault(name, []).append(ts - D0)
    return out


def _partitions(store: Store) -> list[str]:
    with store.engine.connect() as c:
        return sorted(partitions.names(c))


@pytest.fixture
def store(postgres_url):
    s = Store.open(postgres_url, host_name="h")
    yield s
    s.close()


def test_the_schema_makes_only_the_default_partition(store):
    assert _partitions(store) == ["samples_default"]
    with store.engine.connect() as c:
        assert partitions.partitioned(c)


def test_writes_across_three_days_land_in_their_partitions(store):
    assert partitions.ensure_days(store, D0 + 5, D0 + 2 * DAY + 5) == [
        NAMES[0], NAMES[1], NAMES[2]]
    assert partitions.ensure_days(store, D0, D0 + 2 * DAY) == []  # they exist: nothing to do
    store.write([_s(D0 + 10, 1), _s(D0 + DAY - 0.5, 2), _s(D0 + DAY, 3),
                 _s(D0 + 2 * DAY + 7, 4, device=1)])
    assert _where(store) == {NAMES[0]: [10.0, DAY - 0.5], NAMES[1]: [DAY],
                             NAMES[2]: [2 * DAY + 7]}
    with store.engine.connect() as c:
        assert [(p.name, p.start_s - D0, p.end_s - D0) for p in partitions.ranges(c)] == [
            (NAMES[0], 0.0, DAY), (NAMES[1], DAY, 2 * DAY), (NAMES[2], 2 * DAY, 3 * DAY)]


def test_a_replayed_batch_inserts_nothing_twice(store):
    partitions.ensure_days(store, D0, D0 + DAY)
    batch = [_s(D0 + 100, 1), _s(D0 + DAY + 100, 2), _s(D0 + 5 * DAY, 3)]  # the last: default
    assert store.write(batch, origin="agent-a", first_seq=1) == 3
    assert store.write(batch, origin="agent-a", first_seq=1) == 0  # (origin, seq, ts_s) known
    assert store.write(batch[:1], origin="agent-b", first_seq=1) == 1  # another origin's row
    assert _where(store) == {NAMES[0]: [100.0, 100.0], NAMES[1]: [DAY + 100],
                             "samples_default": [5 * DAY]}


def test_retention_drops_the_days_before_its_cutoff_once_rolled_up(store):
    """Three days of samples; a clock 3 days on, a day of raw samples: the first two days'
    partitions go whole, once retention rolled them up; the third straddles the cutoff (noon)
    and stays whole, rows before the cutoff included, until all of it is older."""
    partitions.ensure_days(store, D0, D0 + 2 * DAY)
    day_rows = [_s(D0 + d * DAY + 3600 + t, 10 * d + t) for d in (0, 1) for t in (0, 30, 61)]
    kept = [_s(D0 + 2 * DAY + t, 100 + t) for t in (3600, 50_000, 50_001)]  # before, after noon
    store.write(day_rows + kept)
    clock = FakeClock(D0 + 3 * DAY + DAY / 2)
    # compaction off (after ten days): the partitions' own rows are what this test follows
    r = Retention(raw_s=DAY, rollup_s=30 * DAY, step_rows=1000, minutes_per_step=5,
                  clock=clock, compact_after_s=10 * DAY)
    steps = [r.step(store)]
    while steps[-1].backlog:
        steps.append(r.step(store))
    assert [s.deleted["partitions"] for s in steps if s.deleted["partitions"]] == [1, 1]
    assert sum(s.deleted["samples"] for s in steps) == 0  # no row was deleted as a row
    # the dropped days are gone by name; tomorrow's and the next day's are made ahead (today's
    # would have been, the day before, by a running agent)
    assert _partitions(store) == ["samples_default", NAMES[2], NAMES[4], NAMES[5]]
    assert _where(store) == {NAMES[2]: [2 * DAY + 3600, 2 * DAY + 50_000, 2 * DAY + 50_001]}
    # what the dropped days said, the tiers still say: retention rolled them up first
    with store.engine.connect() as c:
        minutes = c.execute(text("SELECT minute_s FROM seconds ORDER BY minute_s")).scalars()
        assert [m - D0 for m in minutes] == [3600.0, 3660.0, DAY + 3600, DAY + 3660,
                                             2 * DAY + 3600, 2 * DAY + 49_980]
    used = [row for row in read_rollups(store) if row["metric"] == "device_used_bytes"]
    assert [(row["bucket_s"] - D0, row["min_value"], row["max_value"], row["count"])
            for row in used[:4]] == [(3600.0, 0, 30, 2), (3660.0, 61, 61, 1),
                                     (DAY + 3600, 10, 40, 2), (DAY + 3660, 71, 71, 1)]
    assert r.step(store).deleted["partitions"] == 0  # nothing more until the day is older
    # a day on, with samples still coming, the third day is wholly older than the cutoff
    clock.advance(DAY)
    store.write([_s(D0 + 4 * DAY + 3600, 7)])
    assert r.step(store).deleted["partitions"] == 1
    assert _partitions(store) == ["samples_default", NAMES[4], NAMES[5], NAMES[6]]
    assert _where(store) == {NAMES[4]: [4 * DAY + 3600]}


def test_rows_in_the_default_move_into_the_partition_made_for_their_day(store):
    partitions.ensure_days(store, D0, D0)
    store.write([_s(D0 + 5, 1), _s(D0 + 3 * DAY + 5, 2), _s(D0 + 3 * DAY + 6, 3),
                 _s(D0 + 4 * DAY + 1, 4)], origin="a", first_seq=1)
    assert _where(store) == {NAMES[0]: [5.0], "samples_default": [
        3 * DAY + 5, 3 * DAY + 6, 4 * DAY + 1]}
    # retention at a clock on day 3 makes days 4 and 5 ahead: PostgreSQL would refuse day 4
    # while the default holds a row of it (a host whose clock runs ahead), so it is moved in
    # (raw rows kept 4 days: day 0's partition is not old enough to drop)
    r = Retention(raw_s=4 * DAY, rollup_s=30 * DAY, step_rows=1000,
                  clock=FakeClock(D0 + 3 * DAY + 9), compact_after_s=10 * DAY)
    assert r.step(store).deleted["partitions"] == 0
    assert _where(store) == {NAMES[0]: [5.0], "samples_default": [3 * DAY + 5, 3 * DAY + 6],
                             NAMES[4]: [4 * DAY + 1]}
    # today's rows wait in the default; a partition made for their day takes them too
    assert partitions.ensure_days(store, D0 + 3 * DAY, D0 + 3 * DAY) == [NAMES[3]]
    assert _where(store) == {NAMES[0]: [5.0], NAMES[3]: [3 * DAY + 5, 3 * DAY + 6],
                             NAMES[4]: [4 * DAY + 1]}
    # the moved rows keep their key: a replay finds them
    assert store.write([_s(D0 + 3 * DAY + 5, 2)], origin="a", first_seq=2) == 0
    assert [s.device_used_bytes for s in store.samples(0)] == [1, 2, 3, 4]


def test_the_upgrade_from_0005_keeps_every_row_in_its_day(postgres_url):
    engine = create_engine(postgres_url)
    try:
        migrate.upgrade(engine, "0005")
        with engine.begin() as c:
            insert_one_device(c)
            for i, (ts, seq) in enumerate([(D0 + 1, 1), (D0 + 2, None), (D0 + DAY + 3, 2),
                                           (D0 + 4 * DAY + 4, None)]):
                c.execute(text("INSERT INTO samples (device_id, ts_s, phase, allocated_bytes, "
                               "origin, seq) VALUES (1, :ts, 'idle', :a, :o, :seq)"),
                          {"ts": ts, "a": 1000 + i, "o": "a" if seq else None, "seq": seq})
        before = _rows(engine)
        migrate.upgrade(engine)
        assert _rows(engine) == before
        migrate.check(engine)  # the converted table is the schema's
        with engine.connect() as c:
            assert sorted(partitions.names(c)) == ["samples_default", NAMES[0], NAMES[1],
                                                   NAMES[4]]
            # ids widened with the rebuild: 2^31 of them last 310 days at 8 devices x 10 Hz
            assert c.execute(text(
                "SELECT data_type FROM information_schema.columns WHERE table_name = "
                "'samples' AND column_name = 'id'")).scalar() == "bigint"
            assert c.execute(text("SELECT data_type FROM pg_sequences WHERE sequencename = "
                                  "'samples_id_seq'")).scalar() == "bigint"
        with Store.open(postgres_url, host_name="h") as store:
            assert _where(store) == {NAMES[0]: [1.0, 2.0], NAMES[1]: [DAY + 3],
                                     NAMES[4]: [4 * DAY + 4]}
            # the id sequence goes on, and (origin, seq, ts_s) still refuses a replay
            assert store.write([_s(D0 + DAY + 3, 0)], origin="a", first_seq=2) == 0
            assert store.write([_s(D0 + 7, 5)]) == 1
        # id 5 went to the refused replay (ON CONFLICT draws the default before it checks)
        assert [r[0] for r in _rows(engine)] == [1, 2, 3, 4, 6]
        migrate.downgrade(engine, "0005")  # and back: one table, the same rows
        assert _rows(engine)[:4] == before
        with engine.connect() as c:
            assert partitions.names(c) == set()
    finally:
        engine.dispose()


def _rows(engine) -> list[tuple]:
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(text(
            "SELECT id, device_id, ts_s, phase, allocated_bytes, origin, seq FROM samples "
            "ORDER BY id"))]
