"""A fleet's newest values (agent/store/fleet.py ``newest_values``, ``reader.fleet_samples``):
of each device's window only the rows that hold each (source, pid)'s newest values are read,
the same rows on SQLite and a real PostgreSQL, and a device's values now are what all of the
window's rows make of them."""

from __future__ import annotations

from vramscope.agent.records import Phase, Sample
from vramscope.agent.store import Store, fleet, reader
from vramscope.dashboard.latest import LATEST_WINDOW_S, latest_from

T0 = 1_700_000_000.0
GIB = 1 << 30


def _window() -> list[Sample]:
    """One device's 10 s: a torch process whose newest rows lack active_bytes and a phase, its
    NVML rows (no pid), a second source of the same pid, and two rows of one instant."""
    out = []
    for i in range(10):
        ts = T0 + i
        out.append(Sample(ts, 0, Phase.DECODE if i < 6 else Phase.UNKNOWN, "torch", 7,
                          allocated_bytes=GIB + i, reserved_bytes=2 * GIB,
                          active_bytes=GIB + i if i < 4 else None))
        out.append(Sample(ts, 0, Phase.UNKNOWN, "nvml", None, device_used_bytes=30 * GIB + i,
                          device_total_bytes=80 * GIB))
    out.append(Sample(T0 + 5, 0, Phase.IDLE, "kv", 7, kv_blocks_used=40))
    out.append(Sample(T0 + 9, 0, Phase.UNKNOWN, "nvml", None, device_used_bytes=31 * GIB))
    return out


def test_newest_values_keeps_each_cells_newest_row_and_newest_of_each_value():
    rows = sorted(_window(), key=lambda s: s.ts_s)  # stable: the two rows of T0 + 9 in order
    kept = fleet.newest_values(rows, lambda s: (s.source, s.pid))
    assert [(s.ts_s - T0, s.source) for s in kept] == [
        (3.0, "torch"),  # its newest active_bytes
        (5.0, "torch"),  # its newest known phase
        (5.0, "kv"),  # the kv source's only row
        (9.0, "torch"),  # its newest row
        (9.0, "nvml"),  # the first NVML row of T0 + 9: its newest device_total_bytes
        (9.0, "nvml"),  # the newest NVML row (by id: written last)
    ]
    assert kept[-1].device_used_bytes == 31 * GIB and kept[-2].device_total_bytes == 80 * GIB


def test_fleet_samples_read_the_newest_values_rows_and_the_same_values_now(any_url):
    store = Store.open(any_url, host_name="h")
    try:
        store.write(_window())
        store.write([Sample(T0 + i, 1, Phase.IDLE, "torch", 8, allocated_bytes=i)
                     for i in range(40)])
        full = {d: store.samples(d, hi - LATEST_WINDOW_S, hi, host="h")
                for d in (0, 1) for hi in [store.time_range(d)[1]]}  # type: ignore[index]
        nows = reader.fleet_samples(store, None, LATEST_WINDOW_S)
        assert [(n.device["device_index"], n.span) for n in nows] == [
            (0, (T0, T0 + 9)), (1, (T0, T0 + 39))]
        for n in nows:
            mine = full[n.device["device_index"]]
            assert n.recent == fleet.newest_values(mine, lambda s: (s.source, s.pid))
            assert latest_from(n.span, n.recent, None) == latest_from(n.span, mine, None)
        assert [s.allocated_bytes for s in nows[1].recent] == [39]
        assert len(nows[0].recent) == 6
    finally:
        store.close()
