"""``vramscope demo``: agent + dashboard + simulated inference servers, in one command.

    vramscope demo [--scenario all] [--duration SECONDS] [--no-browser] [--db URL] [--port PORT]
                   [--speed X] [--history-min M] [--gpu]

See ``docs/demo.md`` and :mod:`vramscope.agent.sim.demo` for what runs and how simulated time works.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

from vramscope.agent.cli.common import shown_db, url_or_path
from vramscope.agent.errors import UsageError

if TYPE_CHECKING:
    from vramscope.agent.config import Config
    from vramscope.agent.embedded import EmbeddedAgent
    from vramscope.agent.sim.demo import Pacer
    from vramscope.agent.sim.server import SimServer

SCENARIO_CHOICES = ("all", "healthy", "leak", "fragmentation", "pool")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="see vramscope at work on simulated inference servers",
                       description="Start the agent (embedded), the dashboard and simulated "
                                   "inference servers: healthy, leaking and fragmenting.")
    p.add_argument("--scenario", choices=SCENARIO_CHOICES, default="all",
                   help="all = healthy + leak + fragmentation, each on its own simulated GPU")
    p.add_argument("--duration", type=float, metavar="SECONDS",
                   help="stop after this many seconds (default: run until Ctrl-C)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser")
    p.add_argument("--db", dest="db_url", metavar="URL", type=url_or_path,
                   help="database URL or SQLite file path, kept when the demo ends (default: "
                        "demo.db in the data directory, started afresh by each demo)")
    p.add_argument("--port", type=int, help="dashboard port (default: dashboard.port; 0: any)")
    p.add_argument("--host", default=None, help="dashboard address (default: dashboard.host)")
    p.add_argument("--speed", type=float, default=400.0,
                   help="simulated seconds per wall second until the simulation reaches now")
    p.add_argument("--history-min", type=float, metavar="MINUTES",
                   help="simulated minutes before now to start from (default: 75 %% of "
                        "--duration × --speed, or 90 minutes without --duration)")
    p.add_argument("--config", help="config file (default: the usual search)")
    p.add_argument("--gpu", action="store_true",
                   help="watch a small random-weight transformers model on CUDA instead")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    _check(args)
    from vramscope.agent.config import load_config

    config = load_config(args.config)
    if args.port is not None:
        config = config.replace(dashboard__port=max(args.port, 1))
    db_url = args.db_url or _fresh_demo_database()
    if args.gpu:
        from vramscope.agent.sim.gpu_demo import run_gpu_demo

        return run_gpu_demo(config, db_url, args)
    return _run_sim(config, db_url, args)


def _check(args: argparse.Namespace) -> None:
    if args.duration is not None and args.duration <= 0:
        raise UsageError(f"--duration must be > 0 seconds, got {args.duration}")
    if args.speed < 1:
        raise UsageError(f"--speed must be >= 1, got {args.speed}")
    if args.history_min is not None and args.history_min < 0:
        raise UsageError(f"--history-min must be >= 0, got {args.history_min}")
    if args.port is not None and not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")


DEMO_FILE = "demo.db"
_HELD: list[IO[bytes]] = []  # the locks of this process's demo database, held until it exits


def _fresh_demo_database() -> str:
    """The default demo database: ``demo.db`` in the data directory, beside (never in) the
    agent's default ``vramscope.db``, so simulated devices do not mix with real ones. Kept when
    the demo ends, to be looked at again; the next demo without ``--db`` starts it afresh.
    A demo that runs holds its file (a lock beside it): a second one takes the next free file
    (``demo-2.db``, ...) instead of deleting the database under the first."""
    from vramscope.agent.settings import data_dir

    folder = data_dir()
    folder.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        path = folder / (DEMO_FILE if n == 1 else f"demo-{n}.db")
        if _hold(path):
            break
    for leftover in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm", "-journal"))):
        leftover.unlink(missing_ok=True)
    return f"sqlite:///{path}"


def _hold(path: Path) -> bool:
    """Whether this process now holds ``path`` (``PATH.lock``, locked until it exits): False
    while another demo holds it."""
    import fcntl

    lock = open(path.with_name(path.name + ".lock"), "ab")  # noqa: SIM115 - held until exit
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        return False
    _HELD.append(lock)
    return True


def _history_s(args: argparse.Namespace) -> float:
    if args.history_min is not None:
        return float(args.history_min * 60.0)
    if args.duration is not None:
        return float(0.75 * args.duration * args.speed)
    return 90 * 60.0


def _run_sim(config: Config, db_url: str, args: argparse.Namespace) -> int:
    from vramscope.agent.clock import SYSTEM_CLOCK
    from vramscope.agent.embedded import EmbeddedAgent
    from vramscope.agent.sim import demo

    scenarios = demo.resolve_scenarios(args.scenario)
    pacer = demo.Pacer(SYSTEM_CLOCK, _history_s(args), args.speed)
    servers = demo.make_servers(scenarios, sink=None, start_ts_s=pacer.sim0_s)
    with demo.private_socket() as socket_path:
        # listen, on a socket of its own: `vramscope status --socket` asks it, and no server
        # of this host finds it where its hooks look for the real agent
        agent = EmbeddedAgent(config, db_url=db_url, source=demo.SimDeviceSource(servers),
                              listen=True, socket_path=socket_path)
        for server in servers:
            server.sink = agent.sink
        agent.start()
        _register_process(agent, servers)
        _simulate(config, db_url, args, agent, servers, scenarios, pacer)
    print("demo finished:")
    print("\n".join(demo.summary(agent.store, servers, pacer.clock.time_s())))
    print(f"database kept: {shown_db(db_url)}; look at it again with "
          f"'vramscope dashboard --db {shown_db(db_url)}' or 'vramscope analyze --db "
          f"{shown_db(db_url)}'")
    return 0


def _simulate(config: Config, db_url: str, args: argparse.Namespace, agent: EmbeddedAgent,
              servers: list[SimServer], scenarios: Sequence[str], pacer: Pacer) -> None:
    """The dashboard and the simulation until ``--duration`` or Ctrl-C; then the agent's
    final flush."""
    import threading

    from vramscope.agent.sim import demo

    with demo.dashboard_while_running(config, agent, args) as url:
        _announce(url, db_url, scenarios, pacer, args, agent.agent.socket_path)
        progress = demo.Progress(sys.stdout)
        demo.run_simulation(servers, pacer, agent, args.duration, progress, threading.Event())
        progress.show(demo.status_line(servers, pacer, agent), force=True)
        progress.done()


def _register_process(agent: EmbeddedAgent, servers: list[SimServer]) -> None:
    """Name this process in the store, as a server's hook handshake would."""
    import os
    import time

    pid, devices = os.getpid(), tuple(s.spec.device for s in servers)
    model = servers[0].spec.model.name
    agent.agent.writer.submit(lambda st: st.upsert_process(
        pid, time.time(), name="vramscope demo (simulated servers)", model=model,
        device_indexes=devices))


def _announce(url: str, db_url: str, scenarios: Sequence[str], pacer: Pacer,
              args: argparse.Namespace, socket_path: str) -> None:
    history_min = (pacer.wall0_s - pacer.sim0_s) / 60
    print(f"vramscope demo: dashboard at {url}")
    print(f"  simulated servers: {', '.join(scenarios)} (one simulated GPU each)")
    print(f"  simulating {history_min:.0f} min of serving at {args.speed:g}x, then live")
    fresh = "" if args.db_url else "; the next demo without --db starts it afresh"
    print(f"  database: {shown_db(db_url)} (kept when the demo ends{fresh}; --db PATH "
          f"to choose)")
    print(f"  agent socket: {socket_path} (this demo's own, removed when it ends; "
          f"'vramscope status --socket {socket_path}' asks it)")
    sys.stdout.flush()
    if not args.no_browser:
        try:
            import webbrowser

            webbrowser.open(url)
        except Exception as exc:  # noqa: BLE001 - a missing browser is not an error
            print(f"  (could not open a browser: {exc}; open the URL yourself)")



