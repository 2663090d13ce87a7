"""The history generator: seeded, closed-form rows, and the rollups retention would have made."""

from __future__ import annotations

import pytest
from vramscope.agent.records import Phase
from vramscope.agent.store import Store, maintenance
from vramscope.agent.store.history_generator import GIB, MIB, T_END, History, generate


def test_rows_are_closed_form_and_the_rollups_equal_retentions(any_url):
    h = History(devices=2, hz=1.0, days=600 / 86_400)  # 10 minutes, 1,200 samples
    with Store.open(any_url, host_name="h") as store:
        generate(store, h)
        starts_and_ends = sum((n + 7 * d) % 37 in (0, 27) for d in range(2) for n in range(600))
        assert (store.count("samples"), store.count("events")) == (1200, starts_and_ends)
        first = store.samples(device=1, limit=2)
        assert [s.ts_s for s in first] == [T_END - 600, T_END - 599]
        # device 1, tick 0: cycle place 7 -> decode, 7 busy ticks of 64 MiB
        noise = (1 * 97 + 131) % 1000
        assert first[0].phase is Phase.DECODE and first[0].allocated_bytes == (
            16 * GIB + GIB // 4 + 7 * 64 * MIB + noise * 65536)
        assert store.time_range() == (T_END - 600, T_END - 1)
        generated = _rounded(maintenance.read_rollups(store))
        with store.engine.begin() as c:
            c.exec_driver_sql("DELETE FROM rollups")
        maintenance.rollup_window(store, T_END - 600, T_END)
        assert generated == _rounded(maintenance.read_rollups(store))
        assert len(generated) == 2 * 10 * 13  # devices x minutes x metrics with values


def _rounded(rows: list[dict]) -> list[dict]:
    """PostgreSQL's AVG is exact (numeric) and Python's sum / n is not: the last bit differs."""
    return [{**r, "mean_value": round(r["mean_value"], 6)} for r in rows]


def test_bad_shapes_are_refused_with_the_values():
    with pytest.raises(ValueError, match="devices=0, hz=1, days=1"):
        History(devices=0, hz=1, days=1)


def test_a_long_timeline_from_rollups_equals_the_one_from_raw_samples(any_url, tmp_path):
    """The rollup read path (grouped and pivoted in SQL) gives each bucket the min, max and
    last the raw samples give."""
    cols = ("allocated_bytes", "kv_blocks_used", "device_used_bytes")
    h = History(devices=1, hz=1.0, days=2 / 24, events=False)
    raw_url = f"sqlite:///{tmp_path / 'raw.db'}"
    views = []
    for url, rollups in ((any_url, True), (raw_url, False)):
        with Store.open(url, host_name="h") as store:
            generate(store, History(**{**h.__dict__, "rollups": rollups}))
            rows = store.timeline(0, h.start_s, h.end_s, 24, cols)  # 5-minute buckets
            views.append([{k: v for k, v in r.items() if k != "last_ts_s"} for r in rows])
    from_rollups, from_raw = views
    assert len(from_rollups) == 24 and from_rollups == from_raw
