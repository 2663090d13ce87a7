"""A store whose raw samples retention has deleted: scripted samples written through the Store,
then ``Retention`` run on a fake clock three days later until it has nothing left to do, so
that an old window lives on only in the per-second tier and the minute rollups.

The script makes each second's minimum its first sample and its maximum its last (allocated
climbs 1 MiB a sample within the second), each second wholly one phase (7 idle, then 3 decode
of every 10, 2 GiB above the floor), and the idle floor 1 MiB higher each minute; so the tier's
"minimum at the second's start" is exactly what the raw samples held.
"""

from __future__ import annotations

from vramscope.agent.clock import FakeClock
from vramscope.agent.records import Phase, Sample
from vramscope.agent.retention import Retention
from vramscope.agent.store import Store

DAY_S = 86_400.0
W0 = 1_700_000_040.0  # the old window's start, a minute boundary
OLD_S = 900  # the old window: 15 minutes at 10 Hz
NOW = W0 + 3 * DAY_S  # retention runs here; raw samples are kept a day
HORIZON = NOW - DAY_S  # a second span straddles it (2 Hz, 15 minutes centred on it)
GIB, MIB = 2**30, 2**20
BASE = 10 * GIB  # the idle floor of the first minute
GROW = MIB  # the floor's rise a minute
BUSY = 2 * GIB  # a decode second above the floor
TOTAL = 80 * GIB
USED = 40 * GIB  # NVML's used, + BUSY * 2 in decode seconds, + the second's number


def busy(k: int) -> bool:
    return k % 10 >= 7


def floor_at(k: int) -> int:
    """The idle floor in second ``k`` of a span."""
    return BASE + (k // 60) * GROW


def allocated(k: int, j: int) -> int:
    """Allocated in sample ``j`` of second ``k``: the floor, the decode step, j MiB."""
    return floor_at(k) + (BUSY if busy(k) else 0) + j * MIB


def used(k: int) -> int:
    return USED + (2 * BUSY if busy(k) else 0) + k


def span(t0: float, seconds: int, hz: int) -> list[Sample]:
    """``seconds`` seconds from ``t0``: ``hz`` torch samples a second and one NVML sample."""
    out = []
    for k in range(seconds):
        phase = Phase.DECODE if busy(k) else Phase.IDLE
        for j in range(hz):
            a = allocated(k, j)
            out.append(Sample(t0 + k + j / hz, 0, phase, "torch", allocated_bytes=a,
                              reserved_bytes=a + GIB))
        out.append(Sample(t0 + k + 0.5, 0, phase, "nvml", device_used_bytes=used(k),
                          device_total_bytes=TOTAL))
    return out


def write_spans(store: Store) -> None:
    store.write(span(W0, OLD_S, 10))
    store.write(span(HORIZON - OLD_S / 2, OLD_S, 2))


def run_retention(store: Store) -> int:
    """Retention's default tiers at ``NOW``, stepped until idle; the steps it took."""
    retention = Retention(raw_s=DAY_S, second_s=14 * DAY_S, rollup_s=90 * DAY_S,
                          step_rows=50_000, clock=FakeClock(NOW), minutes_per_step=60)
    for steps in range(1, 100):
        if not retention.step(store).busy:
            return steps
    raise AssertionError("retention still busy after 100 steps")
