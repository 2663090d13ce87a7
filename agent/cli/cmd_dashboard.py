"""``vramscope dashboard [--db URL] [--host 127.0.0.1] [--port 8321] [--config PATH]``.

Serves the Flask dashboard with waitress (:mod:`vramscope.dashboard.server`). Loopback by
default; any other address needs ``dashboard.token`` (checked before the database is looked at).
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

from vramscope.agent.cli.common import require_existing_database, url_or_path
from vramscope.agent.errors import UsageError

if TYPE_CHECKING:
    from vramscope.agent.config import Config

log = logging.getLogger("vramscope.dashboard")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("dashboard", help="serve the web dashboard (Flask + Plotly, /api/v1, "
                                         "/metrics)")
    p.add_argument("--db", metavar="URL", dest="db_url", type=url_or_path,
                   help="database URL or SQLite file path (default: database.url from the "
                        "config)")
    p.add_argument("--host", help="address to bind (default: dashboard.host, 127.0.0.1); "
                                  "anything but loopback requires dashboard.token")
    p.add_argument("--port", type=int, help="port (default: dashboard.port, 8321; 0: any free "
                                            "port, printed at start)")
    p.add_argument("--config", metavar="PATH", help="config file")
    p.add_argument("--threads", type=int, default=8, help="waitress worker threads (default 8)")
    p.set_defaults(func=run)


def dashboard_config(args: argparse.Namespace) -> Config:
    from vramscope.agent.config import load_config

    if args.port is not None and not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    config = load_config(args.config)
    # dashboard.port is 1..65535; --port 0 (any free port, as for `demo`) is applied at bind
    port = None if args.port is None else max(args.port, 1)
    return config.replace(database__url=args.db_url, dashboard__host=args.host,
                          dashboard__port=port)


def run(args: argparse.Namespace) -> int:
    from vramscope.dashboard.security import check_bind
    from vramscope.dashboard.server import make_server

    config = dashboard_config(args)
    host = config["dashboard.host"]
    port = 0 if args.port == 0 else config["dashboard.port"]
    check_bind(host, config["dashboard.token"])  # before opening anything
    require_existing_database(config["database.url"], "dashboard")
    server, app = make_server(config, host, port, args.threads)
    store = app.extensions["vramscope"].store
    print(f"vramscope dashboard on http://{_url_host(host)}:{server.effective_port}/ "
          f"(database {store.safe_url})", flush=True)
    try:
        server.run()
    finally:
        store.close()
    return 0


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
