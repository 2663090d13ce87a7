"""``vramscope bench fleet --db POSTGRESQL_URL``: N nodes of real agents on one PostgreSQL.

Each simulated node is a real ``vramscope agent`` process (``--fake-devices``: the simulated
device source, sampled by the agent at ``sampling.device_interval_s = 1``; its own
``agent.host_name``), and its servers' hooks are simulated servers in one child process
(:mod:`tools.bench.fleet_servers`: per-process samples at 1 Hz and request events
through the node's socket). All write to one fresh database on the server ``--db`` names,
dropped afterwards. A round runs one node alone (the baseline), then the fleet, each in
real time: the agent samples its devices on the wall clock and its ingest refuses records
further than ``agent.max_record_ahead_s`` ahead, so record time cannot be replayed faster
than it passes; 30 minutes of record time take 30 minutes.

Figures of each run, the fleet's as ratios against the one node's of the same round where a
ratio fits:

- records lost: per node, the hook records sent (the client's count) less those stored for
  that host, and the rows the agent says it wrote less those stored; must be 0;
- every agent's CPU (``/proc/PID/stat``, over the run after a settling time) and RSS
  (``VmRSS`` at the end): the worst agent, with the median and spread over agents;
- the database: rows stored per second, and its growth (``pg_database_size``, after the
  schema) per device-day of record time;
- retention's lag: how far the per-second tier's newest minute of the worst device trails
  the minute retention should have rolled up by now (now less its grace), polled through the
  run; and that exactly one agent leads the store-wide work;
- the dashboard at the end of the run, the agents still writing: the fleet page and its API,
  the Overview and its API, one device's page and its figure, ``/metrics`` (medians of
  alternating calls through the Flask app).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vramscope.agent.errors import VramscopeError

from tools.bench import (
    CHECKOUT,
    BenchOptions,
    Figure,
    Timing,
    create_pg_database,
    drop_pg_database,
    interleaved,
    rounds_or,
)
from tools.bench.agent_e2e import process_cpu_s

if TYPE_CHECKING:
    from flask.testing import FlaskClient

    from tools.agent_process import AgentProcess

NODES, DEVICES, DURATION_S = 64, 8, 1800.0  # the fleet, 30 minutes of record time
QUICK_NODES, QUICK_DEVICES, QUICK_DURATION_S = 3, 2, 40.0
BASELINE_MAX_S = 300.0  # the one-node run: as long as the fleet's, up to this
SETTLE_S, QUICK_SETTLE_S = 150.0, 10.0  # CPU counted from here (start-up, alert windows)
POLL_S, QUICK_POLL_S = 30.0, 5.0  # retention lag and leadership, polled through the run
ROUTE_ROUNDS = 5
AGENT_CONFIG = """\
[sampling]
device_interval_s = 1.0

[agent]
host_name = "{host}"
"""
STOPPED = re.compile(r"agent stopped: (\d+) rows written, (\d+) dropped")
CPU_TARGET_PCT, RSS_TARGET_MB, LAG_TARGET_S = 2.0, 100.0, 120.0
FLEET_TARGET_MS, DEVICE_TARGET_MS = 1000.0, 300.0


@dataclass
class Size:
    nodes: int
    devices: int
    duration_s: float
    settle_s: float
    poll_s: float


@dataclass
class RunResult:
    """One run's measurements (a one-node baseline or the fleet)."""

    size: Size
    lost: dict[str, int] = field(default_factory=dict)  # host -> records lost
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # host -> sent/stored/...
    cpu: list[float] = field(default_factory=list)  # per agent, share of a core
    rss: list[int] = field(default_factory=list)  # per agent, bytes
    rows: int = 0
    growth_bytes: int = 0
    record_s: float = 0.0
    lags: list[float] = field(default_factory=list)  # retention lag, polls with a minute due
    leaders: list[int] = field(default_factory=list)  # agents leading, per poll
    leader: int | None = None  # which agent (by index) led at the last poll with one leader
    # page -> (timing, HTTP status); keyed by the page, not its URLs: the Overview a browser
    # loads differs between one node and a fleet, and the fleet's is compared with the node's
    routes: dict[str, tuple[Timing, int]] = field(default_factory=dict)
    route_urls: dict[str, list[str]] = field(default_factory=dict)  # page -> the URLs loaded


def sizes(options: BenchOptions) -> Size:
    extra, quick = options.extra, options.quick
    duration = float(extra.get("duration_s", QUICK_DURATION_S if quick else DURATION_S))
    size = Size(nodes=int(extra.get("nodes", QUICK_NODES if quick else NODES)),
                devices=int(extra.get("devices", QUICK_DEVICES if quick else DEVICES)),
                duration_s=duration,
                settle_s=min(QUICK_SETTLE_S if quick else SETTLE_S, duration / 2),
                poll_s=QUICK_POLL_S if quick else POLL_S)
    if size.nodes < 1 or size.devices < 1 or size.duration_s <= 0:
        raise VramscopeError(f"bench fleet needs at least 1 node of 1 device for a positive "
                             f"time, not {size.nodes} x {size.devices} for {size.duration_s} s")
    return size


def run(options: BenchOptions) -> list[Figure]:
    server = _postgres_server(options.db_url)
    size = sizes(options)
    base = Size(1, size.devices, min(size.duration_s, BASELINE_MAX_S), size.settle_s,
                size.poll_s)
    rounds = rounds_or(options, 1)
    one: list[RunResult] = []
    many: list[RunResult] = []
    for r in range(rounds):
        one.append(run_fleet(server, f"vs_bench_fleet_one_{r}", base))
        many.append(run_fleet(server, f"vs_bench_fleet_{r}", size))
    return figures(one, many)


def _postgres_server(db_url: str | None) -> str:
    """``--db``: the PostgreSQL server the fleet writes to (its database part is ignored)."""
    if db_url is None or not db_url.startswith("postgresql"):
        what = "no --db" if db_url is None else f"a {db_url.split(':', 1)[0]!r} URL"
        raise VramscopeError(f"bench fleet needs a PostgreSQL server, --db "
                             f"postgresql+psycopg://USER@HOST:PORT/DB (a fleet shares one); "
                             f"got {what}")
    return db_url.rsplit("/", 1)[0]


# --- one run ---------------------------------------------------------------------------------
def run_fleet(server: str, name: str, size: Size) -> RunResult:
    """``size.nodes`` agents and their servers for ``size.duration_s`` on a fresh database
    ``name`` of ``server`` (dropped after)."""
    from vramscope.agent.store import Store

    url = create_pg_database(server, name)
    workdir = tempfile.mkdtemp(prefix="vs-fleet-", dir="/tmp")  # short: AF_UNIX path limit
    agents: list[AgentProcess] = []
    feeder: subprocess.Popen[str] | None = None
    result = RunResult(size)
    try:
        with Store.open(url) as store:  # the documented fleet set-up: the schema first
            schema_bytes = store.size_bytes() or 0
        hosts = [f"node-{i:02d}" for i in range(size.nodes)]
        agents = [_start_agent(url, workdir, host, size.devices) for host in hosts]
        feeder = _start_servers([a.socket_path for a in agents], size.devices)
        started = time.monotonic()
        watch = _watch(url, agents, size, started, result)
        cpu0 = [process_cpu_s(a.pid) for a in agents]
        t0 = time.monotonic()
        _sleep_until(started + size.duration_s)
        elapsed = time.monotonic() - t0
        result.cpu = [(process_cpu_s(a.pid) - c) / elapsed
                      for a, c in zip(agents, cpu0, strict=True)]
        result.rss = [a.rss_bytes() for a in agents]
        watch.join()
        result.route_urls = pages(hosts, size.devices)
        result.routes = _time_routes(url, result.route_urls)
        sent = _stop_servers(feeder)
        feeder = None
        written = _stop_agents(agents, sent)
        agents = []
        result.record_s = time.monotonic() - started
        with Store.open(url, upgrade=False) as store:
            stored = _stored_by_host(store)
            result.growth_bytes = (store.size_bytes() or 0) - schema_bytes
        _account(result, hosts, sent, written, stored)
        return result
    finally:
        if feeder is not None:
            feeder.kill()
            feeder.wait()
        for agent in agents:
            agent.stop(signal.SIGKILL)
        shutil.rmtree(workdir, ignore_errors=True)
        drop_pg_database(url)


def _start_agent(url: str, workdir: str, host: str, devices: int) -> AgentProcess:
    from tools.agent_process import AgentProcess

    home = os.path.join(workdir, host)
    os.makedirs(home)
    config = os.path.join(home, "vramscope.toml")
    with open(config, "w", encoding="utf-8") as fh:
        fh.write(AGENT_CONFIG.format(host=host))
    return AgentProcess(url, os.path.join(home, "run", "agent.sock"), fake_devices=devices,
                        config_path=config, log_path=os.path.join(home, "agent.log"),
                        env={"VRAMSCOPE_AGENT_HOST_NAME": host}).start(timeout_s=120.0)


def _start_servers(sockets: list[str], devices: int) -> subprocess.Popen[str]:
    # run from the checkout's root, where ``tools`` is importable (it is never installed)
    return subprocess.Popen([sys.executable, "-m", "tools.bench.fleet_servers",
                             str(devices), "1", *sockets], cwd=CHECKOUT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _stop_servers(feeder: subprocess.Popen[str]) -> list[dict[str, int]]:
    """Close the servers' stdin: they drain their clients and print what each node sent."""
    import json

    out, _ = feeder.communicate(input="", timeout=120)
    if feeder.returncode != 0 or not out.strip():
        raise VramscopeError(f"bench fleet: the simulated servers exited "
                             f"{feeder.returncode} without their counts")
    counts: list[dict[str, int]] = json.loads(out.strip().splitlines()[-1])
    return counts


def _watch(url: str, agents: list[AgentProcess], size: Size, started: float,
           result: RunResult) -> threading.Thread:
    """Retention's lag and the number of leading agents, every poll through the run, from a
    thread (returned, to join at the end); returns once the settling time has passed (CPU is
    counted from then on)."""

    from vramscope.agent.store import Store

    store = Store.open(url, upgrade=False)

    def poll() -> None:
        lag = retention_lag_s(store)
        if lag is not None:
            result.lags.append(lag)
        leading = [i for i, a in enumerate(agents) if a.status().get("retention_leader")]
        result.leaders.append(len(leading))
        if len(leading) == 1:
            result.leader = leading[0]

    def loop() -> None:
        try:
            next_s = started + size.poll_s
            while next_s < started + size.duration_s:
                _sleep_until(next_s)
                poll()
                next_s += size.poll_s
        finally:
            store.close()
    thread = threading.Thread(target=loop, name="fleet-watch", daemon=True)
    thread.start()
    _sleep_until(started + size.settle_s)
    return thread


def retention_lag_s(store: Any) -> float | None:
    """How far behind now less the grace the worst device's newest rolled-up minute ends
    (0 when none is behind); None until the first minute is old enough to be rolled up."""
    from sqlalchemy import text
    from vramscope.agent.durations import MINUTE_S
    from vramscope.agent.retention import GRACE_S

    due_s = (time.time() - GRACE_S) // MINUTE_S * MINUTE_S
    with store.engine.connect() as c:
        first = c.execute(text("SELECT min(ts_s) FROM samples")).scalar()
        ends = c.execute(text("SELECT d.id, max(s.minute_s) FROM devices d LEFT JOIN seconds s "
                              "ON s.device_id = d.id GROUP BY d.id")).all()
    if first is None or first // MINUTE_S * MINUTE_S + MINUTE_S > due_s:
        return None
    worst = min((float(end) + MINUTE_S if end is not None else first // MINUTE_S * MINUTE_S)
                for _, end in ends)
    return max(0.0, due_s - worst)


def _stop_agents(agents: list[AgentProcess], sent: list[dict[str, int]]) -> list[tuple[int, int]]:
    """Wait until each agent received what its node's servers sent, then SIGTERM (the final
    flush); (rows written, dropped) from each one's last log line."""
    deadline = time.monotonic() + 120.0
    for agent, node in zip(agents, sent, strict=True):
        while agent.status()["records_received_total"] < node["sent"]:
            if time.monotonic() > deadline:
                raise VramscopeError(f"bench fleet: agent on {agent.socket_path} received "
                                     f"{agent.status()['records_received_total']} of "
                                     f"{node['sent']} records")
            time.sleep(0.1)
    out = []
    for agent in agents:
        agent.stop(signal.SIGTERM, timeout_s=60.0)
        log = Path(agent.log_path or "").read_text(encoding="utf-8", errors="replace")
        found = STOPPED.findall(log)
        if not found:
            raise VramscopeError(f"bench fleet: agent {agent.socket_path} did not report its "
                                 f"totals:\n{log[-2000:]}")
        out.append((int(found[-1][0]), int(found[-1][1])))
    return out


def _stored_by_host(store: Any) -> dict[str, dict[str, int]]:
    """Records stored per host: all samples and events, as rows or in the compact raw tier's
    blocks (each agent compacts its own closed intervals as it runs), and those the servers
    sent (per-process samples, request events: every record not from the agent's own device
    sampling)."""
    from sqlalchemy import text

    out: dict[str, dict[str, int]] = {}

    def add(host: str, key: str, n: int) -> None:
        got = out.setdefault(host, {"nvml": 0, "samples_from_servers": 0, "events": 0})
        got[key] += int(n or 0)

    with store.engine.connect() as c:
        for table, counted in (("samples", "count(*)"), ("sample_blocks", "sum(s.count)")):
            for host, nvml, hooked in c.execute(text(
                    f"SELECT h.name, {counted} FILTER (WHERE s.source = 'nvml'), "
                    f"{counted} FILTER (WHERE s.source IS DISTINCT FROM 'nvml') "
                    f"FROM {table} s JOIN devices d ON d.id = s.device_id "
                    "JOIN hosts h ON h.id = d.host_id GROUP BY h.name")):
                add(host, "nvml", nvml)
                add(host, "samples_from_servers", hooked)
        for table, counted in (("events", "count(*)"), ("event_blocks", "sum(e.count)")):
            for host, events in c.execute(text(
                    f"SELECT h.name, {counted} FROM {table} e JOIN devices d "
                    "ON d.id = e.device_id JOIN hosts h ON h.id = d.host_id GROUP BY h.name")):
                add(host, "events", events)
    return out


def _account(result: RunResult, hosts: list[str], sent: list[dict[str, int]],
             written: list[tuple[int, int]], stored: dict[str, dict[str, int]]) -> None:
    for host, node, (wrote, dropped) in zip(hosts, sent, written, strict=True):
        got = stored.get(host, {"nvml": 0, "samples_from_servers": 0, "events": 0})
        from_servers = got["samples_from_servers"] + got["events"]
        total = got["nvml"] + from_servers
        result.counts[host] = {"put": node["put"], "sent": node["sent"],
                               "client_dropped": node["dropped"], "agent_written": wrote,
                               "agent_dropped": dropped, "stored": total,
                               "stored_from_servers": from_servers}
        # lost: put by a server and not stored, or written by the agent and not stored
        result.lost[host] = (node["put"] - from_servers) + abs(wrote - total) + dropped
        result.rows += total


# --- the dashboard at the end of the run ------------------------------------------------------
def pages(hosts: list[str], devices: int) -> dict[str, list[str]]:
    """Each page as a browser loads it: its HTML, then the API call its script makes first
    (``dashboard/static/app.js``); the Overview of more than ``FLEET_OVERVIEW_DEVICES``
    devices is the fleet's, grouped by host."""
    from vramscope.dashboard.fleet import FLEET_OVERVIEW_DEVICES

    device = f"device={devices - 1}&host={hosts[len(hosts) // 2]}"
    overview = (["/", "/api/v1/fleet", "/api/v1/alerts?active=true&limit=200"]
                if len(hosts) * devices > FLEET_OVERVIEW_DEVICES
                else ["/", "/api/v1/overview?figures=true"])
    return {"fleet page": ["/fleet", "/api/v1/fleet"],
            "Overview": overview,
            "/api/v1/overview": ["/api/v1/overview"],
            "device page": [f"/timeline?{device}", f"/api/v1/figures/timeline?{device}"],
            "/metrics": ["/metrics"]}


def page_name(page: str, urls: list[str]) -> str:
    """``page`` with the paths it loads: ``device page (/timeline, /api/v1/figures/timeline)``,
    ``/metrics``."""
    paths = [u.split("?", 1)[0] for u in urls]
    return page if paths == [page] else f"{page} ({', '.join(paths)})"


def _time_routes(url: str, by_page: dict[str, list[str]]) -> dict[str, tuple[Timing, int]]:
    from vramscope.agent.store import Store
    from vramscope.dashboard.app import create_app

    with Store.open(url, upgrade=False) as store:
        client = create_app(None, store).test_client()
        calls = {label: _get(client, urls) for label, urls in by_page.items()}
        statuses = {label: call() for label, call in calls.items()}  # warm: imports, caches
        timings = interleaved(list(calls.values()), ROUTE_ROUNDS)
    return {label: (t, statuses[label]) for label, t in zip(calls, timings, strict=True)}


def _get(client: FlaskClient, urls: list[str]) -> Callable[[], int]:
    def call() -> int:
        for url in urls:
            response = client.get(url)
            if response.status_code != 200:
                raise VramscopeError(f"bench fleet: {url} answered HTTP "
                                     f"{response.status_code}")
        return 200
    return call


# --- figures ---------------------------------------------------------------------------------
def figures(one: list[RunResult], many: list[RunResult]) -> list[Figure]:
    size, base = many[0].size, one[0].size
    fleet = f"{size.nodes} nodes x {size.devices} devices, {size.duration_s:g} s"
    against = (f"1 node x {base.devices} devices for {base.duration_s:g} s, same round")
    lost = [sum(r.lost.values()) for r in many]
    per_node = [n for r in many for n in r.counts.values()]
    out = [Figure("fleet", f"records lost, {fleet}", sum(lost), "records",
                  spread=f"per round {lost}; sent by the servers "
                         f"{sum(n['sent'] for n in per_node)}, written by the agents "
                         f"{sum(n['agent_written'] for n in per_node)}, stored "
                         f"{sum(n['stored'] for n in per_node)} over {len(per_node)} nodes",
                  target="== 0", met=sum(lost) == 0)]
    cpu = [c * 100 for r in many for c in r.cpu]
    one_cpu = [c * 100 for r in one for c in r.cpu]
    ratio = statistics.median(cpu) / statistics.median(one_cpu)
    out.append(Figure("fleet", "worst agent CPU", max(cpu), "% of a core",
                      spread=f"median {statistics.median(cpu):.3g} % ({ratio:.3g}x one node "
                             f"alone, {statistics.median(one_cpu):.3g} %), min {min(cpu):.3g} % "
                             f"over {len(cpu)} agents, from {size.settle_s:g} s to the end"
                             f"{_leader_cpu(many)}",
                      baseline=against, target=f"<= {CPU_TARGET_PCT:g}",
                      met=max(cpu) <= CPU_TARGET_PCT))
    rss = [b / 1e6 for r in many for b in r.rss]
    one_rss = [b / 1e6 for r in one for b in r.rss]
    out.append(Figure("fleet", "worst agent RSS", max(rss), "MB",
                      spread=f"median {statistics.median(rss):.3g} MB, min {min(rss):.3g} MB "
                             f"over {len(rss)} agents at the end; one node alone "
                             f"{statistics.median(one_rss):.3g} MB",
                      baseline=against, target=f"<= {RSS_TARGET_MB:g}",
                      met=max(rss) <= RSS_TARGET_MB))
    out += _database(one, many, against)
    out += _retention(many)
    out += _routes(one, many, against)
    return out


def _leader_cpu(many: list[RunResult]) -> str:
    """The leading agent's CPU (it does the store-wide work for every device of the fleet)
    against the worst of the others, when each round knew its one leader."""
    if any(r.leader is None for r in many) or many[0].size.nodes < 2:
        return ""
    led = [r.cpu[r.leader] * 100 for r in many if r.leader is not None]
    others = [c * 100 for r in many for i, c in enumerate(r.cpu) if i != r.leader]
    return (f"; the leader (store-wide work) {max(led):.3g} %, the others' worst "
            f"{max(others):.3g} %")


def _database(one: list[RunResult], many: list[RunResult], against: str) -> list[Figure]:
    def rate(r: RunResult) -> float:
        return r.rows / r.record_s

    def per_device_day(r: RunResult) -> float:
        return r.growth_bytes / (r.size.nodes * r.size.devices * r.record_s / 86_400) / 2**20

    rates = [rate(r) for r in many]
    sizes_ = [per_device_day(r) for r in many]
    one_rates = [rate(r) / r.size.nodes for r in one]
    per_device = statistics.median(rates) / (many[0].size.nodes)
    return [
        Figure("fleet", "rows stored per second, whole fleet", statistics.median(rates),
               "rows/s", spread=f"per round {[round(x) for x in rates]}; "
                                f"{sum(r.rows for r in many)} rows"),
        Figure("fleet", "rows stored per second per node, fleet / one node",
               per_device / statistics.median(one_rates), "x",
               spread=f"fleet {per_device:.4g} rows/s a node, one node "
                      f"{statistics.median(one_rates):.4g}; 1.0: no node is slowed down",
               baseline=against),
        Figure("fleet", "database growth MiB per device-day of record time",
               statistics.median(sizes_), "MiB",
               spread=f"per round {[round(x, 1) for x in sizes_]}; pg_database_size after the "
                      f"run less after the schema; one node alone "
                      f"{statistics.median(per_device_day(r) for r in one):.4g} MiB",
               baseline=against),
    ]


def _retention(many: list[RunResult]) -> list[Figure]:
    lags = [x for r in many for x in r.lags]
    leaders = [n for r in many for n in r.leaders]
    out = [Figure("fleet", "agents leading the store-wide work, per poll", max(leaders), "agents",
                  spread=f"min {min(leaders)} / max {max(leaders)} over {len(leaders)} polls",
                  target="== 1", met=min(leaders) == max(leaders) == 1)] if leaders else []
    if not lags:  # a run shorter than a minute and the grace: no rollup was due yet
        return out
    return out + [
        Figure("fleet", "retention lag (rollups behind now less their grace), worst poll",
               max(lags), "s",
               spread=f"median {statistics.median(lags):.3g} s over {len(lags)} polls of the "
                      f"worst device; the grace is a minute's wait before its rollup",
               target=f"<= {LAG_TARGET_S:g}", met=max(lags) <= LAG_TARGET_S)]


def _routes(one: list[RunResult], many: list[RunResult], against: str) -> list[Figure]:
    out = []
    for page in many[0].routes:
        samples = [s for r in many for s in r.routes[page][0].samples_s]
        base = [s for r in one for s in r.routes[page][0].samples_s]
        name, one_name = (page_name(page, r[0].route_urls[page]) for r in (many, one))
        timing = Timing(samples)
        ms = timing.median_s * 1000
        target = DEVICE_TARGET_MS if page.startswith("device") else FLEET_TARGET_MS
        out.append(Figure("fleet", f"{name}, end of the run", ms, "ms",
                          spread=f"{timing.spread(1000, 'ms')}; "
                                 f"{ms / (statistics.median(base) * 1000):.3g}x one node's "
                                 f"{statistics.median(base) * 1000:.3g} ms"
                                 + (f" ({one_name})" if one_name != name else ""),
                          baseline=against, target=f"<= {target:g}", met=ms <= target))
    return out


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.monotonic()))
