"""The fleet leader's retention step at 512 devices, before and after per-host rollups.

A PostgreSQL store (tests/support/pgserver.py) holding 64 hosts x 8 devices, 20 minutes of raw
samples at 1 Hz each (tools/history_generator.py), every host's agent alive (a heartbeat at
the end). Then, in one run, alternating, ``--rounds`` times each, the agent CPU
(``time.process_time``) of:

- ``before leader`` and ``before other``: main's step (the ``--base`` retention module: every
  host's devices rolled up by the lock holder, the others only their late minutes);
- ``after leader`` and ``after other``: this tree's step, holding the lock and not;

each a steady-state step with one minute due (the watermark put back a minute before each),
compaction apart (``compaction set``: one device's full ten-minute interval moved into blocks,
the median of several; a fleet of N devices needs N / 20 of them per 30 s step, all on the
leader before, its own host's 8 / 20 on each agent after), and the parts of a step
(``rollup``, ``deletes``, the leader's new look-ups). Prints JSON.

    python -m tools.bench.leader_step --base /tmp/base_retention.py --rounds 5
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from vramscope.agent.clock import FakeClock
from vramscope.agent.retention import Retention
from vramscope.agent.store import Store, sample_blocks
from vramscope.agent.store import maintenance as sql

from tools.history_generator import T_END, History, generate

HOSTS, DEVICES, MINUTES = 64, 8, 20
NOW = T_END + 1.0
W = (NOW - 120.0) // 60 * 60 - 60  # one minute due at NOW


def _build(url: str) -> None:
    for i in range(HOSTS):
        with Store.open(url, host_name=f"node-{i:02d}") as s:
            generate(s, History(devices=DEVICES, hz=1.0, days=MINUTES / 1440, events=True,
                                rollups=False, verdicts=False))
            s.write_agent_stats(T_END, clients=DEVICES, rows_per_s=0.0, queue_depth=0,
                                dropped_total=0, rejected_total=0, db_size_bytes=None)


def _load_base(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("base_retention", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["base_retention"] = mod
    spec.loader.exec_module(mod)
    return mod


def _cpu(fn: Callable[[], Any]) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def _retention(cls: Any) -> Any:
    # compaction measured apart (it moves rows: a step's would differ round to round)
    return cls(raw_s=86_400, rollup_s=90 * 86_400, step_rows=5000, clock=FakeClock(NOW),
               compact_after_s=1e9)


def _rewind(r: Any) -> None:
    if hasattr(r, "_own"):
        r._own.watermark, r._own.watermark_known = W, True
    else:
        r._watermark, r._watermark_known = W, True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--base", required=True, help="main's agent/retention.py, saved to a file")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--db", help="a PostgreSQL URL already built (default: a new server)")
    args = p.parse_args(argv)
    base = _load_base(args.base)
    server = None
    url = args.db
    if url is None:
        # the tests' throwaway server (imported by name: a test helper, not checked as tools)
        server = importlib.import_module("tests.support.pgserver").PostgresServer()
        server.start()
        url = server.create_database("leader")
        t0 = time.monotonic()
        with Store.open(url, host_name="node-00"):
            pass
        _build(url)
        print(f"built in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    try:
        out = _measure(url, base, args.rounds)
    finally:
        if server is not None:
            server.destroy()
    print(json.dumps(out, indent=1))
    return 0


def _measure(url: str, base: Any, rounds: int) -> dict[str, Any]:
    leader = Store.open(url, host_name="node-00")
    other = Store.open(url, host_name="node-01")
    times: dict[str, list[float]] = {}

    def note(name: str, s: float) -> None:
        times.setdefault(name, []).append(s)

    old = _retention(base.Retention)
    new = _retention(Retention)
    new_other = _retention(Retention)
    for r in (old, new):  # warm: the watermark, partitions and event look-ups an agent keeps
        r.step(leader)
        r.close()
    all_ids = [i for ids in sql.hosts_devices(leader).values() for i in ids]
    own = sql.host_device_ids_of(leader, "node-00")
    for _ in range(rounds):
        for name, r in (("before leader", old), ("after leader", new)):
            assert r.lock.acquire(leader)
            r.leading = True
            _rewind(r)
            note(name, _cpu(partial(r.step, leader)))
            assert r.leading
            r.close()
        assert new.lock.acquire(leader)  # another agent leads
        _rewind(new_other)
        note("after other", _cpu(lambda: new_other.step(other)))
        assert new_other.leading is False
        old_other = _retention(base.Retention)
        note("before other", _cpu(partial(old_other.step, other)))
        assert old_other.leading is False
        new.close()
        note("rollup 1 min, 512 devices", _cpu(lambda: sql.rollup_window(leader, W, W + 60,
                                                                        ids=all_ids)))
        note("rollup 1 min, 8 devices", _cpu(lambda: sql.rollup_window(leader, W, W + 60,
                                                                      ids=own)))
        note("gone hosts look-up", _cpu(lambda: sql.hosts_devices(
            leader, stale_before_s=NOW - 120, but="node-00")))
        note("first unrolled look-up", _cpu(lambda: sql.first_unrolled_ts(
            leader, NOW - 90 * 86_400)))
    # compaction: one device's full interval each (the one holding [T_END - 780, T_END - 180))
    start = sample_blocks.block_start(T_END - 600)
    for did in all_ids[8:8 + 3 * rounds]:
        note("compaction set", _cpu(partial(sample_blocks.compact_interval,
                                            leader, did, start, W)))
    leader.close()
    other.close()
    med = {k: round(statistics.median(v) * 1e3, 2) for k, v in times.items()}
    per_step_set = med["compaction set"]
    return {
        "store": f"{HOSTS} hosts x {DEVICES} devices, {MINUTES} min of 1 Hz raw samples",
        "rounds": rounds,
        "median_ms": med,
        "all_ms": {k: [round(x * 1e3, 2) for x in v] for k, v in times.items()},
        # a 30 s step with compaction keeping up (a device's interval every 10 minutes)
        "step_with_compaction_ms": {
            "before leader": round(med["before leader"] + HOSTS * DEVICES / 20 * per_step_set,
                                   2),
            "after leader": round(med["after leader"] + DEVICES / 20 * per_step_set, 2),
            "after other": round(med["after other"] + DEVICES / 20 * per_step_set, 2),
        },
    }


if __name__ == "__main__":
    sys.exit(main())
