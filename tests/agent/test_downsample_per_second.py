"""Downsampling where retention deleted the raw samples: buckets too fine for the minute rollups
read the per-second tier (each second's low, high and last), one row per minute and source,
and give what the raw samples gave on a grid of whole seconds; beyond
``SECONDS_READ_MAX_S`` the minute rollups stand in."""

from __future__ import annotations

from typing import Any

import pytest
from vramscope.agent.store import Store, downsample
from vramscope.agent.store.downsample import read_from

from tests.support.aged_store import (
    HORIZON,
    OLD_S,
    W0,
    allocated,
    run_retention,
    used,
    write_spans,
)
from tests.support.sql_watch import statements_sent

COLS = ("allocated_bytes", "device_used_bytes")
ACROSS = (HORIZON - OLD_S / 2, HORIZON + OLD_S / 2)


def _timeline(store: Store, window: tuple[float, float], buckets: int,
              source: str | None = None) -> list[dict[str, Any]]:
    return store.timeline(0, *window, buckets, COLS, source=source)


def _values(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each bucket's time, minima and maxima. Its "last" differs, rightly: raw rows give the
    values at the bucket's newest timestamp (a torch sample: no NVML figure), the tier each
    counter's last value in the bucket."""
    return [{k: v for k, v in r.items() if not k.endswith("_last") and k != "last_ts_s"}
            for r in rows]


def _lasts(rows: list[dict[str, Any]], col: str) -> list[Any]:
    return [r[f"{col}_last"] for r in rows]


@pytest.fixture
def aged(any_url):
    """(store after retention, raw timelines before it: the old window and the one across the
    raw horizon, in 3 s buckets, and the old one's torch source alone)."""
    store = Store.open(any_url, host_name="h")
    write_spans(store)
    raw = {"old": _timeline(store, (W0, W0 + OLD_S), 300),
           "across": _timeline(store, ACROSS, 300),
           "torch": _timeline(store, (W0, W0 + OLD_S), 300, source="torch")}
    run_retention(store)
    yield store, raw
    store.close()


def test_a_fine_grid_over_deleted_raw_samples_reads_the_per_second_tier(aged):
    store, raw = aged
    with statements_sent(store.engine, lambda s: "FROM seconds" in s) as sent:
        rows = _timeline(store, (W0, W0 + OLD_S), 300)
    assert len(sent) == 1  # one statement: the window's 15 minutes x 2 sources of rows
    assert len(rows) == 300 and _values(rows) == _values(raw["old"])
    assert rows[0]["allocated_bytes_max"] == allocated(2, 9)  # seconds 0-2, ten samples each
    assert _lasts(rows, "allocated_bytes") == [allocated(3 * i + 2, 9) for i in range(300)]
    assert _lasts(rows, "device_used_bytes") == [used(3 * i + 2) for i in range(300)]
    assert rows[-1]["last_ts_s"] == W0 + OLD_S  # the last second's end
    torch = _timeline(store, (W0, W0 + OLD_S), 300, source="torch")
    assert _values(torch) == _values(raw["torch"])
    assert {r["device_used_bytes_max"] for r in torch} == {None}
    assert read_from(store, 0, W0, W0 + OLD_S, 3.0) == "per-second tier"


def test_a_window_across_the_raw_horizon_is_the_tier_then_the_raw_rows(aged):
    store, raw = aged
    rows = _timeline(store, ACROSS, 300)
    assert len(rows) == 300 and _values(rows) == _values(raw["across"])
    assert read_from(store, 0, *ACROSS, 3.0) == (
        "per-second tier, then raw samples grouped in SQL")
    assert read_from(store, 0, HORIZON, HORIZON + 60, 3.0) == "raw samples grouped in SQL"
    assert read_from(store, 0, W0, W0 + OLD_S, 60.0) == "per-minute rollups"
    assert read_from(store, 0, W0 - 3600, W0, 3.0) == "raw samples grouped in SQL"  # no data


def test_a_long_range_without_raw_rows_reads_the_minute_rollups(aged, monkeypatch):
    store, _ = aged
    monkeypatch.setattr(downsample, "SECONDS_READ_MAX_S", 600.0)
    with statements_sent(store.engine, lambda s: "FROM seconds" in s) as sent:
        rows = _timeline(store, (W0, W0 + OLD_S), 300)
    assert sent == []
    assert [r["ts_s"] for r in rows] == [W0 + 60 * m for m in range(15)]  # a minute's bucket
    assert [r["allocated_bytes_min"] for r in rows] == [allocated(60 * m, 0) for m in range(15)]
    assert [r["allocated_bytes_max"] for r in rows] == [allocated(60 * m + 59, 9)
                                                        for m in range(15)]
    assert read_from(store, 0, W0, W0 + OLD_S, 3.0) == "per-minute rollups"
