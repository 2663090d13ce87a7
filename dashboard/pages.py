"""The HTML pages. Each renders a small Jinja shell (autoescaped); ``static/app.js`` fills it
from ``/api/v1`` with ``textContent`` only, and refreshes it by polling.

Pages take the same ``device``, ``host``, ``start`` and ``end`` parameters as the API, checked
the same way, so a bad link gets a 400 page that names the parameter.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, redirect, render_template, url_for
from flask.typing import ResponseReturnValue
from vramscope.dashboard import params, queries, views
from vramscope.dashboard.state import state
from werkzeug.exceptions import NotFound

bp = Blueprint("pages", __name__)

NAV: tuple[tuple[str, str], ...] = (
    ("pages.overview", "Overview"), ("pages.timeline", "Device timeline"),
    ("pages.leaks", "Leaks"), ("pages.risk", "OOM risk"), ("pages.alerts", "Alerts"),
    ("pages.postmortems", "Post-mortems"), ("pages.capacity", "Capacity"),
)


def _render(template: str, page: str, **context: Any) -> str:
    st = state()
    devices = st.store.devices(host="*")
    return render_template(template, page=page, nav=NAV, devices=devices,
                           refresh_s=st.config["dashboard.refresh_s"],
                           host_name=st.store.host_name, **context)


def _device_context() -> dict[str, Any]:
    """The device, host and window a page was asked for (validated, then passed to the JS)."""
    return {"device": params.integer("device", 0, low=0, high=4095),
            "host": params.text("host", "") or "",
            "start": params.number("start", low=0, high=1e11),
            "end": params.number("end", low=0, high=1e11),
            "span": params.number("span", low=1, high=params.MAX_SPAN_S)}


@bp.get("/")
def overview() -> ResponseReturnValue:
    return _render("overview.html", "overview")


@bp.get("/timeline")
def timeline() -> ResponseReturnValue:
    ctx = _device_context()
    if ctx["start"] is not None and ctx["end"] is not None and ctx["end"] <= ctx["start"]:
        params.time_window(3600.0, None)  # raises the 400 naming "end"
    return _render("timeline.html", "timeline", **ctx)


@bp.get("/leaks")
def leaks() -> ResponseReturnValue:
    return _render("leaks.html", "leaks", **_device_context())


@bp.get("/risk")
def risk() -> ResponseReturnValue:
    ctx = _device_context()
    st = state()
    check = views.config_check_view(st.store, st.config, ctx["device"],
                                    queries.host_or_none(st.store, ctx["host"]))
    return _render("risk.html", "risk", config_check=check, **ctx)


@bp.get("/alerts")
def alerts() -> ResponseReturnValue:
    return _render("alerts.html", "alerts")


@bp.get("/postmortems")
def postmortems() -> ResponseReturnValue:
    return _render("postmortems.html", "postmortems")


@bp.get("/postmortems/<int:pm_id>")
def postmortem(pm_id: int) -> ResponseReturnValue:
    if not any(i == pm_id for i, _ in state().store.postmortems(host="*")):
        raise NotFound(f"no post-mortem with id {pm_id}")
    return _render("postmortem.html", "postmortem", pm_id=pm_id)


@bp.get("/capacity")
def capacity() -> ResponseReturnValue:
    return _render("capacity.html", "capacity")


@bp.get("/openapi.json")
def openapi_redirect() -> ResponseReturnValue:
    """Where tools look first; the document lives beside the API it describes."""
    return redirect(url_for("api.openapi_document"), code=308)
