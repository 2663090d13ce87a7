"""Serving the dashboard: waitress over the app, the bind rule first.

``vramscope dashboard``, ``vramscope demo`` and the GPU demo all serve through
:func:`make_server`, so none can skip the rule that a non-loopback address needs
``dashboard.token`` (:func:`vramscope.dashboard.security.check_bind`), and an address in use
names the flag to change, as nvitop-exporter does.
"""

from __future__ import annotations

import errno
import threading
from typing import Any

from flask import Flask
from vramscope.agent.config import Config
from vramscope.agent.errors import UsageError
from vramscope.agent.store import Store
from vramscope.dashboard.app import create_app
from vramscope.dashboard.security import check_bind


def make_server(config: Config, host: str, port: int, threads: int = 8,
                store: Store | None = None) -> tuple[Any, Flask]:
    """A waitress server and its app (over ``store``, or one it opens from the config).

    Refuses a non-loopback ``host`` without a token before opening anything; an address that
    cannot be bound raises :class:`UsageError` naming ``--host`` or ``--port``.
    """
    from waitress.server import create_server  # only where a dashboard is served

    check_bind(host, config["dashboard.token"])
    app = create_app(config, store)
    try:
        return create_server(app, host=host, port=port, threads=threads), app
    except OSError as exc:
        if store is None:  # ours to close; a caller's store stays open
            app.extensions["vramscope"].store.close()
        raise UsageError(_bind_problem(exc, host, port)) from None


def _bind_problem(exc: OSError, host: str, port: int) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (f"address {host}:{port} is in use; choose another port with --port (or "
                f"dashboard.port in the config)")
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot bind {host}: no such address on this machine; change --host"
    return f"cannot listen on {host}:{port}: {exc.strerror}; change --host or --port"


def serve_in_thread(config: Config, store: Store, host: str, port: int, *, threads: int = 4,
                    name: str = "vramscope-dashboard") -> tuple[Any, str]:
    """:func:`make_server` over ``store``, run in a named daemon thread; ``(server, url)``."""
    server, _app = make_server(config, host, port, threads=threads, store=store)
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    url_host = f"[{host}]" if ":" in host else host
    return server, f"http://{url_host}:{server.effective_port}/"
