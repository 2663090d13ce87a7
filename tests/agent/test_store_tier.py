"""Aligned downsampling (``downsample(..., aligned=True)``): windows drawn in buckets of five
minutes or more go on a ten-minute grid (two or more: a two-minute one). Ten-minute grids read
the ``rollups_10m`` groups retention keeps (0008) along their primary key; two-minute ones group
the rolled-up minutes along the ``ix_rollups_device_tier2m`` index (0007) instead of sorting
them; both with the same values as the raw samples grouped on that grid."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from vramscope.agent.records import Sample
from vramscope.agent.store import Store
from vramscope.agent.store.downsample import _Grid, _raw, device_row_id, downsample, tier_grid
from vramscope.agent.store.maintenance import rollup_window
from vramscope.agent.store.schema import samples as samples_table

from tests.support.sql_watch import statements_sent

M0 = 1_700_000_400.0  # a ten-minute boundary (2,833,334 x 600 s)
COLS = ("allocated_bytes", "reserved_bytes")


def _wavy(n: int, step_s: float) -> list[Sample]:
    return [Sample(M0 + i * step_s, 0, source="torch", allocated_bytes=(i * 7919) % 1000,
                   reserved_bytes=5000 + i) for i in range(n)]


def _raw_on(store: Store, grid: tuple[float, float, int], start: float,
            end: float) -> list[dict[str, Any]]:
    """The raw samples of [start, end] grouped on ``grid``: what the rollups must give."""
    g = _Grid(*grid, COLS)
    return g.rows(_raw(store, device_row_id(store, 0, None), g, start, end, None, True))


def _values(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # a rolled-up minute's last value is stamped at the minute's end
    return [{k: v for k, v in r.items() if k != "last_ts_s"} for r in rows]


def test_tier_grid_is_aligned_and_never_more_buckets_than_asked():
    week = 7 * 86_400.0
    assert tier_grid(M0 + 7, M0 + 7 + week, 2000) == (M0, 600.0, 1009)
    assert tier_grid(M0, M0 + week, 2000) == (M0, 600.0, 1008)
    assert tier_grid(M0 + 7, M0 + 21_500, 50) == (M0, 600.0, 36)
    assert tier_grid(M0 + 599, M0 + 599 + 6000, 10) == (M0, 1200.0, 6)  # 11 of 600 s > 10
    assert tier_grid(M0, M0 + 86_400, 2000) is None  # 43 s buckets: as asked
    assert tier_grid(M0, M0 + 86_400, 1) == (M0, 86_400.0, 1)
    # two to five minutes asked: two-minute groups (0007), at most MAX_GROUPS of them; a day
    # in 360 of four minutes; three days would be 2,160: ten-minute groups (0008), 433
    assert tier_grid(M0, M0 + 86_400, 500) == (M0, 240.0, 360)
    assert tier_grid(M0 + 7, M0 + 7 + 3 * 86_400, 2000) == (M0, 600.0, 433)
    assert tier_grid(M0, M0 + 2 * 86_400, 2000) is None  # 86 s buckets: as asked
    # five days would be 3,600 two-minute groups (over MAX_GROUPS): ten-minute ones, 720
    assert tier_grid(M0, M0 + 5 * 86_400, 2000) == (M0, 600.0, 720)


def test_aligned_window_from_rollups_matches_raw_samples(any_url):
    with Store.open(any_url, host_name="h") as store:
        store.write(_wavy(2160, 10.0))  # 6 hours, one sample every 10 s
        start, end = M0 + 7, M0 + 21_500  # partial minutes at both ends
        grid = tier_grid(start, end, 50)
        assert grid == (M0, 600.0, 36)
        expected = _raw_on(store, grid, start, end)
        assert len(expected) == 36 and expected[0]["ts_s"] == M0
        assert expected[0]["allocated_bytes_max"] == max(
            (i * 7919) % 1000 for i in range(1, 60))  # from M0 + 10, the first inside
        rollup_window(store, M0, M0 + 5 * 3600)  # the last hour stays raw-only
        got = downsample(store, 0, start, end, 50, COLS, None, None, aligned=True)
        assert _values(got) == _values(expected)
        rollup_window(store, M0, M0 + 6 * 3600)
        whole = _raw_on(store, tier_grid(M0, M0 + 6 * 3600, 50), M0, M0 + 6 * 3600)
        # three-minute buckets asked: four-minute ones, grouped by two-minute groups
        four = tier_grid(M0, M0 + 6 * 3600, 120)
        assert four == (M0, 240.0, 90)
        whole_four = _raw_on(store, four, M0, M0 + 6 * 3600)
        with store.engine.begin() as c:  # raw retention ran: only rollups are left
            c.execute(samples_table.delete())
        got = downsample(store, 0, M0, M0 + 6 * 3600, 50, COLS, None, None, aligned=True)
        assert len(got) == 36 and _values(got) == _values(whole)
        got = downsample(store, 0, M0, M0 + 6 * 3600, 120, COLS, None, None, aligned=True)
        assert len(got) == 90 and _values(got) == _values(whole_four)
        # not aligned (Store.timeline's callers): the grid as asked, 50 buckets of 432 s
        rows = store.timeline(0, M0, M0 + 6 * 3600, 50, COLS)
        assert [r["ts_s"] for r in rows[:3]] == [M0, M0 + 432, M0 + 864]


def _rollup_statements(store: Store, run: Any) -> list[tuple[str, Any]]:
    with statements_sent(store.engine, lambda statement: "FROM rollups" in statement
                         and "min(rollups.min_value)" in statement) as sent:
        run()
    return sent


@pytest.mark.parametrize("aligned, buckets, plan", [
    (True, 120, "USING COVERING INDEX ix_rollups_device_tier2m"),  # 3-minute buckets asked
    (False, 50, "USE TEMP B-TREE FOR GROUP BY")])
def test_an_aligned_week_groups_rollups_along_the_index_without_a_sort(tmp_path, aligned,
                                                                        buckets, plan):
    with Store.open(f"sqlite:///{tmp_path / 'tier.db'}", host_name="h") as store:
        store.write(_wavy(2160, 10.0))
        rollup_window(store, M0, M0 + 6 * 3600)
        with store.engine.begin() as c:
            c.execute(text("ANALYZE"))  # the plan with statistics, as a real store has them
        [(statement, parameters)] = _rollup_statements(store, lambda: downsample(
            store, 0, M0, M0 + 6 * 3600, buckets, COLS, None, None, aligned=aligned))
        with store.engine.connect() as c:
            steps = [r[-1] for r in c.exec_driver_sql("EXPLAIN QUERY PLAN " + statement,
                                                      parameters)]
        assert any(plan in s for s in steps), steps
        if aligned:
            assert not any("TEMP B-TREE" in s for s in steps), steps


def test_a_ten_minute_grid_reads_the_groups_along_their_key_and_only_its_ends_as_minutes(
        tmp_path):
    """Seven-minute buckets asked (a ten-minute grid): the whole groups from ``rollups_10m`` by
    primary key (no sort, no GROUP BY), the partial groups at the window's ends from the minute
    rollups, also by key; the values those of the raw samples."""
    with Store.open(f"sqlite:///{tmp_path / 'tier.db'}", host_name="h") as store:
        store.write(_wavy(2160, 10.0))
        start, end = M0 + 60, M0 + 21_480  # whole minutes, not whole groups
        grid = tier_grid(start, end, 50)
        assert grid == (M0, 600.0, 36)
        g = _Grid(*grid, COLS)
        expected = g.rows(_raw(store, device_row_id(store, 0, None), g, start, end, None, False))
        rollup_window(store, M0, M0 + 6 * 3600)
        with store.engine.begin() as c:
            c.execute(text("ANALYZE"))
            c.execute(samples_table.delete())  # only the tiers answer
        with statements_sent(store.engine, lambda q: "min_value" in q) as sent:
            got = downsample(store, 0, start, end, 50, COLS, None, None, aligned=True)
        assert len(got) == 36 and _values(got) == _values(expected)
        tables = [" ".join(q.split()).split(" FROM ")[1].split()[0] for q, _ in sent]
        # minutes [M0 + 60, M0 + 600), groups [M0 + 600, M0 + 21,000), minutes to the end
        assert tables == ["rollups", "rollups_10m", "rollups"]
        assert not any("GROUP BY" in q for q, _ in sent)
        with store.engine.connect() as c:
            steps = [r[-1] for r in c.exec_driver_sql("EXPLAIN QUERY PLAN " + sent[1][0],
                                                      sent[1][1])]
        assert any("SEARCH rollups_10m USING PRIMARY KEY" in s for s in steps), steps
        assert not any("TEMP B-TREE" in s for s in steps), steps


def test_a_bucket_width_that_is_not_positive_is_refused_with_the_value(tmp_path):
    with Store.open(f"sqlite:///{tmp_path / 'w.db'}", host_name="h") as store:
        store.write(_wavy(10, 10.0))
        for bad in (0.0, -600.0):
            with pytest.raises(ValueError, match=f"width_s must be > 0, got {bad}"):
                store.timeline(0, M0, M0 + 100, 1, COLS, width_s=bad)
        assert len(store.timeline(0, M0, M0 + 100, 1, COLS)) == 1  # the store still answers
