"""``vramscope demo``: the embedded agent, the dashboard and simulated servers in one process.

The phase tracker of ``vramscope.hooks.phase`` is process-wide, so each simulated server tags its
records with its own scheduler's phase and its own device index and puts them into the embedded
agent's sink; from there on it is the product's real path. The simulation starts ``history_s``
in the past and runs ``speed`` times faster until it catches up with now (docs/demo.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

from vramscope.agent.clock import Clock
from vramscope.agent.sim.scenarios import scenario_spec
from vramscope.agent.sim.server import SimServer
from vramscope.agent.sources.nvml import DeviceInfo, ProcessRow
from vramscope.agent.timefmt import iso_utc

if TYPE_CHECKING:
    from vramscope.agent.config import Config
    from vramscope.agent.embedded import EmbeddedAgent
    from vramscope.agent.records import Sample
    from vramscope.agent.store import Store
    from vramscope.hooks.sink import RecordSink

log = logging.getLogger("vramscope.demo")

DEMO_SCENARIOS = ("healthy", "leak", "fragmentation")  # "all"
SLICE_S = 60.0  # simulated seconds per server between progress checks
# The demo feeds its agent faster than real time; unlike a server's hooks it may wait, so it
# waits while the agent's queue is fuller than this share instead of making it drop records
QUEUE_SHARE = 0.5


SOCKET_NAME = "agent.sock"


@contextmanager
def private_socket() -> Iterator[str]:
    """A socket path for the demo's agent in a folder of its own (``mkdtemp``: mode 0700, a
    fresh name), removed with the folder when the demo ends. Never the host's default socket:
    the servers' hooks on this machine connect there, and they would write their real records
    into the demo's database (and a real agent started later would find it taken)."""
    folder = tempfile.mkdtemp(prefix="vramscope-demo-")
    try:
        yield os.path.join(folder, SOCKET_NAME)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class SimDeviceSource:
    """The agent's device seam for simulated GPUs: names them; their samples come from the
    servers (in simulated time), so ``read`` has nothing to add."""

    def __init__(self, servers: list[SimServer]) -> None:
        self._info = [DeviceInfo(s.spec.device, f"SIM-{s.spec.scenario}",
                                 f"Simulated 24 GB GPU ({s.spec.scenario})",
                                 s.spec.device_total_bytes) for s in servers]

    def devices(self) -> list[DeviceInfo]:
        return list(self._info)

    def read(self) -> list[Sample]:
        return []

    def read_processes(self) -> list[ProcessRow]:
        return []

    def close(self) -> None:
        pass


def resolve_scenarios(name: str) -> tuple[str, ...]:
    return DEMO_SCENARIOS if name == "all" else (name,)


def make_servers(scenarios: tuple[str, ...], sink: RecordSink | None,
                 start_ts_s: float) -> list[SimServer]:
    pid = os.getpid()
    return [SimServer(scenario_spec(name, device=i if name != "pool" else 3, pid=pid), sink,
                      start_ts_s) for i, name in enumerate(scenarios)]


class Pacer:
    """Simulated time: ``speed``× the wall clock from ``start`` until it reaches now, then 1×."""

    def __init__(self, clock: Clock, history_s: float, speed: float) -> None:
        self.clock = clock
        self.speed = speed
        self.wall0_s = clock.time_s()
        self.sim0_s = self.wall0_s - history_s

    def target_s(self) -> float:
        now = self.clock.time_s()
        return min(now, self.sim0_s + (now - self.wall0_s) * self.speed)


def advance(servers: list[SimServer], target_s: float,
            between: Callable[[], None] | None = None) -> None:
    """Move every server towards ``target_s`` in slices, so they stay abreast; ``between``
    is called before each round of slices."""
    while True:
        behind = [s for s in servers if s.now_s < target_s]
        if not behind:
            return
        if between is not None:
            between()
        for s in behind:
            s.run_until(min(target_s, s.now_s + SLICE_S))


class Progress:
    """One status line: a rewritten line on a terminal, a new line every 5 s otherwise."""

    def __init__(self, out: TextIO, every_s: float | None = None) -> None:
        self.out = out
        self.tty = out.isatty()
        self.every_s = every_s or (0.5 if self.tty else 5.0)
        self._last = float("-inf")  # the first line always shows

    def show(self, line: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.every_s:
            return
        self._last = now
        if self.tty:
            self.out.write("\r\x1b[K" + line)
        else:
            self.out.write(line + "\n")
        self.out.flush()

    def done(self) -> None:
        if self.tty:
            self.out.write("\n")


def status_line(servers: list[SimServer], pacer: Pacer, agent: EmbeddedAgent) -> str:
    lag_s = pacer.clock.time_s() - min(s.now_s for s in servers)
    parts = [f"sim {_hms(min(s.now_s for s in servers) - pacer.sim0_s)}",
             "live" if lag_s < 2 else f"{lag_s / 60:.0f} min behind now"]
    for s in servers:
        parts.append(f"{s.spec.scenario}: {len(s.running)} running, "
                     f"{s.counts['served']} served, {s.counts['ooms']} OOM")
    written = agent.agent.writer.stats.written_total
    parts.append(f"{written} rows, {len(agent.store.alerts())} alerts")
    return " | ".join(parts)


def _behind(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _hms(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


@contextmanager
def dashboard_while_running(config: Config, agent: EmbeddedAgent,
                            args: argparse.Namespace) -> Iterator[str]:
    """The dashboard (its url) under waitress in a daemon thread while the demo runs, with
    ``vramscope dashboard``'s bind rule and server; Ctrl-C ends the demo, and however it ends
    the dashboard closes and the agent stops with its final flush."""
    from vramscope.dashboard.server import serve_in_thread

    web = None
    try:
        web, url = serve_in_thread(config, agent.store, args.host or config["dashboard.host"],
                                   0 if args.port == 0 else config["dashboard.port"],
                                   name="vramscope-demo-dashboard")
        yield url
    except KeyboardInterrupt:
        print("\ninterrupted; stopping")
    finally:
        if web is not None:
            web.close()
        agent.stop()


def run_simulation(servers: list[SimServer], pacer: Pacer, agent: EmbeddedAgent,
                   duration_s: float | None,
                   progress: Progress, stop: threading.Event) -> None:
    """Advance the servers until ``duration_s`` of wall time passes or ``stop`` is set."""
    t0 = time.monotonic()
    while not stop.is_set():
        if duration_s is not None and time.monotonic() - t0 >= duration_s:
            return
        target = pacer.target_s()
        chunk = min(target, min(s.now_s for s in servers) + SLICE_S * 4)
        advance(servers, chunk, lambda: _wait_for_the_writer(agent, stop))
        progress.show(status_line(servers, pacer, agent))
        if chunk >= pacer.clock.time_s() - 1.0:
            stop.wait(0.25)  # live: real time from here on


def _wait_for_the_writer(agent: EmbeddedAgent, stop: threading.Event) -> None:
    fuller_than = QUEUE_SHARE * agent.agent.config["agent.queue_max_records"]
    while agent.agent.writer.queue_depth > fuller_than and not stop.is_set():
        stop.wait(0.05)


BEHIND_S = 5.0  # simulated time further behind the wall clock than this is "behind"


def summary(store: Store, servers: list[SimServer], now_s: float | None = None) -> list[str]:
    """What ran; with ``now_s`` (the wall clock), also whether the simulation caught up with
    it: a dashboard opened on this database later shows the data as stale either way."""
    lines = []
    sim_now = min((s.now_s for s in servers), default=None)
    if now_s is not None and sim_now is not None and now_s - sim_now > BEHIND_S:
        lines.append(f"  simulation stopped {_behind(now_s - sim_now)} behind real time: its "
                     f"newest data is from {iso_utc(sim_now)} (--speed or --duration to "
                     f"catch up)")
    for s in servers:
        c = s.counts
        lines.append(f"  device {s.spec.device} ({s.spec.scenario}): {c['served']} requests "
                     f"served, {c['aborted']} aborted, {c['ooms']} OOM")
    alerts = store.alerts()
    for a in alerts:
        state = "active" if a.get("resolved_ts_s") is None else "resolved"
        lines.append(f"  alert {a.get('rule')} ({a.get('severity')}, {state}) on device "
                     f"{a.get('device')} at {iso_utc(a.get('fired_ts_s'))}")
    lines.append(f"  {len(store.postmortems())} OOM post-mortem(s), {len(alerts)} alert(s)")
    return lines

