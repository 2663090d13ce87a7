"""The app factory (as in flaskr's ``create_app``): config and store in, a Flask app out.

Nothing is built at import time. Extensions hang off ``app.extensions["vramscope"]`` (a
:class:`~vramscope.dashboard.state.DashboardState`), so two apps in one process (tests, the
embedded demo) never share a store, a clock or a metrics registry.
"""

from __future__ import annotations

from pathlib import Path

from flask import Flask, current_app, send_file
from flask.typing import ResponseReturnValue
from vramscope.agent.clock import SYSTEM_CLOCK, Clock
from vramscope.agent.config import Config, parse_config
from vramscope.agent.store import Store
from vramscope.dashboard.state import DashboardState, state

PACKAGE_DIR = Path(__file__).parent


def plotly_js_path() -> Path:
    """Plotly's bundle from the installed ``plotly`` package: served locally, never a CDN."""
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def create_app(config: Config | None = None, store: Store | None = None, *,
               clock: Clock | None = None) -> Flask:
    config = config if config is not None else parse_config({}, None, {})
    # (its [server] section is not read: the config check shown is the one the agent's engine
    # made and stored, agent/store/verdicts.py device_answer)
    owns = store is None
    if store is None:
        store = Store.open(config["database.url"], synchronous=config["database.synchronous"],
                           host_name=config["agent.host_name"] or None)
    app = Flask(__name__, template_folder=str(PACKAGE_DIR / "templates"),
                static_folder=str(PACKAGE_DIR / "static"))
    app.config["JSON_SORT_KEYS"] = False
    app.json.sort_keys = False  # type: ignore[attr-defined]  # Flask's DefaultJSONProvider
    app.extensions["vramscope"] = DashboardState(store, config, clock or SYSTEM_CLOCK, owns)
    _init_extensions(app, config)
    return app


def _init_extensions(app: Flask, config: Config) -> None:
    from vramscope.dashboard import api, errors, metrics, pages, security

    security.init_app(app, config["dashboard.token"], plotly_js_path())
    errors.init_app(app)
    metrics.init_app(app)
    app.register_blueprint(pages.bp)
    app.register_blueprint(api.bp, url_prefix="/api/v1")
    app.add_url_rule("/healthz", "healthz", _healthz)
    app.add_url_rule("/vendor/plotly.min.js", "plotly_js", _plotly_js)


def _healthz() -> ResponseReturnValue:
    st = state()
    try:
        st.store.ping()  # one cheap query proves the database and its schema answer
    except Exception as exc:  # any driver error: unhealthy, not a crash
        current_app.logger.warning("health check: database does not answer: %s", exc)
        return {"status": "error", "problem": "database does not answer"}, 503
    # quick_check, at most every 10 minutes and within its CPU budget (a probe polls this)
    damage = st.store.integrity(
        max_cpu_percent=st.config["database.integrity_check_max_cpu_percent"])
    if damage is not None:
        current_app.logger.error("health check: database integrity check failed: %s", damage)
        return {"status": "error", "problem": f"database integrity check failed: {damage}"}, 503
    return {"status": "ok", "now_s": st.clock.time_s()}


def _plotly_js() -> ResponseReturnValue:
    return send_file(plotly_js_path(), mimetype="text/javascript", max_age=86400)
