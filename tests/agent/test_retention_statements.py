"""A retention step sends the same few statements for 2 devices or 32: a fleet's leader
deletes over every host's devices (``bench fleet``: 64 nodes of 8), and each statement costs
the agent about half a millisecond of CPU, so statements per device made the leader cost eight
times what the other agents do. On SQLite (one agent rolls up every device of the file) and on
a real PostgreSQL (each agent its own host, every host's agent alive: the leader's step does
not grow with the fleet), counted at the engine (``before_cursor_execute``), on scripted stores
of 1 host x 2 devices, 4 hosts x 8 and 5 x 8.
"""

from __future__ import annotations

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.records import Event, Phase, Sample
from vramscope.agent.retention import Retention
from vramscope.agent.store import Store, maintenance

from tests.support.rollup_rows import read_rollups
from tests.support.sql_watch import statements_sent

T0 = 1_700_000_040.0  # a minute boundary
MINUTES = 4  # written: minutes 0..3, every device a sample every 10 s and a request a minute
NOW = T0 + MINUTES * 60 + 130  # minutes 0..3 are past the two minutes' grace, minute 4 is not

# statements of each step, by dialect: the same for 2 devices and for 32
# SQLite: the first step reads the watermark (1 statement) and the first sample after it (1),
# rolls minutes 0 and 1 up (11: the devices; the raw rows, read on the driver's own cursor,
# which the engine does not see; delete + insert of the rollups; the ten-minute groups: read,
# delete, insert; the seconds: delete, insert; the event counts: read, delete, insert), and
# deletes by age (20: the owners, then their rows before the cutoff, for 6 tables; the oldest
# minute of each of 4 tiers; rows from the future: 2 x 2), and seeks the oldest event before
# the raw cutoff (1: where the walk for event names no table lists starts; none is older, so
# it starts at the cutoff). PostgreSQL adds the store-wide lock's check (1) and, on the first
# step of a day, the partitions ahead of their writes (14), and, each agent rolling up its own
# host: its devices (1, and not every device's: -1), the hosts whose agents are gone (1) and
# where raw samples are rolled up to, the raw cutoff (1). The compact raw tier adds 3
# (agent/store/sample_blocks.py): whether blocks overlap the rolled-up minutes (1 a rollup,
# read with the raw rows; the events' blocks in the same statement), and for its samples and
# its events (agent/store/event_blocks.py) each, the intervals due for compaction (1: a seek
# per device) and the blocks past the raw cutoff (1). On PostgreSQL a rollup first takes its
# devices' locks (1: agent/store/maintenance.py ROLLUP_LOCK_CLASS)
FIRST_STEP = {"sqlite": 39, "postgresql": 57}
# the second: minutes 2 and 3 the same way, without the watermark's read
SECOND_STEP = {"sqlite": 37, "postgresql": 41}
# the watermark is at the newest minute due: no rollup query at all, the deletes by age only
NOTHING_DUE = {"sqlite": 24, "postgresql": 28}
# a minute later minute 4 is due but has no samples: the seek finds none, nothing rolled up;
# the raw cutoff moved a minute, so the walk for unlisted event names reads that minute (2: the
# owners, then their rows)
EMPTY_MINUTE = {"sqlite": 27, "postgresql": 31}


def _fleet(url: str, hosts: int, devices: int) -> list[Store]:
    stores = [Store.open(url, host_name=f"node-{h}") for h in range(hosts)]
    for store in stores:
        if store.dialect == "postgresql":  # every host's agent is alive
            store.write_agent_stats(NOW, clients=0, rows_per_s=0.0, queue_depth=0,
                                    dropped_total=0, rejected_total=0, db_size_bytes=None)
        store.write([Sample(T0 + 10 * i, d, Phase.UNKNOWN, "nvml", device_used_bytes=i,
                            device_total_bytes=100)
                     for i in range(MINUTES * 6) for d in range(devices)],
                    [Event(T0 + 60 * m + 5, "request_start", d) for m in range(MINUTES)
                     for d in range(devices)])
    return stores


def _counted(store: Store, step) -> tuple[int, object]:
    with statements_sent(store.engine, lambda statement: True) as sent:
        result = step()
    return len(sent), result


@pytest.mark.parametrize("hosts,devices", [(1, 2), (4, 8), (5, 8)])
def test_a_leader_step_sends_the_same_statements_for_2_devices_or_32(any_url, hosts, devices):
    """And a rollup 12 more per 32 devices beyond (the raw rows of 32 devices at a time), 11
    that the engine sees: the raw rows are read on the driver's own cursor."""
    stores = _fleet(any_url, hosts, devices)
    leader = stores[0]
    clock = FakeClock(NOW)
    dialect = leader.dialect
    fleet = dialect == "postgresql"
    others = stores[1:] if fleet else []  # SQLite: one agent, every device of the file

    def retention() -> Retention:
        return Retention(raw_s=86_400, rollup_s=90 * 86_400, step_rows=1000, clock=clock,
                         minutes_per_step=2)
    leads, follow = retention(), [retention() for _ in others]

    def step() -> object:
        result = leads.step(leader)
        for r, store in zip(follow, others, strict=True):  # each rolls its own host up
            r.step(store)
        return result
    n_devices = hosts * devices
    rolled = devices if fleet else n_devices  # the leader's own host, or every device
    more = 11 * ((rolled - 1) // maintenance.ROLLUP_DEVICES_PER_CHUNK)  # 40 devices: 11
    metrics = 2  # device_used_bytes and device_total_bytes
    try:
        sent, first = _counted(leader, step)
        assert (sent, first.rolled_up_minutes, first.rollup_rows) == \
            (FIRST_STEP[dialect] + more, 2, 2 * rolled * metrics)
        sent, second = _counted(leader, step)
        assert (sent, second.rolled_up_minutes, second.rollup_rows) == \
            (SECOND_STEP[dialect] + more, 2, 2 * rolled * metrics)
        sent, idle = _counted(leader, step)
        assert (sent, idle.rolled_up_minutes, idle.busy) == (NOTHING_DUE[dialect], 0, False)
        clock.advance(60.0)
        sent, empty = _counted(leader, step)
        assert (sent, empty.rolled_up_minutes, empty.busy) == (EMPTY_MINUTE[dialect], 0, False)
        # what the steps made: every device's four minutes, each of its 6 samples
        rollups = read_rollups(leader)
        assert len(rollups) == n_devices * MINUTES * metrics
        assert {(r["metric"], r["count"]) for r in rollups} == \
            {("device_used_bytes", 6), ("device_total_bytes", 6)}
        used = [r for r in rollups if r["metric"] == "device_used_bytes"
                and r["bucket_s"] == T0 + 60]
        assert [(r["min_value"], r["max_value"], r["mean_value"], r["last_value"])
                for r in used] == [(6, 11, 8.5, 11)] * n_devices
        assert leader.count("event_counts") == n_devices * MINUTES
    finally:
        leads.close()
        for store in stores:
            store.close()
