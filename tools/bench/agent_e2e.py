"""``vramscope bench agent``: replay -> socket -> agent process -> database, and the agent's cost.

1. Throughput: the same samples are sent through the socket of a real ``vramscope agent``
   process (``--no-nvml``) as fast as it takes them, and timed until the agent has committed
   them all; the baseline, interleaved round by round, writes the same samples straight
   through ``Store.write`` in this process (what the agent's writer does at best).
   Target: >= 50k samples/s end to end.
2. Cost at the default 10 Hz x 8 simulated devices (``--fake-devices 8``) on a store that
   starts a week old (the history generator's with the default tiers: raw samples for the last
   day, per-second and per-minute tiers for the week; ending now, so retention deletes and
   rolls up while it is measured over 130 s): CPU seconds per wall second (from ``/proc/PID/stat``),
   RSS (``VmRSS``) and the writer's queue at the end, against the same agent idle
   (``--no-nvml``) on the same old store, measured alternately in the same run; the window
   is the steady state: after the agent's first integrity check, whose CPU is counted at the
   rate the agent runs it (every 15 minutes, or as far apart as keeps it under
   ``database.integrity_check_max_cpu_percent`` of a core), after the live alert engine
   chose its windows (it holds the first records until then and replays them once) and once
   retention caught up with the copy.
   Targets: <= 2 % of one core, <= 100 MB RSS, a queue that stays bounded.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from vramscope.agent.errors import VramscopeError
from vramscope.agent.settings import INTEGRITY_MAX_CPU_PERCENT

from tools.bench import (
    BenchOptions,
    Figure,
    create_pg_database,
    drop_pg_database,
    interleaved,
    rounds_or,
)

if TYPE_CHECKING:
    from vramscope.agent.records import Sample

    from tools.agent_process import AgentProcess

BATCH = 500


def run(options: BenchOptions) -> list[Figure]:
    workdir = tempfile.mkdtemp(prefix="vs-bench-", dir="/tmp")  # short: AF_UNIX path limit
    try:
        return _throughput(options, workdir) + _cost(options, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# --- 1. throughput ---------------------------------------------------------------------------
def _throughput(options: BenchOptions, workdir: str) -> list[Figure]:
    from tools.agent_process import AgentProcess
    from tools.bench.ingest import make_samples

    n = 20_000 if options.quick else 200_000
    rounds = rounds_or(options, 3 if options.quick else 5)
    rows = make_samples(n)
    # each round's rows lie ahead of the last's (_via_agent): the agents' time window must
    # take them (a day ahead; retention deletes rows further ahead than that); its one client
    # sends faster than a client's write budget allows: the agent is measured, not the budget
    ahead = {"VRAMSCOPE_AGENT_MAX_RECORD_AHEAD_S": "86400",
             "VRAMSCOPE_AGENT_CLIENT_MAX_ROWS_PER_S": "10000000",
             "VRAMSCOPE_AGENT_CLIENT_MAX_BYTES_PER_S": str(10 * 2**30)}
    agent = AgentProcess(f"sqlite:///{workdir}/e2e.db", f"{workdir}/run/agent.sock",
                         log_path=f"{workdir}/agent.log", env=ahead).start()
    bare = AgentProcess(f"sqlite:///{workdir}/bare.db", f"{workdir}/bare/agent.sock",
                        log_path=f"{workdir}/bare.log", extra_args=("--no-alerts",),
                        env=ahead).start()
    cpu_per_round: list[float] = []
    bare_cpu: list[float] = []
    try:
        e2e_t, direct_t, bare_t = interleaved([_via_agent(agent, rows, cpu_per_round),
                                          _direct(rows, workdir),
                                          _via_agent(bare, rows, bare_cpu)], rounds)
    finally:
        agent.stop()
        bare.stop()
    e2e, direct = n / e2e_t.median_s, n / direct_t.median_s
    ratios = [d / e for e, d in zip(e2e_t.samples_s, direct_t.samples_s, strict=True)]
    per_core = [n / c for c in cpu_per_round]
    alert_us = statistics.median(cpu_per_round) / n * 1e6 - statistics.median(bare_cpu) / n * 1e6
    return [
        Figure("agent", "end-to-end samples/s (replay->socket->DB)", e2e, "samples/s",
               spread=_rate_spread(n, e2e_t.samples_s), target=">= 50000", met=e2e >= 50_000),
        Figure("agent", "end-to-end samples/s, live alert engine off", n / bare_t.median_s,
               "samples/s", spread=_rate_spread(n, bare_t.samples_s),
               baseline="the same agent with --no-alerts, same run"),
        Figure("agent", "direct Store.write samples/s", direct, "samples/s",
               spread=_rate_spread(n, direct_t.samples_s), baseline="(the baseline)"),
        Figure("agent", "end-to-end / direct rate", e2e / direct, "ratio",
               spread=f"per-round min {min(ratios):.3f} / max {max(ratios):.3f}",
               baseline="Store.write of the same samples in-process, same run"),
        Figure("agent", "agent samples per CPU-second (one core's capacity)",
               statistics.median(per_core), "samples/s",
               spread=f"min {min(per_core):.0f} / max {max(per_core):.0f}; agent CPU from "
                      f"/proc, so it holds on a loaded machine where wall time does not",
               target=">= 50000", met=statistics.median(per_core) >= 50_000),
        Figure("agent", "agent CPU per sample spent in the live alert engine",
               alert_us, "us", baseline="the same agent with --no-alerts, same run",
               spread=f"with alerts {statistics.median(cpu_per_round) / n * 1e6:.1f} us, "
                      f"without {statistics.median(bare_cpu) / n * 1e6:.1f} us a sample"),
    ]


def _via_agent(agent: AgentProcess, rows: list[Sample],
               cpu_per_round: list[float]) -> Callable[[], None]:
    from vramscope.agent.ingest.connection import AgentConnection

    state = {"round": 0}

    def send() -> None:
        # From now on, distinct per round: live data, which retention leaves alone until it
        # is minutes old (week-old timestamps would be rolled up and deleted mid-benchmark).
        span = rows[-1].ts_s - rows[0].ts_s + 60.0
        shift = time.time() - rows[0].ts_s + state["round"] * span
        state["round"] += 1
        batch = [r._replace(ts_s=r.ts_s + shift) for r in rows]
        before = agent.status()
        target = before["written_total"] + len(batch)
        cpu0 = process_cpu_s(agent.pid)
        # the agent takes what its alert engine can follow; a send waits for it (back-pressure)
        with AgentConnection(agent.socket_path, timeout_s=600.0) as conn:
            conn.hello("bench-replay", [0])
            for i in range(0, len(batch), BATCH):
                conn.send_records(batch[i:i + BATCH])
            while (now := conn.status())["written_total"] < target:
                if now["dropped_total"] > before["dropped_total"]:
                    raise VramscopeError(f"bench agent: the agent dropped "
                                         f"{now['dropped_total'] - before['dropped_total']} "
                                         f"records; the figure would be meaningless")
                time.sleep(0.01)
        cpu_per_round.append(process_cpu_s(agent.pid) - cpu0)
    return send


def _direct(rows: list[Sample], workdir: str) -> Callable[[], None]:
    from vramscope.agent.store import Store

    def write() -> None:
        path = os.path.join(workdir, f"direct-{os.urandom(4).hex()}.db")
        with Store.open(f"sqlite:///{path}") as store:
            store.device_id(0)
            for i in range(0, len(rows), 2000):
                store.write(rows[i:i + 2000], ())
    return write


# --- 2. CPU and RSS at 10 Hz x 8 devices, on a store that starts old ------------------------
def _cost(options: BenchOptions, workdir: str) -> list[Figure]:
    """Each agent starts on a copy of a generated history that ends now (a week of the same 8
    devices at 10 Hz as the default tiers keep it; quick: a day at one sample per 20 s), a
    SQLite file, or with ``--db`` a database on that PostgreSQL server: the default retention
    then deletes the raw rows that pass a day old every step and rolls up each minute into the
    per-second tier and the rollups, so the figure is what a week-old agent costs, not a
    fresh one."""
    window_s = 3.0 if options.quick else 130.0
    # the first integrity check runs at 60 s; the alert engine chooses its windows by 120 s of
    # samples (2 x alerts.leak_floor_window_s) and then replays what it held (a start-up cost,
    # once, that earlier runs counted in a window from 75 s)
    settle_s = 3.0 if options.quick else 150.0
    rounds = rounds_or(options, 2 if options.quick else 3)
    old = _old_store(workdir, options.quick, _postgres_server(options.db_url))
    loaded: list[float] = []
    idle: list[float] = []
    rss: list[float] = []
    queues: list[int] = []
    try:
        for r in range(rounds):
            for devices, out in ((8, loaded), (0, idle)):
                cpu, rss_bytes, queue = _measure(workdir, f"cost-{r}-{devices}", devices,
                                                 window_s, old, settle_s)
                out.append(cpu)
                if devices:
                    rss.append(rss_bytes)
                    queues.append(queue)
        check_s = _integrity_check_cpu_s(old)
    finally:
        _remove(old)  # on a PostgreSQL server: nothing of the benchmark's is left there
    from vramscope.agent.store.store import integrity_wait_s

    check_every_s = integrity_wait_s(INTEGRITY_INTERVAL_S, check_s, INTEGRITY_MAX_CPU_PERCENT)
    check_pct = 100 * check_s / check_every_s
    cpu_pct, idle_pct, rss_mb = (statistics.median(loaded) * 100, statistics.median(idle) * 100,
                                 statistics.median(rss) / 1e6)
    total_pct = cpu_pct + check_pct
    backend = "postgresql" if old.startswith("postgresql") else "sqlite"
    age = (f"store starting {'1 day' if options.quick else '7 days'} old ({backend}), "
           f"{window_s:g} s window from {settle_s:g} s after start (the first integrity "
           f"check runs at 60 s, the alert engine's windows are chosen by 120 s) or once "
           f"retention caught up with the copy, if later")
    return [
        Figure("agent", "agent CPU, 10 Hz x 8 devices, old store, integrity check included",
               total_pct, "% of a core",
               spread=f"{cpu_pct:.3g} % between checks ({_spread(loaded, 100, '%')}) + "
                      f"{check_pct:.3g} % for the integrity check ({check_s:.3g} CPU-s every "
                      f"{check_every_s:.0f} s); {age}",
               baseline=f"idle agent on the same old store {idle_pct:.2f} % between checks",
               target="<= 2", met=total_pct <= 2.0),
        Figure("agent", "agent CPU, idle (no sampling), old store", idle_pct, "% of a core",
               spread=_spread(idle, 100, "%"), baseline="(the baseline)"),
        Figure("agent", "agent RSS, 10 Hz x 8 devices, old store", rss_mb, "MB",
               spread=_spread(rss, 1e-6, "MB"), target="<= 100", met=rss_mb <= 100),
        Figure("agent", "writer queue at the window's end, old store", max(queues), "records",
               spread=f"per round {queues}", target="<= 1000", met=max(queues) <= 1000),
    ]


def _postgres_server(db_url: str | None) -> str | None:
    """``--db``: a PostgreSQL URL names the server the old store is built on (its database
    part is ignored); None (SQLite files) otherwise."""
    if db_url is None:
        return None
    if not db_url.startswith("postgresql"):
        raise VramscopeError(f"bench agent --db takes a PostgreSQL URL (the server to build the "
                             f"old store on), not {db_url.split(':', 1)[0]!r}; without --db "
                             f"it uses SQLite files")
    return db_url.rsplit("/", 1)[0]


def _old_store(workdir: str, quick: bool, server: str | None) -> str:
    """A generated history ending now, for the measurements to copy: a SQLite file, or on
    PostgreSQL a database each round clones (``CREATE DATABASE ... TEMPLATE``)."""
    from vramscope.agent.store import Store

    from tools.history_generator import History, generate

    url = (f"sqlite:///{os.path.join(workdir, 'old.db')}" if server is None
           else create_pg_database(server, "vs_bench_old"))
    end = (time.time() // 60) * 60
    history = (History(devices=8, hz=0.05, days=1, end_s=end) if quick
               else History(devices=8, hz=10.0, days=7, end_s=end))
    with Store.open(url) as store:  # the agent's host name: the machine's
        generate(store, history)
    return url


def _copy(old: str, workdir: str, name: str) -> str:
    if old.startswith("sqlite:///"):
        shutil.copyfile(old.removeprefix("sqlite:///"), f"{workdir}/{name}.db")
        return f"sqlite:///{workdir}/{name}.db"
    server, template = old.rsplit("/", 1)
    return create_pg_database(server, name.replace("-", "_"), template)


def _remove(url: str) -> None:
    if url.startswith("sqlite:///"):
        os.remove(url.removeprefix("sqlite:///"))
    else:
        drop_pg_database(url)


# The agent's default `database.integrity_check_interval_s`: its first check runs a minute after
# start, then every 15 minutes or further apart, so that it takes at most
# `database.integrity_check_max_cpu_percent` of a core (it reads the whole SQLite file, seconds
# per GB). A 130 s window holding one would charge a whole interval's check to two minutes: the
# window starts after it, and the check is counted at the rate the agent runs it
# (_integrity_check_cpu_s, integrity_wait_s).
INTEGRITY_INTERVAL_S = 900.0


def _integrity_check_cpu_s(old: str) -> float:
    """CPU seconds of one integrity check of the old store (``Store.check_integrity``: SQLite's
    ``PRAGMA quick_check``; nothing on PostgreSQL), in this process."""
    from vramscope.agent.store import Store

    with Store.open(old) as store:
        t0 = time.process_time()
        store.check_integrity()
        return time.process_time() - t0


# A copy of the old store is minutes stale by the time an agent opens it (the history ends when
# its generation began; each round starts later): its retention first deletes the backlog of raw
# rows that passed the cutoff meanwhile, up to tens of thousands, a step a second. That is
# catching up, not the steady state the figure is about, and it grew with every round (the
# spread of earlier runs): the window starts once the agent reports no backlog.
CATCH_UP_MAX_S = 600.0


def _measure(workdir: str, name: str, devices: int, window_s: float,
             old: str, settle_s: float) -> tuple[float, int, int]:
    """CPU seconds per second over ``window_s`` once the agent is steady: ``settle_s`` after
    start (start-up, the first integrity check) and its retention caught up with the copy's
    staleness (``retention_backlog`` false in its status); RSS and the writer's queue at the
    end."""
    from tools.agent_process import AgentProcess

    url = _copy(old, workdir, name)
    agent = AgentProcess(url, f"{workdir}/{name}/agent.sock", fake_devices=devices).start()
    try:
        started = time.monotonic()
        while agent.status().get("retention_backlog") is not False:
            if time.monotonic() - started > CATCH_UP_MAX_S:
                raise VramscopeError(f"bench agent: retention still catching up "
                                     f"{CATCH_UP_MAX_S:g} s after start")
            time.sleep(1.0)
        time.sleep(max(0.0, settle_s - (time.monotonic() - started)))
        cpu0, t0 = process_cpu_s(agent.pid), time.monotonic()
        time.sleep(window_s)
        cpu1, t1 = process_cpu_s(agent.pid), time.monotonic()
        queue = int(agent.status().get("queue_depth", 0))
        return (cpu1 - cpu0) / (t1 - t0), _rss_bytes(agent.pid), queue
    finally:
        agent.stop()
        _remove(url)


def process_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError as exc:
        raise VramscopeError(f"bench agent needs /proc (Linux): {exc}") from None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _rate_spread(n: int, times: list[float]) -> str:
    rates = [n / t for t in times]
    return f"median of {len(rates)}; min {min(rates):.0f} / max {max(rates):.0f}"


def _spread(values: list[float], scale: float, unit: str) -> str:
    return (f"min {min(values) * scale:.3g} {unit} / max {max(values) * scale:.3g} {unit} "
            f"over {len(values)} rounds")
